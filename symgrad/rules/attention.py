"""``scaled_dot_product_attention`` and ``einsum``: the products attention is made of.

Attention, with ``S = scale * q k^T + mask`` (``mask`` additive, broadcast against S; ``is_causal`` fills
the entries above the diagonal with -inf), ``P = softmax(S, -1)`` and ``out = P v``, is differentiated
as its three steps. The probabilities P are recomputed from q and k in the backward (as the fused
kernels do), then::

    grad_v = P^T g                                  (the adjoint of out = P v in v)
    grad_P = g v^T                                  (... and in P)
    grad_S = P * (grad_P - sum_-1(P * grad_P))      (softmax's Jacobian-vector product, diag(P) - P P^T per row)
    grad_q = scale * grad_S k,   grad_k = scale * grad_S^T q,   grad_mask = grad_S summed to the mask's shape

The Jacobian of softmax is never built: its product with a row of ``grad_P`` is the row minus its
P-weighted mean, times P. Dropout inside attention (``dropout_p > 0``) is written as three layers, the
probabilities, dropout and the product with v (``attention_probabilities.py``).

``einsum`` is multilinear: the adjoint for one operand is the einsum of the gradient with the other
operands, written to that operand's subscripts (``ij,jk->ik`` gives ``ik,jk->ij`` for the first). That
needs every index of the operand to appear in the output or another operand, and no index twice in one
operand (a diagonal); equations outside that are refused with the sum or copy to write first.
"""

from __future__ import annotations

import re

import sympy

from ..algebra import LINEAR, Size, op, primitive, tensor
from .base import Checker, Forward, Operand, Param, ParamContext, Rule, Sample, Spelling, boolean, finite_float
from .shared import in_operands_dtype, sum_over


# ----- scaled dot-product attention ----------------------------------------------------------------
class InverseRoot(sympy.Function):
    """``E ** -0.5`` of a size E read at run time (``q.shape[3]``): attention's default scale, so that
    the code stays right at every embedding size."""

    nargs = 1
    is_positive = True

    def _torchcode(self, printer) -> str:
        return f"({printer._print(self.args[0])} ** -0.5)"

    _sympystr = _torchcode

    def _latex(self, printer) -> str:
        return rf"\frac{{1}}{{\sqrt{{{printer._print(self.args[0])}}}}}"


def _attention_code(operands, params, show) -> str:
    query, key, value, *mask = operands
    extra = (f", attn_mask={mask[0]}" if mask else "") + (", is_causal=True" if params["is_causal"] else "")
    extra += f", scale={show(params['scale'])}" if params["explicit_scale"] else ""
    return f"F.scaled_dot_product_attention({query}, {key}, {value}{extra})"


def _attention_tangent(expr, tangent_of):
    """Forward mode through the composition softmax(scale * q k^T + mask) v, whose steps have tangents."""
    query, key, value, *mask = expr.operands
    return tangent_of(op("matmul", attention_softmax(query, key, mask[0] if mask else None, expr.params), value))


primitive(
    "scaled_dot_product_attention",
    code=_attention_code,
    latex=lambda operands, params, show: (
        rf"\operatorname{{softmax}}\left({show(params['scale'])}\, {operands[0]} {operands[1]}^{{\top}}"
        + (f" + {operands[3]}" if len(operands) > 3 else "")
        + rf"\right) {operands[2]}"
    ),
    tangent=_attention_tangent,
)  # not fresh: the flash and efficient kernels' backward reads the output
_FILL = {False: "float('-inf')", True: "0.0"}
"""What the entries above the diagonal become: -inf in the scores, 0 in their tangent."""

primitive(
    "causal_fill",
    code=lambda operands, params, show: (
        f"{operands[0]}.masked_fill(torch.ones({operands[0]}.shape[-2], {operands[0]}.shape[-1], dtype=torch.bool, "
        f"device={operands[0]}.device).triu(1), {_FILL[params['zero']]})"
    ),
    latex=lambda operands, params, show: rf"\operatorname{{causal}}\left({operands[0]}\right)",
    tangent=lambda expr, tangent_of: op("causal_fill", tangent_of(expr.operands[0]), zero=True),
)


MASKED_SOFTMAX = '''def _masked_softmax(scores, dim):
    """softmax over ``dim``, 0 along a row whose every entry is masked (-inf), as
    scaled_dot_product_attention computes it (torch.softmax gives NaN there, and so does
    attention before torch 2.5, whose softmax this is)."""
    if hasattr(torch.ops.aten, "_safe_softmax"):
        return torch.ops.aten._safe_softmax(scores, dim)
    return torch.softmax(scores, dim)
'''
"""Emitted once into each module with attention."""


def _masked_softmax_tangent(expr, tangent_of):
    """d P = P * (dS - sum_dim(P * dS)), as softmax's: a masked row's P, 0, gives it 0."""
    moved = tangent_of(expr.operands[0])
    if moved == 0:
        return sympy.Integer(0)
    return expr * (moved - sum_over(expr * moved, expr.params["dim"]))


primitive(
    "masked_softmax",
    code=lambda operands, params, show: f"_masked_softmax({operands[0]}, {params['dim']})",
    latex=lambda operands, params, show: rf"\operatorname{{softmax}}_{{{params['dim']}}}\left({operands[0]}\right)",
    tangent=_masked_softmax_tangent,
    helper=MASKED_SOFTMAX,
)


def attention_softmax(query, key, mask, params):
    """P = softmax(scale * q k^T (+ mask), -1), with -inf above the diagonal when causal; a row masked
    whole gets 0, not NaN, as PyTorch's attention kernels give it (and their gradients are finite there)."""
    scores = params["scale"] * op("matmul_transposed", query, key, which="right")
    if mask is not None:
        scores = scores + mask
    if params["is_causal"]:
        scores = op("causal_fill", scores, zero=False)
    return op("masked_softmax", scores, dim=-1)


def _dropout(value, context: ParamContext):
    value = finite_float(value, context)
    if value != 0:
        raise context.fail(
            f"is {value!r}: dropout inside attention is written as three layers, not as this op's argument",
            "write {op: attention_probabilities, in: [q, k]}, {op: dropout, p: ...} and "
            "{op: matmul, in: [dropped, v]}, as symgrad trace writes it (rules/attention_probabilities.py)",
        )
    return 0


def scale_argument(value, context: ParamContext):
    if value is None:
        return None
    value = finite_float(value, context)
    return sympy.Float(value, 17) if isinstance(value, float) else sympy.Integer(value)


def _no_gqa(value, context: ParamContext):
    if boolean(value, context):
        raise context.fail(
            "is true: grouped-query attention is not supported",
            "repeat k and v over the heads (k.repeat_interleave(groups, dim=-3)) and leave enable_gqa off",
        )
    return False


class ScaledDotProductAttention(Rule):
    op = "scaled_dot_product_attention"
    calls = ("scaled_dot_product_attention",)
    signature = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    operands = (
        Operand("query", from_in=True),
        Operand("key", from_in=True),
        Operand("value", from_in=True),
        Operand("attn_mask", optional=True),
    )
    params = {
        "dropout_p": Param(0.0, _dropout),
        "is_causal": Param(False, boolean),
        "scale": Param(None, scale_argument),
        "enable_gqa": Param(False, _no_gqa),
    }
    operand_roles = {"attn_mask": "shift"}
    summary = "softmax(scale * q @ k^T + attn_mask) @ v over the last two dims (dropout_p 0)"

    def reference(self, arguments, params):
        import torch

        return torch.nn.functional.scaled_dot_product_attention(**arguments, **params)

    def reference_params(self, params):
        return {
            key: (float(value) if isinstance(value, sympy.Basic) else value)
            for key, value in params.items()
            if key in ("is_causal", "scale")
        }

    def infer_shape(self, shapes, params, check: Checker):
        query, key, value = shapes["query"], shapes["key"], shapes["value"]
        check.require(
            len(query) >= 2 and len(key) == len(query) and len(value) == len(query),
            f"query, key and value have {len(query)}, {len(key)} and {len(value)} dims",
            "give them one rank, at least 2: [..., L, E], [..., S, E], [..., S, Ev]",
        )
        for axis in range(len(query) - 2):
            check.equal(
                key[axis],
                query[axis],
                lambda: f"key's batch dims {tuple(key[:-2])} differ from query's {tuple(query[:-2])}",
                "give query, key and value the same batch and head dims",
            )
            check.equal(
                value[axis],
                query[axis],
                lambda: f"value's batch dims {tuple(value[:-2])} differ from query's {tuple(query[:-2])}",
                "give query, key and value the same batch and head dims",
            )
        check.equal(
            key[-1],
            query[-1],
            lambda: f"key's last dim {key[-1]} differs from query's {query[-1]}",
            "give query and key the same embedding size",
        )
        check.equal(
            value[-2],
            key[-2],
            lambda: f"value has {value[-2]} positions but key {key[-2]}",
            "give key and value the same number of positions",
        )
        check_mask(shapes, params, (*query[:-1], key[-2]), check)
        return (*query[:-1], value[-1])

    def _params(self, node):
        scale = node.params["scale"]
        explicit = scale is not None
        if scale is None:  # PyTorch's default 1 / sqrt(E), E the embedding size, read at run time
            scale = InverseRoot(Size(node.operands["query"], len(node.shapes["query"]) - 1))
        return {"scale": scale, "explicit_scale": explicit, "is_causal": node.params["is_causal"]}

    def _fused(self, node) -> bool:
        """The fused derivation calls the CPU flash kernels (``attention_fused.py``) where autograd may: 4-d
        tensors, no mask (whose gradient the kernel does not give); ``_attention`` checks the rest at run time."""
        return node.fused and "attn_mask" not in node.operands and len(node.shapes["query"]) == 4

    def forward(self, node):
        operands = [node.operands[name] for name in ("query", "key", "value", "attn_mask") if name in node.operands]
        value = op("scaled_dot_product_attention", *operands, **self._params(node))
        if not self._fused(node):
            return Forward(value)
        # the fused pullback reads the output and the logsumexp the flash kernel computes anyway (autograd saves them)
        both = node.local(
            "flash",
            op("attention_with_logsumexp", *operands, **self._params(node)),
            note=f"{node.name} with the logsumexp its gradient reads",
        )
        node.local("logsumexp", op("item", both, index=1), note=f"{node.name}'s logsumexp of each row of scores")
        return Forward(op("item", both, index=0), math=value)

    def pullback(self, node, grad, wanted):
        params = self._params(node)
        query, key, value = (node.operands[name] for name in ("query", "key", "value"))
        if self._fused(node):  # named by forward() above
            fused = node.local(
                "local",
                op("attention_backward", grad, query, key, value, node.out, tensor(f"logsumexp_{node.name}"), **params),
                note="grad_q = s dS k, grad_k = s dS^T q, grad_v = P^T g; dS = P (g v^T - sum(P g v^T))",
            )
            names = ("query", "key", "value")
            return {name: op("item", fused, index=index) for index, name in enumerate(names) if name in wanted}
        mask = node.operands.get("attn_mask")
        probabilities = node.local(
            "probabilities",
            attention_softmax(query, key, mask, params),
            note=f"attention probabilities of {node.name}, recomputed from q and k",
        )
        grads = {}
        if "value" in wanted:  # value is read where query's, key's or the mask's gradient is
            grads["value"] = in_operands_dtype(
                op("matmul_transposed", probabilities, grad, which="left"),
                value,
                read_anyway=bool(wanted & {"query", "key", "attn_mask"}),
            )
        if wanted & {"query", "key", "attn_mask"}:
            grad_probabilities = op("matmul_transposed", grad, value, which="right")
            rank = len(node.shapes["query"])
            grad_scores = node.local(
                "grad_scores",
                probabilities * (grad_probabilities - sum_over(probabilities * grad_probabilities, rank - 1)),
                note=f"gradient of {node.name}'s scores: softmax's Jacobian-vector product",
            )
            if "query" in wanted:  # query and key are read for the probabilities
                grads["query"] = in_operands_dtype(params["scale"] * op("matmul", grad_scores, key), query, True)
            if "key" in wanted:
                grads["key"] = in_operands_dtype(
                    params["scale"] * op("matmul_transposed", grad_scores, query, which="left"), key, True
                )
            if "attn_mask" in wanted:
                grads["attn_mask"] = op("sum_to_size", grad_scores, mask)
        return grads

    def table_row(self):
        return (
            self.op,
            "P = softmax(scale * q @ k^T + attn_mask, -1); out = P @ v",
            "grad_v = P^T @ g; grad_S = P * (g @ v^T - sum_-1(P * (g @ v^T))); grad_q = scale * grad_S @ k; "
            "grad_k = scale * grad_S^T @ q; grad_attn_mask = grad_S summed to its shape",
        )


# ----- einsum --------------------------------------------------------------------------------------
def _equation(value, context: ParamContext) -> str:
    """An explicit einsum equation of letters (``bhid,bhjd->bhij``): spaces dropped, the implicit output
    (the letters met once, in alphabetical order) written out; no ``...`` (the tracer writes it as letters)."""
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z ,]+(->[A-Za-z ]*)?", value):
        raise context.fail(
            f"must be an einsum equation of letters, commas and '->', not {str(value)[:60]!r}",
            "write e.g. `equation: 'bij,bjk->bik'` (spell '...' out as letters)",
        )
    text = value.replace(" ", "")
    inputs, _, output = text.partition("->")
    terms = inputs.split(",")
    if "->" not in text:
        letters = "".join(terms)
        output = "".join(sorted(letter for letter in set(letters) if letters.count(letter) == 1))
    for term in terms:
        repeated = sorted({letter for letter in term if term.count(letter) > 1})
        if repeated:
            raise context.fail(
                f"repeats index {repeated[0]!r} within the operand {term!r} (a diagonal), which has no einsum adjoint",
                "take the diagonal first (torch.diagonal) and einsum the result",
            )
        alone = [
            letter
            for letter in term
            if letter not in output
            and not any(letter in other for position, other in enumerate(terms) if other is not term)
        ]
        if alone:
            raise context.fail(
                f"sums index {alone[0]!r} within the operand {term!r} alone, whose adjoint is a copy, not an einsum",
                f"sum that dim of the operand first (x.sum(dim)) and drop {alone[0]!r}",
            )
    if len(set(output)) != len(output) or any(letter not in "".join(terms) for letter in output):
        raise context.fail(
            f"has the output {output!r}, with a repeated index or one no operand has",
            "give each output index once, taken from the operands",
        )
    return ",".join(terms) + "->" + output


ARROW = r"\to "
primitive(
    "einsum",
    code=lambda operands, params, show: f"torch.einsum({params['equation']!r}, {', '.join(operands)})",
    latex=lambda operands, params, show: (
        rf"\operatorname{{einsum}}_{{\texttt{{{params['equation'].replace('->', ARROW)}}}}}\left("
        + ", ".join(operands)
        + r"\right)"
    ),
    tangent=LINEAR,
    fresh=True,
)


class Einsum(Rule):
    op = "einsum"
    traced_elsewhere = "torch.einsum(equation, *operands): the tracer's einsum handler (symgrad/trace/attention.py)"
    operands = (Operand("operands", from_in=True, variadic=True),)
    params = {"equation": Param(None, _equation)}
    summary = "torch.einsum(equation, *operands), without diagonals or indices summed within one operand"

    def reference(self, arguments, params):
        import torch

        return torch.einsum(params["equation"], *(arguments[f"operands_{index}"] for index in range(len(arguments))))

    def _terms(self, params) -> tuple[list[str], str]:
        inputs, output = params["equation"].split("->")
        return inputs.split(","), output

    linear_in = ("operands",)

    def infer_shape(self, shapes, params, check: Checker):
        terms, output = self._terms(params)
        ordered = [shapes[f"operands_{index}"] for index in range(len(shapes))]
        check.require(
            len(terms) == len(ordered),
            f"equation {params['equation']!r} has {len(terms)} operands, not {len(ordered)}",
            "give one subscript per operand",
        )
        sizes: dict[str, object] = {}
        for term, shape in zip(terms, ordered):
            check.require(
                len(term) == len(shape),
                f"subscript {term!r} has {len(term)} indices for a {len(shape)}-dim operand",
                "give one index per dim",
            )
            for letter, size in zip(term, shape):
                if letter in sizes:
                    check.equal(
                        size,
                        sizes[letter],
                        lambda: f"index {letter!r} has sizes {sizes[letter]} and {size}",
                        "give an index one size in every operand",
                    )
                else:
                    sizes[letter] = size
        return tuple(sizes[letter] for letter in output)

    def forward(self, node):
        ordered = [node.operands[f"operands_{index}"] for index in range(len(node.operands))]
        return Forward(op("einsum", *ordered, equation=node.params["equation"]))

    def pullback(self, node, grad, wanted):
        terms, output = self._terms(node.params)
        ordered = [node.operands[f"operands_{index}"] for index in range(len(terms))]
        grads = {}
        for index, term in enumerate(terms):
            if f"operands_{index}" not in wanted:
                continue
            others = [other for position, other in enumerate(terms) if position != index]
            equation = ",".join([output, *others]) + "->" + term
            gradient = op(
                "einsum",
                grad,
                *(ordered[position] for position in range(len(terms)) if position != index),
                equation=equation,
            )
            read_anyway = any(f"operands_{position}" in wanted for position in range(len(terms)) if position != index)
            grads[f"operands_{index}"] = in_operands_dtype(gradient, ordered[index], read_anyway)
        return grads

    def table_row(self):
        return (
            self.op,
            "out = torch.einsum('ij,jk->ik', a, b) (any equation without diagonals)",
            "grad of each operand = torch.einsum('ik,jk->ij', grad_out, the others): the output's subscripts "
            "and the others' to the operand's",
        )


RULES = [ScaledDotProductAttention(), Einsum()]


CERTIFICATES = [  # (label, input shapes, layer, linear operands): `symgrad certify` proves each adjoint exact
    (
        "einsum (first operand)",
        {"x": (2, 3, 2), "v": (2, 2, 3)},
        {"op": "einsum", "in": ["x", "v"], "equation": "bij,bjk->bik"},
        ("x",),
    ),
    (
        "einsum (second operand)",
        {"x": (2, 3, 2), "v": (3, 2)},
        {"op": "einsum", "in": ["x", "v"], "equation": "bij,ik->bkj"},
        ("v",),
    ),
]


def check_mask(shapes, params, scores, check) -> None:
    """An ``attn_mask`` operand's checks, where there is one: not with ``is_causal``, and broadcast to the
    ``scores`` (query @ key^T) shape; shared by attention and its probabilities alone."""
    if "attn_mask" not in shapes:
        return
    check.require(
        not params["is_causal"],
        "takes attn_mask together with is_causal, which PyTorch refuses",
        "add the causal -inf entries to the mask and drop is_causal, or drop the mask",
    )
    mask = shapes["attn_mask"]
    check.require(
        len(mask) <= len(scores),
        f"attn_mask has {len(mask)} dims, more than the scores' {len(scores)}",
        "give attn_mask the shape [..., L, S], broadcast against the scores",
    )
    for size, target in zip(mask[::-1], scores[::-1]):
        if check.symbolic:
            check.equal(size, target, "", "")
        else:
            check.require(
                size == target or size == 1,
                f"attn_mask of shape {tuple(mask)} does not broadcast to the scores' {tuple(scores)}",
                "give attn_mask the shape [..., L, S]",
            )


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "scaled_dot_product_attention": [
        Sample(
            "scaled_dot_product_attention",
            {"q": [2, 2, 4, 3], "k": [2, 2, 5, 3], "v": [2, 2, 5, 6], "y": [2, 2, 4, 6]},
            [{"op": "scaled_dot_product_attention", "in": ["q", "k", "v"], "out": "out"}],
            ["q", "k", "v"],
        ),
        Sample(
            "scaled_dot_product_attention-causal-scale",
            {"q": [2, 3, 4, 3], "k": [2, 3, 4, 3], "v": [2, 3, 4, 2], "y": [2, 3, 4, 2]},
            [
                {
                    "op": "scaled_dot_product_attention",
                    "in": ["q", "k", "v"],
                    "is_causal": True,
                    "scale": 0.7,
                    "out": "out",
                }
            ],
            ["q", "k", "v"],
        ),
        Sample(
            "scaled_dot_product_attention-causal-fewer-queries",
            {"q": [2, 3, 3, 2], "k": [2, 3, 5, 2], "v": [2, 3, 5, 2], "y": [2, 3, 3, 2]},
            [{"op": "scaled_dot_product_attention", "in": ["q", "k", "v"], "is_causal": True, "out": "out"}],
            ["q", "k", "v"],
        ),
        Sample(
            "scaled_dot_product_attention-additive-mask",
            {"q": [2, 2, 4, 3], "k": [2, 2, 5, 3], "v": [2, 2, 5, 3], "m": [2, 1, 4, 5], "y": [2, 2, 4, 3]},
            [{"op": "scaled_dot_product_attention", "in": ["q", "k", "v"], "attn_mask": "m", "out": "out"}],
            ["q", "k", "v", "m"],
        ),
    ],
    "einsum": [
        Sample(
            "einsum-attention-scores",
            {"q": [2, 3, 4, 5], "k": [2, 3, 6, 5], "y": [2, 3, 4, 6]},
            [{"op": "einsum", "in": ["q", "k"], "equation": "bhid,bhjd->bhij", "out": "out"}],
            ["q", "k"],
        ),
        Sample(
            "einsum-three-operands",
            {"a": [3, 4], "b": [4, 5], "c": [5, 2], "y": [3, 2]},
            [{"op": "einsum", "in": ["a", "b", "c"], "equation": "ij,jk,kl->il", "out": "out"}],
            ["a", "b", "c"],
        ),
        Sample(
            "einsum-implicit-output",
            {"a": [3, 4], "b": [4, 5], "y": [3, 5]},
            [{"op": "einsum", "in": ["a", "b"], "equation": "ij,jk", "out": "out"}],
            ["a", "b"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "scaled_dot_product_attention": [
        Spelling("F.scaled_dot_product_attention(q, k, v)", {"q": (2, 2, 4, 3), "k": (2, 2, 5, 3), "v": (2, 2, 5, 3)}),
        # an additive float mask (a bias)
        Spelling(
            "F.scaled_dot_product_attention(q, k, v, m, scale=0.5)",
            {"q": (2, 2, 4, 3), "k": (2, 2, 5, 3), "v": (2, 2, 5, 3), "m": (4, 5)},
        ),
        Spelling(
            "F.scaled_dot_product_attention(q, k, v, is_causal=True)",
            {"q": (2, 2, 4, 3), "k": (2, 2, 4, 3), "v": (2, 2, 4, 3)},
        ),
    ],
    "einsum": [
        Spelling('torch.einsum("bhid,bhjd->bhij", q, k)', {"q": (2, 2, 4, 3), "k": (2, 2, 5, 3)}),
        Spelling('torch.einsum("...id,...jd->...ij", [q, k])', {"q": (2, 2, 4, 3), "k": (2, 2, 5, 3)}),
        # implicit output
        Spelling('torch.einsum("bchw,oc", x, w)', {"x": (2, 3, 4, 5), "w": (6, 3)}),
    ],
}
