"""``linear`` and ``matmul``: bilinear, like conv, with matrix-product adjoints.

For ``out = x @ W.T + b`` over any leading dims: ``grad_x = grad @ W``; ``grad_W`` sums the outer
products of the gradient and the input over every leading position, ``grad.flatten(0, -2).T @
x.flatten(0, -2)``; ``grad_b`` sums the gradient over the leading dims. For ``out = a @ b``:
``grad_a = grad @ b^T`` and ``grad_b = a^T @ grad`` (transposing the last two dims). Batch dims broadcast (``x @ w`` with w
[K, M] against x [B, H, N, K]): a gradient is summed back to its operand's shape where the operand
has fewer batch dims than the output or a batch size 1. Over 3 or more dims ``F.linear`` picks its kernels
by the input's layout at run time, and so do the helpers its pullback prints (``_linear_input_grad``,
``_linear_bias_grad``): float32 gradients are autograd's bit for bit for a strided input too.
"""

from __future__ import annotations

import sympy

from ..algebra import LINEAR, TensorOp, op, primitive
from .base import Checker, Forward, NodeSymbols, Operand, Rule, Sample, Spelling
from .shared import affine_tangent, in_operands_dtype

primitive(
    "linear",
    code=lambda operands, params, show: f"F.linear({', '.join(operands)})",
    latex=lambda operands, params, show: (
        f"{operands[0]} \\cdot {operands[1]}^{{\\top}}" + (f" + {operands[2]}" if len(operands) > 2 else "")
    ),
    tangent=affine_tangent("linear"),
    fresh=True,
)
primitive(  # two_d: both operands 2-d at every size (their rank is the spec's), `mm`: matmul's own 2-d kernel
    "matmul",  # without its dispatch on ranks
    code=lambda operands, params, show: f"{operands[0]}.{'mm' if params.get('two_d') else 'matmul'}({operands[1]})",
    latex=lambda operands, params, show: f"{operands[0]} \\cdot {operands[1]}",
    tangent=LINEAR,
    fresh=True,
)
primitive(
    "matmul_transposed",
    code=lambda operands, params, show: (
        f"{operands[0]}.T.mm({operands[1]})"
        if params.get("two_d") and params["which"] == "left"
        else f"{operands[0]}.mm({operands[1]}.T)"
        if params.get("two_d")
        else f"{operands[0]}.transpose(-1, -2).matmul({operands[1]})"
        if params["which"] == "left"
        else f"{operands[0]}.matmul({operands[1]}.transpose(-1, -2))"
    ),
    latex=lambda operands, params, show: (
        f"{operands[0]}^{{\\top}} \\cdot {operands[1]}"
        if params["which"] == "left"
        else f"{operands[0]} \\cdot {operands[1]}^{{\\top}}"
    ),
    tangent=LINEAR,
    fresh=True,
)
primitive(  # [N, out] and [N, in] (leading dims flattened by linear's pullback): one mm
    "linear_weight_grad",
    code=lambda operands, params, show: f"{operands[0]}.T.mm({operands[1]})",
    latex=lambda operands, params, show: (
        f"\\sum_{{n}} {{{operands[0]}}}_{{n}} \\cdot {{{operands[1]}}}_{{n}}^{{\\top}}"
    ),
    tangent=LINEAR,
)


IN_AUTOCAST_DTYPE = '''def _in_autocast_dtype(value):
    """``value`` cast once as autocast casts a convolution's or product's operand (else itself)."""
    device = value.device.type  # "meta" where bind checks a call's sizes: no autocast there
    if device == "meta" or not torch.is_autocast_enabled(device) or value.dtype == torch.float64:
        return value
    dtype = torch.get_autocast_dtype(device)
    return value if value.dtype == dtype or not value.is_floating_point() else value.to(dtype)
'''
"""Emitted once into each module whose linear maps flatten their gradient or that keeps a weight's autocast copy."""

primitive(
    "in_autocast_dtype",
    helper=IN_AUTOCAST_DTYPE,
    code=lambda operands, params, show: f"_in_autocast_dtype({operands[0]})",
    latex=lambda operands, params, show: operands[0],
    tangent=LINEAR,
)


LINEAR_INPUT_GRAD = '''def _linear_input_grad(flat, weight, folded):
    """``flat @ weight`` as mm's backward computes it for F.linear's input folded to [N, in]."""
    if folded.stride(0) == 1 and folded.stride(1) == folded.shape[0]:
        return weight.T.mm(flat.T).T
    return flat.mm(weight)
'''
"""Emitted once into each module with a linear map of an input of 3 or more dims (``Primitive.helper``)."""

LINEAR_FROZEN_INPUT_GRAD = '''def _linear_frozen_input_grad(flat, weight, x, grad, bias):
    """F.linear's input gradient for a frozen weight: matmul folds x where it views, else bmm."""
    if not (bias and x.is_contiguous()) and x.numel() and any(
            x.stride(d) != x.stride(d + 1) * x.shape[d + 1] for d in range(x.dim() - 2)):
        batched = grad.reshape(-1, x.shape[-2], grad.shape[-1])  # matmul's bmm
        return batched.bmm(_in_autocast_dtype(weight).expand(batched.shape[0], *weight.shape))
    folded = x.flatten(0, -2)
    if folded.stride(0) == 1 and folded.stride(1) == folded.shape[0]:
        return weight.T.mm(flat.T).T
    return flat.mm(weight)
'''
"""Emitted once into each module with a linear map of an input of 3 or more dims whose weight is frozen."""

LINEAR_BIAS_GRAD = '''def _linear_bias_grad(flat, grad, x):
    """Summed as autograd sums it: after F.linear's addmm (contiguous x) or its matmul and add."""
    if x.is_contiguous():
        return flat.sum(dim=0)
    return grad.sum_to_size(flat.shape[-1])
'''
"""Emitted once into each module with a linear map of an input of 3 or more dims, with a bias."""


def _input_grad_tangent(expr, tangent_of):
    """Bilinear in the gradient (flattened, and as it came for a frozen weight's helper) and the weight; the
    input is read for its shape and layout alone."""
    flat, weight, *rest = expr.operands
    moved_flat, moved_weight = tangent_of(flat), tangent_of(weight)
    frozen = expr.primitive.name == "linear_frozen_input_grad"  # its operand 4: the gradient as it came
    moved_rest = [*rest[:2], tangent_of(rest[2])] if frozen else rest
    terms = [TensorOp(expr.args[0], expr.params, moved_flat, weight, *moved_rest)] if moved_flat != 0 else []
    if moved_weight != 0:
        terms.append(TensorOp(expr.args[0], expr.params, flat, moved_weight, *rest))
    return sympy.Add(*terms)


primitive(  # a linear map's input gradient from its gradient seen as [N, out], in the input's shape; the
    "linear_input_grad",  # input folded to [N, in] (operand 3) is read for its layout alone
    helper=LINEAR_INPUT_GRAD,
    code=lambda operands, params, show: (
        f"_linear_input_grad({operands[0]}, {operands[1]}, {operands[3]}).reshape({operands[2]})"
    ),
    latex=lambda operands, params, show: f"{operands[0]} \\cdot {operands[1]}",
    shape_operands=(2,),
    tangent=_input_grad_tangent,
    fresh=True,
)

primitive(  # as linear_input_grad for a weight without gradient: operands 3 and 4 the input and the gradient
    "linear_frozen_input_grad",  # as they came (matmul's bmm reads them where the input does not fold)
    helper=LINEAR_FROZEN_INPUT_GRAD,
    code=lambda operands, params, show: (
        f"_linear_frozen_input_grad({operands[0]}, {operands[1]}, {operands[3]}, {operands[4]}, "
        f"bias={params['bias']}).reshape({operands[2]})"
    ),
    latex=lambda operands, params, show: f"{operands[0]} \\cdot {operands[1]}",
    shape_operands=(2,),
    tangent=_input_grad_tangent,
    fresh=True,
)


def _bias_grad_tangent(expr, tangent_of):
    """Linear in the gradient (both of its forms move together); the input is read for its layout alone."""
    flat, grad, x = expr.operands
    moved_flat, moved_grad = tangent_of(flat), tangent_of(grad)
    if moved_grad == 0 and moved_flat == 0:
        return sympy.Integer(0)
    return op("linear_bias_grad", moved_flat, moved_grad, x)


primitive(  # a linear map's bias gradient from its gradient and that seen as [N, out], for the input's layout
    "linear_bias_grad",
    helper=LINEAR_BIAS_GRAD,
    code=lambda operands, params, show: f"_linear_bias_grad({', '.join(operands)})",
    latex=lambda operands, params, show: f"\\sum_{{n}} {{{operands[0]}}}_{{n}}",
    tangent=_bias_grad_tangent,
)
primitive(
    "linear_weight_grad_per_sample",
    code=lambda operands, params, show: (
        f"{operands[0]}.unsqueeze(-1).mul({operands[1]}.unsqueeze(-2))"
        + (f".sum(dim={tuple(range(1, params['rank'] - 1))})" if params["rank"] > 2 else "")
    ),
    latex=lambda operands, params, show: (
        f"\\left[{{{operands[0]}}}_{{n}} \\cdot {{{operands[1]}}}_{{n}}^{{\\top}}\\right]_{{n}}"
    ),
    tangent=LINEAR,
)


class Linear(Rule):
    op = "linear"
    calls = ("linear",)
    operand_roles = {"weight": "weight", "bias": "shift"}
    operands = (Operand("input", from_in=True), Operand("weight"), Operand("bias", optional=True))
    linear_in = ("input", "weight")
    summary = "input @ weight.T + bias over the last dim"

    def infer_shape(self, shapes, params, check: Checker):
        x, w = shapes["input"], shapes["weight"]
        check.require(len(w) == 2, f"weight must be 2-d [out, in], not {len(w)}-d", "give weight the shape [out, in]")
        check.require(len(x) >= 2, "input needs a batch dim and a feature dim", "use [N, in]")
        check.equal(
            x[-1],
            w[1],
            f"input has {x[-1]} features but weight expects {w[1]}",
            "make weight's dim 1 the input features",
        )
        if "bias" in shapes:
            check.require(len(shapes["bias"]) == 1, "bias must be 1-d [out]", "give bias the shape [out]")
            check.equal(
                shapes["bias"][0],
                w[0],
                f"bias has {shapes['bias'][0]} entries but weight has {w[0]} outputs",
                "give bias the shape [out]",
            )
        return (*x[:-1], w[0])

    def forward(self, node):
        operands = [node.operands["input"], node.operands["weight"]] + (
            [node.operands["bias"]] if "bias" in node.operands else []
        )
        return Forward(op("linear", *operands))

    def pullback(self, node: NodeSymbols, grad, wanted):
        """Over [N, in] (or more leading dims, seen as [N, in] as autograd's mm backward sees them: the
        gradient flattened once, a copy where it is strided, which every gradient reads: ``sympy.cse``
        names it once): ``grad @ W``, ``grad.T @ x`` and ``grad.sum(0)``, each one ``mm`` or ``sum``. With
        more dims ``F.linear`` takes one of two paths by the input's layout at run time (Linear.cpp): a
        contiguous input with a bias, one ``addmm`` on it flattened; another, ``matmul`` (the input folded
        to [N, in] by ``reshape``, a copy where it is strided) then ``add_(bias)``, whose bias gradient
        sums the gradient over its leading dims as laid out; in both, a column-major folded input has its
        gradient computed transposed (``mm_mat1_backward``). The helpers make the same choices."""
        grads = {}
        x, weight = node.operands["input"], node.operands["weight"]
        rank = len(node.shapes["input"])
        # under autocast the products cast the gradient to its lower precision: once, here, for all three
        flat = grad if rank == 2 else op("flatten", op("in_autocast_dtype", grad), end_dim=-2)
        # the input as F.linear folds it: read by the weight's gradient and, for its layout, by the input's
        inputs = x if rank == 2 else op("flatten", x, end_dim=-2)
        if "input" in wanted:
            product = (
                op("matmul", grad, weight, two_d=True)
                if rank == 2
                else op("linear_input_grad", flat, weight, x, inputs)
                if "weight" in wanted
                else op(
                    "linear_frozen_input_grad",
                    flat,
                    weight,
                    x,
                    x,
                    op("in_autocast_dtype", grad),
                    bias="bias" in node.operands,
                )
            )
            grads["input"] = in_operands_dtype(product, x, read_anyway="weight" in wanted)
        if "weight" in wanted:
            grads["weight"] = op("linear_weight_grad", flat, inputs)
        if "bias" in wanted:
            grads["bias"] = (
                op("sum", flat, dim=(0,))
                if rank == 2
                else op("linear_bias_grad", flat, op("in_autocast_dtype", grad), x)
            )
        return grads

    def per_sample_pullback(self, node: NodeSymbols, grad, operand: str):
        rank = len(node.shapes["input"])
        if operand == "weight":
            return op("linear_weight_grad_per_sample", grad, node.operands["input"], rank=rank)
        if operand == "bias":
            return op("sum", grad, dim=tuple(range(1, rank - 1))) if rank > 2 else grad
        return None

    def table_row(self):
        return (
            self.op,
            "out = input @ weight.T + bias",
            "grad_input = grad_out @ weight; grad_weight = grad_out.T @ input (over all leading dims); grad_bias = sum of grad_out",
        )


class MatMul(Rule):
    op = "matmul"
    calls = ("matmul", "__matmul__", "mm", "bmm")
    operands = (Operand("input", from_in=True), Operand("other", from_in=True))
    linear_in = ("input", "other")
    summary = "matrix product of the last two dims, batch dims broadcast"

    def infer_shape(self, shapes, params, check: Checker):
        a, b = shapes["input"], shapes["other"]
        check.require(
            len(a) >= 2 and len(b) >= 2, "matmul of vectors is not supported yet", "give both operands >= 2 dims"
        )
        check.equal(
            a[-1],
            b[-2],
            f"inner sizes {a[-1]} and {b[-2]} differ",
            "make input's last dim equal other's second-to-last",
        )
        rank = max(len(a), len(b)) - 2  # batch dims broadcast as elementwise ops' dims do
        left, right = (1,) * (rank + 2 - len(a)) + tuple(a[:-2]), (1,) * (rank + 2 - len(b)) + tuple(b[:-2])
        batch = []
        for axis, (x, y) in enumerate(zip(left, right)):
            if check.symbolic:
                check.equal(x, y, "", "")  # the solver keeps the batch dims equal
                batch.append(x)
                continue
            check.require(
                x == y or x == 1 or y == 1,
                f"batch dims {tuple(a[:-2])} and {tuple(b[:-2])} do not broadcast (axis {axis}: {x} vs {y})",
                "make the batch sizes equal, or 1 on one side",
            )
            batch.append(max(x, y))
        return (*batch, a[-2], b[-1])

    def forward(self, node):
        return Forward(op("matmul", node.operands["input"], node.operands["other"]))

    def pullback(self, node: NodeSymbols, grad, wanted):
        grads = {}
        two_d = {"two_d": True} if len(node.shapes["input"]) == len(node.shapes["other"]) == 2 else {}
        if "input" in wanted:
            gradient = self._unbroadcast(
                node, "input", op("matmul_transposed", grad, node.operands["other"], which="right", **two_d)
            )
            grads["input"] = in_operands_dtype(gradient, node.operands["input"], read_anyway="other" in wanted)
        if "other" in wanted:
            gradient = self._unbroadcast(
                node, "other", op("matmul_transposed", node.operands["input"], grad, which="left", **two_d)
            )
            grads["other"] = in_operands_dtype(gradient, node.operands["other"], read_anyway="input" in wanted)
        return grads

    @staticmethod
    def _unbroadcast(node: NodeSymbols, operand: str, gradient):
        """Summed back to the operand's run-time shape where its batch dims may have been broadcast (fewer
        dims than the output's, or a size 1): the batch dims alone, not the matrix dims, decide."""
        batch = node.shapes[operand][:-2]
        if len(batch) < len(node.out_shape) - 2 or 1 in batch:
            return op("sum_to_size", gradient, node.operands[operand])
        return gradient

    def table_row(self):
        return self.op, "out = input @ other", "grad_input = grad_out @ other^T; grad_other = input^T @ grad_out"


RULES = [Linear(), MatMul()]


CERTIFICATES = [  # (label, input shapes, layer, linear operands): `symgrad certify` proves each adjoint exact
    ("linear", {"x": (2, 3), "w": (2, 3)}, {"op": "linear", "weight": "w"}, ("x", "w")),
    ("matmul", {"x": (2, 2, 3), "v": (2, 3, 2)}, {"op": "matmul", "in": ["x", "v"]}, ("x", "v")),
    ("matmul (batch dims broadcast)", {"x": (2, 2, 2, 3), "v": (3, 2)}, {"op": "matmul", "in": ["x", "v"]}, ("x", "v")),
]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "linear": [
        Sample(
            "linear-bias",
            {"x": [4, 5], "w": [3, 5], "b": [3], "y": [4, 3]},
            [{"op": "linear", "weight": "w", "bias": "b", "out": "out"}],
            ["x", "w", "b"],
        ),
        Sample(
            "linear-rank3",
            {"x": [2, 4, 5], "w": [3, 5], "y": [2, 4, 3]},
            [{"op": "linear", "weight": "w", "out": "out"}],
            ["x", "w"],
        ),
    ],
    "matmul": [
        Sample(
            "matmul-batched",
            {"a": [2, 3, 4], "b": [2, 4, 5], "y": [2, 3, 5]},
            [{"op": "matmul", "in": ["a", "b"], "out": "out"}],
            ["a", "b"],
        ),
        Sample(
            "matmul-broadcast-rank",
            {"a": [2, 3, 4, 5], "b": [5, 3], "y": [2, 3, 4, 3]},
            [{"op": "matmul", "in": ["a", "b"], "out": "out"}],
            ["a", "b"],
        ),
        Sample(
            "matmul-broadcast-size-1",
            {"a": [2, 1, 3, 4], "b": [3, 4, 2], "y": [2, 3, 3, 2]},
            [{"op": "matmul", "in": ["a", "b"], "out": "out"}],
            ["a", "b"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "linear": [
        Spelling("nn.Linear(8, 5)", {"x": (2, 3, 8)}, module=True),
    ],
    "matmul": [
        Spelling("x @ y", {"x": (3, 4), "y": (4, 5)}),
        Spelling("torch.bmm(x, y)", {"x": (2, 3, 4), "y": (2, 4, 5)}),
        # batch dims broadcast
        Spelling("x @ y.transpose(-2, -1)", {"x": (2, 2, 3, 4), "y": (5, 4)}),
    ],
}
