"""The probabilities of attention, ``P = softmax(scale * q k^T + attn_mask, -1)`` (``is_causal``: -inf above
the diagonal), alone: the first step of ``scaled_dot_product_attention`` with dropout inside it, which the
tracer writes as three layers, as PyTorch's math kernel computes it::

    attention_probabilities(q, k)  ->  dropout(P, p)  ->  matmul(P_dropped, v)

PyTorch runs that kernel (``_scaled_dot_product_attention_math``) on the CPU whenever ``dropout_p > 0``: it
scales q and k by ``sqrt(scale)`` each, multiplies, adds the mask, takes the softmax, then draws the dropout
mask as ``F.dropout`` does (``empty_like(P).bernoulli_(1 - p)``, ``div_(1 - p)``). The generated forward
makes the same calls in the same order (``_attention_probabilities``, then the ``dropout`` layer's draws), so
from the same random state it draws the model's own masks, and its output is the model's bit for bit. The
fused kernels on CUDA draw otherwise: there the masks differ from the model's (each still a dropout mask).

The adjoint is softmax's Jacobian-vector product through the scores, as in ``attention.py``::

    grad_S = P * (grad - sum_-1(P * grad))
    grad_q = scale * grad_S k,   grad_k = scale * grad_S^T q,   grad_mask = grad_S summed to the mask's shape
"""

from __future__ import annotations

from ..algebra import Size, op, primitive
from .attention import InverseRoot, attention_softmax, check_mask, scale_argument
from .base import Checker, Forward, Operand, Param, Rule, Sample, Spelling, boolean
from .shared import in_operands_dtype, sum_over

PROBABILITIES = '''def _attention_probabilities(query, key, attn_mask=None, is_causal=False, scale=None):
    """softmax(scale * query @ key^T + attn_mask, -1), computed step for step as PyTorch's
    math kernel of scaled_dot_product_attention computes it (its CPU kernel when dropout_p > 0):
    q and k each scaled by sqrt(scale), so that the values, and the dropout drawn after them,
    are the model's bit for bit."""
    import math

    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    factor = math.sqrt(abs(scale))
    scores = (query * (factor if scale >= 0 else 0.0 - factor)) @ (key.transpose(-2, -1) * factor)
    if is_causal:
        rows, columns = scores.shape[-2], scores.shape[-1]
        above = torch.ones(rows, columns, dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    if attn_mask is not None:
        scores = scores + attn_mask
    # a row masked whole: 0, as the kernel gives it since torch 2.5
    if hasattr(torch.ops.aten, "_safe_softmax"):
        return torch.ops.aten._safe_softmax(scores, -1)
    return torch.softmax(scores, -1)
'''
"""Emitted once into each module with attention dropout."""


def _code(operands, params, show) -> str:
    query, key, *mask = operands
    extra = (f", {mask[0]}" if mask else "") + (", is_causal=True" if params["is_causal"] else "")
    extra += f", scale={show(params['scale'])}" if params["explicit_scale"] else ""
    return f"_attention_probabilities({query}, {key}{extra})"


primitive(
    "attention_probabilities",
    code=_code,
    helper=PROBABILITIES,
    latex=lambda operands, params, show: (
        rf"\operatorname{{softmax}}\left({show(params['scale'])}\, {operands[0]} {operands[1]}^{{\top}}"
        + (f" + {operands[2]}" if len(operands) > 2 else "")
        + r"\right)"
    ),
    tangent=lambda expr, tangent_of: tangent_of(
        attention_softmax(
            expr.operands[0], expr.operands[1], expr.operands[2] if len(expr.operands) > 2 else None, expr.params
        )
    ),
)


class AttentionProbabilities(Rule):
    op = "attention_probabilities"
    traced_elsewhere = (
        "F.scaled_dot_product_attention(..., dropout_p=p) in training mode: the tracer's attention "
        "handler (symgrad/trace/attention.py) writes it as this, dropout and matmul"
    )
    operands = (Operand("query", from_in=True), Operand("key", from_in=True), Operand("attn_mask", optional=True))
    params = {"is_causal": Param(False, boolean), "scale": Param(None, scale_argument)}
    operand_roles = {"attn_mask": "shift"}
    summary = (
        "attention's probabilities softmax(scale * q @ k^T + attn_mask, -1), as PyTorch's math kernel computes them"
    )

    def reference(self, arguments, params):
        import math

        import torch

        query, key, mask = arguments["query"], arguments["key"], arguments.get("attn_mask")
        scale = params.get("scale")
        scale = 1 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
        scores = scale * query @ key.transpose(-2, -1)
        if params.get("is_causal"):
            scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
        scores = scores if mask is None else scores + mask
        return (
            torch.ops.aten._safe_softmax(scores, -1)
            if hasattr(torch.ops.aten, "_safe_softmax")
            else torch.softmax(scores, -1)
        )

    def infer_shape(self, shapes, params, check: Checker):
        query, key = shapes["query"], shapes["key"]
        check.require(
            len(query) >= 2 and len(key) == len(query),
            f"query and key have {len(query)} and {len(key)} dims",
            "give them one rank, at least 2: [..., L, E], [..., S, E]",
        )
        for axis in range(len(query) - 2):
            check.equal(
                key[axis],
                query[axis],
                lambda: f"key's batch dims {tuple(key[:-2])} differ from query's {tuple(query[:-2])}",
                "give query and key the same batch and head dims",
            )
        check.equal(
            key[-1],
            query[-1],
            lambda: f"key's last dim {key[-1]} differs from query's {query[-1]}",
            "give query and key the same embedding size",
        )
        scores = (*query[:-1], key[-2])
        check_mask(shapes, params, scores, check)
        return scores

    def _params(self, node):
        scale = node.params["scale"]
        explicit = scale is not None
        if scale is None:  # PyTorch's default 1 / sqrt(E), E the embedding size, read at run time
            scale = InverseRoot(Size(node.operands["query"], len(node.shapes["query"]) - 1))
        return {"scale": scale, "explicit_scale": explicit, "is_causal": node.params["is_causal"]}

    def forward(self, node):
        operands = [node.operands[name] for name in ("query", "key", "attn_mask") if name in node.operands]
        return Forward(op("attention_probabilities", *operands, **self._params(node)))

    def pullback(self, node, grad, wanted):
        params = self._params(node)
        query, key, probabilities = node.operands["query"], node.operands["key"], node.out
        rank = len(node.shapes["query"])
        grad_scores = node.local(
            "grad_scores",
            probabilities * (grad - sum_over(probabilities * grad, rank - 1)),
            note=f"gradient of {node.name}'s scores: softmax's Jacobian-vector product",
        )
        grads = {}
        if "query" in wanted:  # query and key are read for the probabilities
            grads["query"] = in_operands_dtype(params["scale"] * op("matmul", grad_scores, key), query, True)
        if "key" in wanted:
            grads["key"] = in_operands_dtype(
                params["scale"] * op("matmul_transposed", grad_scores, query, which="left"), key, True
            )
        if "attn_mask" in wanted:
            grads["attn_mask"] = op("sum_to_size", grad_scores, node.operands["attn_mask"])
        return grads

    def table_row(self):
        return (
            self.op,
            "P = softmax(scale * q @ k^T + attn_mask, -1) (the math kernel's steps)",
            "grad_S = P * (g - sum_-1(P * g)); grad_q = scale * grad_S @ k; grad_k = scale * grad_S^T @ q; "
            "grad_attn_mask = grad_S summed to its shape",
        )


RULES = [AttentionProbabilities()]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "attention_probabilities": [
        Sample(
            "attention_probabilities",
            {"q": [2, 2, 3, 4], "k": [2, 2, 5, 4], "y": [2, 2, 3, 5]},
            [{"op": "attention_probabilities", "in": ["q", "k"]}],
            ["q", "k"],
        ),
        Sample(
            "attention_probabilities-causal-scale",
            {"q": [2, 4, 3], "k": [2, 4, 3], "y": [2, 4, 4]},
            [{"op": "attention_probabilities", "in": ["q", "k"], "is_causal": True, "scale": 0.3}],
            ["q", "k"],
        ),
        Sample(
            "attention_probabilities-mask",
            {"q": [2, 3, 4], "k": [2, 5, 4], "m": [3, 5], "y": [2, 3, 5]},
            [{"op": "attention_probabilities", "in": ["q", "k"], "attn_mask": "m"}],
            ["q", "k", "m"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "attention_probabilities": [
        # dropout inside attention (training mode)
        Spelling(
            "F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)",
            {"q": (2, 2, 4, 3), "k": (2, 2, 4, 3), "v": (2, 2, 4, 3)},
        ),
    ],
}
