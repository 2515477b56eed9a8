"""Recorded attention calls to spec layers: ``F.scaled_dot_product_attention`` and ``torch.einsum``.

Both need more than the table in ``torch_names.py``: attention refuses what has no gradient as a function of
its inputs (dropout inside it in training mode, a boolean mask, grouped-query heads) at the user's line,
and einsum takes its operands as ``*operands`` (or one list), with ``...`` written out as letters at the
ranks the code ran with.
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING

import torch

from . import random_masks
from .dispatch import handles, op_hook

if TYPE_CHECKING:
    from .dispatch import Builder
    from .recorder import Call


@op_hook("scaled_dot_product_attention")
def attention(builder: Builder, op: str, bound: dict, call: "Call") -> None:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None)``."""
    mask = bound.get("attn_mask")
    dropout_p = bound.get("dropout_p", 0.0)
    if dropout_p and not (isinstance(dropout_p, float) and 0 < dropout_p < 1):
        return builder.fail(
            call,
            f"drops attention weights with dropout_p={dropout_p!r}, not a probability in (0, 1)",
            "pass dropout_p as a float below 1 (0.0 in eval mode)",
            op,
        )
    if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
        return builder.fail(
            call,
            "takes a boolean attn_mask, which a spec cannot hold (its tensors are float)",
            "make the mask additive: register a float buffer holding 0 where attention is allowed "
            "and float('-inf') elsewhere, e.g. torch.zeros(L, S).masked_fill(~mask, float('-inf'))",
            op,
        )
    if bound.get("enable_gqa"):
        return builder.fail(
            call,
            "groups query heads over fewer key/value heads (enable_gqa=True)",
            "repeat k and v over the heads first, k.repeat_interleave(q.shape[-3] // k.shape[-3], "
            "dim=-3), and leave enable_gqa off",
            op,
        )
    bound.pop("dropout_p", None)
    bound.pop("enable_gqa", None)
    if bound.get("scale") is not None:
        bound["scale"] = float(bound["scale"])
    if dropout_p:
        random_masks.drawn(builder)
        return _with_dropout(builder, bound, dropout_p, call)
    builder.layer(op, bound, call)


def _with_dropout(builder: Builder, bound: dict, dropout_p: float, call: "Call") -> None:
    """Attention with dropout inside it, as PyTorch's math kernel (the one it runs on the CPU when
    dropout_p > 0) computes it: the probabilities, then dropout, then their product with v, three layers
    (``rules/attention_probabilities.py``), whose forward draws the model's own masks."""
    from .recorder import Call

    query, key, value = bound["query"], bound["key"], bound["value"]
    scale = bound.get("scale")
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    with torch.no_grad():  # stand-ins of the right shapes and dtypes; no random number is drawn
        scores = scale * query @ key.transpose(-2, -1)
        probabilities = torch.softmax(scores, -1)
        dropped = probabilities.clone()
    made = Call("attention_probabilities", None, (), {}, probabilities, call.where, call.module, call.leaf)
    builder.layer(
        "attention_probabilities",
        {name: bound[name] for name in ("query", "key", "attn_mask", "is_causal", "scale") if name in bound},
        made,
    )
    drawn = Call("dropout", None, (), {}, dropped, call.where, call.module, call.leaf)
    builder.layer("dropout", {"input": probabilities, "p": dropout_p}, drawn)
    builder.layer("matmul", {"input": dropped, "other": value}, call)


@handles("einsum")
def einsum(builder: Builder, call: "Call") -> None:
    """``torch.einsum('bhid,bhjd->bhij', q, k)`` or ``torch.einsum(equation, [q, k])``: one einsum layer."""
    arguments = list(call.arguments)
    equation = call.keywords.get("equation", arguments.pop(0) if arguments else None)
    operands = arguments[0] if len(arguments) == 1 and isinstance(arguments[0], (list, tuple)) else arguments
    if not isinstance(equation, str) or not operands or not all(isinstance(o, torch.Tensor) for o in operands):
        return builder.fail(
            call, "is called in a form other than einsum(equation, *tensors)", "write torch.einsum('ij,jk->ik', a, b)"
        )
    written = _spelled_out(equation, [operand.dim() for operand in operands])
    if written is None:
        return builder.fail(
            call,
            f"has the equation {equation!r}, which is not letters, commas, '->' and '...' matching the operands' ranks",
            "write it with one letter per dim, e.g. 'bij,bjk->bik'",
        )
    inputs, arrow, output = written.partition("->")
    terms = inputs.split(",")
    if not arrow:  # implicit: the letters met once, in alphabetical order
        output = "".join(sorted(letter for letter in set(inputs) if inputs.count(letter) == 1))
    for term in terms:
        repeated = sorted({letter for letter in term if term.count(letter) > 1})
        if repeated:
            return builder.fail(
                call,
                f"takes a diagonal (index {repeated[0]!r} twice in {term!r}), whose adjoint is no einsum",
                "multiply by an identity registered as a buffer and sum instead, e.g. "
                "(x * self.eye).sum(-1) for 'bii->bi'",
            )
    if len(terms) == 1:  # one operand: a permutation is a permute layer, a sum is written as one
        if sorted(output) != sorted(terms[0]):
            return builder.fail(
                call,
                f"sums within its one operand ({equation!r}), which is no einsum of two tensors",
                "write the sum itself, x.sum(dims), then x.permute(...) for the order",
            )
        return builder.layer(
            "permute", {"input": operands[0], "dims": [terms[0].index(letter) for letter in output]}, call
        )
    builder.layer("einsum", {"operands": list(operands), "equation": written}, call)


def _spelled_out(equation: str, ranks: list[int]) -> str | None:
    """The equation with ``...`` replaced by letters it does not use, as many as each operand's rank leaves
    (right-aligned, as einsum broadcasts them); an implicit output keeps them first, as PyTorch does."""
    text = equation.replace(" ", "")
    inputs, arrow, output = text.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(ranks):
        return None
    if "..." not in text:
        return text
    unused = [letter for letter in string.ascii_letters if letter not in text]
    widths = [rank - len(term.replace("...", "")) if "..." in term else 0 for term, rank in zip(terms, ranks)]
    if min(widths) < 0 or max(widths) > len(unused):
        return None
    letters = "".join(unused[: max(widths)])
    terms = [term.replace("...", letters[len(letters) - width :]) for term, width in zip(terms, widths)]
    if arrow:
        output = output.replace("...", letters)
    else:
        joined = "".join(terms)
        output = letters + "".join(
            sorted(letter for letter in set(joined) if joined.count(letter) == 1 and letter not in letters)
        )
    return ",".join(terms) + "->" + output
