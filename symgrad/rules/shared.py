"""Tensor primitives that several rules and the reverse walk use: sums over dims, sums back to a
broadcast operand's shape, zeros, one entry of a tuple; and the tangent of an op affine in its input,
weight and bias (conv, conv_transpose, linear). Each rule's own primitives (a convolution's backward,
a pool's scatter) stay beside that rule.
"""

from __future__ import annotations

import sympy

from ..algebra import CONSTANT, LINEAR, TensorOp, op, primitive


def in_operands_dtype(gradient, operand, read_anyway: bool):
    """``gradient`` cast to ``operand``'s dtype, as autograd's engine casts an input's gradient (under
    autocast a product runs in a lower precision than a float32 operand: what is summed after it is
    then summed in float32), where the backward reads ``operand`` anyway; left as it is where only the
    cast would read it (the forward would keep the whole operand for its dtype). A no-op outside
    autocast."""
    return op("cast_like", gradient, operand) if read_anyway else gradient


def show_dims(dims: tuple[int, ...]) -> str:
    """``1`` for one dim, ``(0, 2, 3)`` for several: as a person writes ``dim=``."""
    return str(dims[0]) if len(dims) == 1 else "(" + ", ".join(map(str, dims)) + ")"


primitive(
    "sum",
    code=lambda operands, params, show: (
        f"{operands[0]}.sum(dim={show_dims(params['dim'])}" + (", keepdim=True)" if params.get("keepdim") else ")")
    ),
    latex=lambda operands, params, show: rf"\sum_{{{','.join(map(str, params['dim']))}}} {operands[0]}",
    tangent=LINEAR,
)

primitive(
    "reduce_dims",
    code=lambda operands, params, show: (
        f"{operands[0]}.{params['how']}(dim={show_dims(params['dims'])}"
        + (", keepdim=True)" if params["keepdim"] else ")")
    ),
    latex=lambda operands, params, show: (
        rf"\operatorname{{{params['how']}}}_{{{','.join(map(str, params['dims']))}}}"
        rf"\left({operands[0]}\right)"
    ),
    tangent=LINEAR,
)


def sum_over(value, dim: int):
    """``value.sum(dim=dim, keepdim=True)``: a sum that broadcasts back against ``value``."""
    return op("reduce_dims", value, how="sum", dims=(dim,), keepdim=True)


primitive(
    "spread",
    code=lambda operands, params, show: (
        operands[0]
        + "".join(f".unsqueeze({d})" for d in ([] if params["keepdim"] else params["dims"]))
        + f".expand_as({operands[1]})"
        + (".contiguous()" if params.get("copy", True) else "")
    ),
    latex=lambda operands, params, show: (
        rf"\operatorname{{spread}}_{{{','.join(map(str, params['dims']))}}}\left({operands[0]}\right)"
    ),
    # linear in the gradient; the second operand gives only its shape
    tangent=lambda expr, tangent_of: op(
        "spread", tangent_of(expr.operands[0]), expr.operands[1], **dict(expr.params.items())
    ),
)

primitive(
    "sum_to_size",
    shape_operands=(1,),
    code=lambda operands, params, show: f"{operands[0]}.sum_to_size({operands[1]})",
    latex=lambda operands, params, show: rf"\operatorname{{unbroadcast}}_{{{operands[1]}}}\left({operands[0]}\right)",
    tangent=lambda expr, tangent_of: TensorOp(
        "sum_to_size", expr.params, tangent_of(expr.operands[0]), expr.operands[1]
    ),
)

# the planner's: a value the backward reads only for its shape is kept as that shape (plan.py)
primitive(
    "shape",
    code=lambda operands, params, show: operands[0],
    shape_operands=(0,),
    latex=lambda operands, params, show: rf"\operatorname{{shape}}\left({operands[0]}\right)",
    tangent=CONSTANT,
)

# the planner's: a value the backward reads only as a kernel's layout operand is kept as its layout, a
# meta tensor (its sizes, strides and dtype, no memory), from which the kernel's caller makes an unset
# tensor so laid out (kept.py, algebra.laid_out): ``empty_strided``, as ``empty_like`` of a meta tensor
# onto a device runs PyTorch's Python reference (about 20 us against 1.5 a call on the CPU)
STAND_IN = '''def _stand_in(layout, device):
    """An unset tensor on ``device`` of ``layout``'s sizes, strides and dtype (a meta tensor)."""
    return torch.empty_strided(layout.shape, layout.stride(), dtype=layout.dtype, device=device)
'''
"""Emitted once into each module that keeps a layout (a kernel is passed ``_stand_in(...)``)."""

primitive(
    "layout",
    tangent=CONSTANT,
    helper=STAND_IN,
    code=lambda operands, params, show: f'{operands[0]}.to("meta")',
    latex=lambda operands, params, show: rf"\operatorname{{layout}}\left({operands[0]}\right)",
)

primitive(
    "zeros_like",
    code=lambda operands, params, show: f"torch.zeros_like({operands[0]})",
    latex=lambda operands, params, show: r"\mathbf{0}",
    tangent=CONSTANT,
)

ADD_INTO = '''def _add_into(fresh, *others):
    """``fresh + others`` as autograd's engine adds: into ``fresh`` (new) where it may."""
    new = (torch.is_grad_enabled() or torch.compiler.is_compiling()
           or torch._C._are_functorch_transforms_active()
           or not all(isinstance(term, torch.Tensor) and term.shape == fresh.shape
                      and term.dtype == fresh.dtype for term in (fresh, *others)))
    for other in others:
        fresh = fresh + other if new else fresh.add_(other)
    return fresh
'''
"""Emitted once into each module with a sum the planner adds into its fresh term
(``lifetimes.added_in_place``); autograd's ``InputBuffer::accumulate`` adds in place on the same terms."""

primitive(
    "add_into",
    helper=ADD_INTO,
    fresh=True,
    tangent=LINEAR,
    code=lambda operands, params, show: f"_add_into({', '.join(operands)})",
    latex=lambda operands, params, show: " + ".join(operands),
)

primitive(
    "item",
    code=lambda operands, params, show: f"{operands[0]}[{params['index']}]",
    latex=lambda operands, params, show: f"{{{operands[0]}}}_{{{params['index']}}}",
    tangent=LINEAR,
)


def affine_tangent(kind: str):
    """op(x, w) + b is bilinear in (x, w) and affine in b: d = op(dx, w, db) + op(x, dw)."""

    def tangent(expr: TensorOp, tangent_of):
        x, w, *bias = expr.operands
        dx, dw = tangent_of(x), tangent_of(w)
        db = tangent_of(bias[0]) if bias else 0
        terms = []
        if dx != 0 or db != 0:
            x_part = dx if dx != 0 else op("zeros_like", x)  # only the bias moves: op(0, w) + db
            terms.append(TensorOp(kind, expr.params, x_part, w, *([db] if db != 0 else [])))
        if dw != 0:
            terms.append(TensorOp(kind, expr.params, x, dw))
        return sum(terms, sympy.Integer(0))

    return tangent
