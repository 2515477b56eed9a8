"""The largest (or smallest) entry along one dim, with where it is: ``torch.max(x, dim=1, keepdim=True)``,
``x.max(dim=1)``, ``torch.min(x, 1)``, which return ``(values, indices)``. CBAM's spatial attention reads
``torch.max(x, 1, keepdim=True)[0]``, MaxViT-style code ``x.max(dim=-1).values``: only the values flow on,
and they are this op's output. The indices are integers: the tracer refuses them at the line that
computes with them.

Each output is one input entry, the one at the index PyTorch returns (on ties, the one its kernel
picks), so the whole gradient goes to that entry, as autograd's ``value_selecting_reduction_backward``
sends it (not shared among ties, as ``amax``'s is)::

    grad_input = zeros_like(input).scatter(dim, indices, grad)     # grad, indices with keepdim's size-1 dim
"""

from __future__ import annotations

from ..algebra import CONSTANT, op, primitive, tensor
from .base import Checker, Forward, Operand, Param, Rule, Sample, Spelling, boolean, one_dim


def _call(operands, params, what: str) -> str:
    keep = ", keepdim=True" if params["keepdim"] else ""
    return (
        f"{operands[0]}.{params['how']}(dim={params['dim']}{keep})"
        + {"values": ".values", "indices": ".indices", "both": ""}[what]
    )


def _kept(name: str, params) -> str:
    """``name`` with the reduced dim kept (size 1), as scatter and gather read it."""
    return name if params["keepdim"] else f"{name}.unsqueeze({params['dim']})"


primitive(
    "max_dim",
    code=lambda operands, params, show: _call(operands, params, "values"),
    latex=lambda operands, params, show: rf"\{params['how']}_{{{params['dim']}}}\left({operands[0]}\right)",
    # piecewise linear: along dx it moves by dx at the entry the index picks
    tangent=lambda expr, tangent_of: op(
        "take_along",
        tangent_of(expr.operands[0]),
        op("max_dim_indices", expr.operands[0], **dict(expr.params.items())),
        **dict(expr.params.items()),
    ),
)
primitive(
    "max_dim_indices",
    code=lambda operands, params, show: _call(operands, params, "indices"),
    latex=lambda operands, params, show: rf"\operatorname{{arg{params['how']}}}\left({operands[0]}\right)",
    tangent=CONSTANT,
)
primitive(
    "max_dim_with_indices",
    outputs=2,
    code=lambda operands, params, show: _call(operands, params, "both"),
    latex=lambda operands, params, show: rf"\{params['how']}_{{{params['dim']}}}\left({operands[0]}\right)",
)
primitive(
    "take_along",
    code=lambda operands, params, show: (
        f"{operands[0]}.gather({params['dim']}, {_kept(operands[1], params)})"
        + ("" if params["keepdim"] else f".squeeze({params['dim']})")
    ),
    latex=lambda operands, params, show: rf"{operands[0]}\left[{operands[1]}\right]",
    tangent=lambda expr, tangent_of: op(
        "take_along", tangent_of(expr.operands[0]), expr.operands[1], **dict(expr.params.items())
    ),
)
primitive(
    "put_along",
    code=lambda operands, params, show: (
        f"torch.zeros_like({operands[2]}).scatter({params['dim']}, {_kept(operands[1], params)}, "
        f"{_kept(operands[0], params)})"
    ),
    latex=lambda operands, params, show: rf"\operatorname{{scatter}}_{{{operands[1]}}}\left({operands[0]}\right)",
    tangent=lambda expr, tangent_of: op(
        "put_along", tangent_of(expr.operands[0]), *expr.operands[1:], **dict(expr.params.items())
    ),
)


class MaxDim(Rule):
    operands = (Operand("input", from_in=True),)
    params = {"dim": Param(None, one_dim), "keepdim": Param(False, boolean)}
    signature = ("input", "dim", "keepdim")

    def __init__(self, how: str):
        self.how = how
        self.op = how  # the spec's `op: max`, torch.max(input, dim, keepdim)
        self.calls = (how,)
        word = "largest" if how == "max" else "smallest"
        self.summary = (
            f"the {word} entry along dim, torch.{how}(input, dim, keepdim)'s values; the whole gradient "
            "to the index torch returns, as autograd's"
        )

    def reference(self, arguments, params):
        import torch

        return getattr(torch, self.how)(arguments["input"], params["dim"], keepdim=params.get("keepdim", False)).values

    def infer_shape(self, shapes, params, check: Checker):
        x = shapes["input"]
        check.require(
            len(x) >= 1 and -len(x) <= params["dim"] < len(x),
            f"dim {params['dim']} is out of range for a {len(x)}-dim input",
            f"give a dim in {-len(x)}..{len(x) - 1}",
        )
        dim = params["dim"] % len(x)
        return tuple(x[:dim]) + ((1,) if params["keepdim"] else ()) + tuple(x[dim + 1 :])

    def _params(self, node) -> dict:
        return dict(how=self.how, dim=node.params["dim"] % len(node.shapes["input"]), keepdim=node.params["keepdim"])

    def forward(self, node):
        value = op("max_dim", node.operands["input"], **self._params(node))
        if not node.fused:
            return Forward(value)
        # the fused derivation keeps the index the forward finds, instead of searching again in the backward
        both = node.local(
            "found",
            op("max_dim_with_indices", node.operands["input"], **self._params(node)),
            note=f"{node.name} with the indices its gradient reads",
        )
        node.local("indices", op("item", both, index=1), note=f"where {node.name} found its entries")
        return Forward(op("item", both, index=0), math=value)

    def pullback(self, node, grad, wanted):
        x = node.operands["input"]
        params = self._params(node)
        if node.fused:  # named by forward() above, with keepdim as the forward has it
            indices = tensor(f"indices_{node.name}")
        else:  # searched again
            indices = node.local(
                "indices", op("max_dim_indices", x, **params), note=f"where {node.name} found its entries"
            )
        return {"input": op("put_along", grad, indices, x, **params)}

    def table_row(self):
        return (
            self.op,
            f"out = torch.{self.how}(input, dim, keepdim).values",
            "grad_input = zeros_like(input).scatter(dim, indices, grad_out): all of it to the returned index",
        )


RULES = [MaxDim("max"), MaxDim("min")]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "max": [
        Sample(
            "max-channels-keepdim",
            {"x": [2, 3, 4, 5], "y": [2, 1, 4, 5]},
            [{"op": "max", "dim": 1, "keepdim": True, "out": "out"}],
            ["x"],
        ),
        Sample("max-last-dim", {"x": [2, 3, 4], "y": [2, 3]}, [{"op": "max", "dim": -1, "out": "out"}], ["x"]),
    ],
    "min": [
        Sample("min-dim2", {"x": [2, 3, 4, 5], "y": [2, 3, 5]}, [{"op": "min", "dim": 2, "out": "out"}], ["x"]),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "max": [
        # CBAM's spatial attention: torch.max(x, 1, keepdim=True)[0]; MaxViT-style .values;
        # torch.min
        Spelling("torch.cat([torch.mean(x, 1, keepdim=True), torch.max(x, 1, keepdim=True)[0]], dim=1)"),
        Spelling("x.max(dim=-1).values.exp()"),
        Spelling("x.max(1)[0].unsqueeze(1) * x.max(dim=2, keepdim=True).values"),
    ],
    "min": [
        Spelling("torch.min(x, dim=2, keepdim=True)[0] * x"),
        Spelling("x.min(-1).values.sigmoid()"),
    ],
}
