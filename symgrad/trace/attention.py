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

if TYPE_CHECKING:
    from .layers import SpecBuilder
    from .recorder import Call


def attention(builder: "SpecBuilder", op: str, bound: dict, call: "Call") -> None:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None)``."""
    mask = bound.get("attn_mask")
    if bound.get("dropout_p", 0.0):
        return builder.fail(call, f"drops attention weights at random (dropout_p={bound['dropout_p']!r}), so its gradient "
                            "is not a function of the inputs", "trace in eval mode (--eval), or with attn_drop=0 "
                            "(dropout_p=0.0)", op)
    if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
        return builder.fail(call, "takes a boolean attn_mask, which a spec cannot hold (its tensors are float)",
                            "make the mask additive: register a float buffer holding 0 where attention is allowed "
                            "and float('-inf') elsewhere, e.g. torch.zeros(L, S).masked_fill(~mask, float('-inf'))", op)
    if bound.get("enable_gqa"):
        return builder.fail(call, "groups query heads over fewer key/value heads (enable_gqa=True)",
                            "repeat k and v over the heads first, k.repeat_interleave(q.shape[-3] // k.shape[-3], "
                            "dim=-3), and leave enable_gqa off", op)
    bound.pop("dropout_p", None)
    bound.pop("enable_gqa", None)
    if bound.get("scale") is not None:
        bound["scale"] = float(bound["scale"])
    builder.layer(op, bound, call)


def einsum(builder: "SpecBuilder", call: "Call") -> None:
    """``torch.einsum('bhid,bhjd->bhij', q, k)`` or ``torch.einsum(equation, [q, k])``: one einsum layer."""
    arguments = list(call.arguments)
    equation = call.keywords.get("equation", arguments.pop(0) if arguments else None)
    operands = arguments[0] if len(arguments) == 1 and isinstance(arguments[0], (list, tuple)) else arguments
    if not isinstance(equation, str) or not operands or not all(isinstance(o, torch.Tensor) for o in operands):
        return builder.fail(call, "is called in a form other than einsum(equation, *tensors)",
                            "write torch.einsum('ij,jk->ik', a, b)")
    written = _spelled_out(equation, [operand.dim() for operand in operands])
    if written is None:
        return builder.fail(call, f"has the equation {equation!r}, which is not letters, commas, '->' and '...' "
                            "matching the operands' ranks", "write it with one letter per dim, e.g. 'bij,bjk->bik'")
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
    letters = "".join(unused[:max(widths)])
    terms = [term.replace("...", letters[len(letters) - width:]) for term, width in zip(terms, widths)]
    if arrow:
        output = output.replace("...", letters)
    else:
        joined = "".join(terms)
        output = letters + "".join(sorted(letter for letter in set(joined) if joined.count(letter) == 1
                                          and letter not in letters))
    return ",".join(terms) + "->" + output
