"""Dropout and stochastic depth in training mode: the input times a random mask of kept units.

Every form PyTorch users write draws its mask the same way: an uninitialised tensor of the mask's
shape, ``bernoulli_(keep)`` (``keep = 1 - p``), ``div_(keep)``, then ``input * mask``:

* ``F.dropout`` / ``nn.Dropout`` (on the CPU): a mask of the input's shape (``noise: element``);
* ``F.dropout2d`` / ``F.dropout3d`` / ``nn.Dropout2d/3d``: one entry per sample and channel,
  ``[N, C, 1, 1]`` (``noise: channel``);
* timm's ``drop_path`` (``x.new_empty((N, 1, 1, 1)).bernoulli_(keep)``, ``div_(keep)`` when
  ``scale_by_keep``) and torchvision's ``stochastic_depth(mode="row")``: one per sample (``noise: row``);
* torchvision's ``stochastic_depth(mode="batch")``: one for the whole batch (``noise: batch``).

At p = 0 PyTorch returns the input and draws nothing, and so does the generated code (the mask is ones,
``fill_(1)``; for a block's rate, at run time: the first block of rising drop-path rates at 0).
The generated forward writes the same calls in the module's order, so from the same
``torch.manual_seed`` it draws the same masks as the model; an element mask is drawn in the default
(contiguous) layout, as the model's is, also where the generated code runs its convolutions in
channels_last. A mask the model draws once and uses twice, or uses after another draw, is a node of its
own (``full`` ones, then this op with ``noise: element``), made where the model draws it. The mask is kept for the backward: the
input's gradient is ``grad * mask`` (summed to the input's shape by broadcasting rules: the mask
broadcasts, the input does not). On CUDA, ``F.dropout`` runs a fused kernel that draws otherwise:
there the masks differ from the model's (each is still a valid dropout mask).
"""

from __future__ import annotations

from ..algebra import CONSTANT, primitive, tensor
from .base import Checker, Forward, Operand, Param, ParamContext, Rule, Sample, Spelling, boolean, choice

NOISE_SHAPES = ("element", "channel", "row", "batch")


def _probability(value, context: ParamContext) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise context.fail(
            f"must be a probability in [0, 1), not {value!r}",
            "write the drop probability, e.g. `p: 0.1` (p = 1 drops everything: remove the branch)",
        )
    return value if isinstance(value, float) else float(value)  # a block's hyper stays one (HyperFloat)


def _keep(p) -> str:
    """``1 - p`` printed: the value (as PyTorch computes it, in double precision), or, for a block's
    hyper, the expression of its name, which computes the same double."""
    return f"1 - {p.name}" if hasattr(p, "name") else repr(1 - p)


def _mask_shape(input_name: str, rank: int, noise: str) -> str:
    if noise == "channel":
        sizes = [f"{input_name}.shape[0]", f"{input_name}.shape[1]"] + ["1"] * (rank - 2)
    elif noise == "row":
        sizes = [f"{input_name}.shape[0]"] + ["1"] * (rank - 1)
    else:
        sizes = ["1"] * rank
    return "(" + ", ".join(sizes) + ("," if rank == 1 else "") + ")"


def _noise_code(operands, params, show):
    keep = _keep(params["p"])
    source = operands[0]
    # in the default layout, as the model draws it: where the generated code runs the convolutions in
    # channels_last the input is laid out so, and a mask filled in its memory order would be another
    blank = (
        f"torch.empty_like({source}, memory_format=torch.contiguous_format)"
        if params["noise"] == "element"
        else f"{source}.new_empty({_mask_shape(source, params['rank'], params['noise'])})"
    )
    # p < 1 (``_probability``), so keep > 0: the code is one for every p
    drawn = f"{blank}.bernoulli_({keep})" + (f".div_({keep})" if params["scale"] else "")
    # at p = 0 the model (F.dropout, timm's drop_path) draws nothing and returns its input, so neither
    # does this: the mask is ones; a block's rate decides when it runs (an instance at 0: trace.rate_zero)
    if not hasattr(params["p"], "name"):
        return drawn if params["p"] else f"{blank}.fill_(1)"
    return f"({drawn} if {params['p'].name} else {blank}.fill_(1))"


primitive(
    "dropout_mask",
    code=_noise_code,
    tangent=CONSTANT,  # the mask does not depend on the input's values
    latex=lambda operands, params, show: (
        rf"\operatorname{{Bernoulli}}_{{{_keep(params['p'])}}}\left({operands[0]}\right)"
    ),
)


class Dropout(Rule):
    op = "dropout"
    random = True
    """Its forward draws from torch's random state: a forward re-run in the backward restores it first."""
    operands = (Operand("input", from_in=True),)
    params = {
        "p": Param(0.5, _probability, hyper=True),
        "noise": Param("element", choice(*NOISE_SHAPES)),
        "scale": Param(True, boolean),
    }
    summary = "training-mode dropout or drop path: input * a Bernoulli(1 - p) mask / (1 - p), drawn as torch draws it"
    traced_elsewhere = (
        "the tracer's dropout handler (F.dropout, dropout1d/2d/3d, nn.Dropout*) and its mask "
        "tracking (x.new_empty(shape).bernoulli_(keep).div_(keep) then x * mask: timm's DropPath, "
        "torchvision's StochasticDepth)"
    )

    def infer_shape(self, shapes, params, check: Checker):
        shape = shapes["input"]
        check.require(
            params["noise"] == "element" or len(shape) >= 2,
            f"a {params['noise']} mask needs an input [N, C, ...], not rank {len(shape)}",
            "use `noise: element`",
        )
        return shape

    def forward(self, node):
        source = node.operands["input"]
        from ..algebra import Params, TensorOp

        params = Params.of(
            p=node.params["p"], noise=node.params["noise"], scale=node.params["scale"], rank=len(node.shapes["input"])
        )
        mask = node.local(
            "kept",
            TensorOp("dropout_mask", params, source),
            note=f"the units {node.name} keeps, scaled by 1 / (1 - p), drawn as the model draws them",
        )
        return Forward(source * mask)

    def pullback(self, node, grad, wanted):
        return {"input": grad * tensor(f"kept_{node.name}")}

    def reference(self, arguments, params):
        import torch

        source, keep = arguments["input"], 1 - params["p"]
        if keep == 1:  # p = 0: F.dropout and drop_path return the input, drawing nothing, as the code does
            return source.clone()
        rank = source.dim()
        shape = {
            "element": tuple(source.shape),
            "channel": (*source.shape[:2], *[1] * (rank - 2)),
            "row": (source.shape[0], *[1] * (rank - 1)),
            "batch": (1,) * rank,
        }[params["noise"]]
        mask = torch.empty(shape, dtype=source.dtype, device=source.device).bernoulli_(keep)
        return source * (mask.div_(keep) if params["scale"] and keep > 0 else mask)

    def table_row(self):
        return ("dropout", "y = x * m / (1 - p), m ~ Bernoulli(1 - p)", "dy/dx = m / (1 - p)")


RULES = [Dropout()]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "dropout": [
        Sample("dropout", {"x": [4, 3, 5, 6], "y": [4, 3, 5, 6]}, [{"op": "dropout", "p": 0.3}], ["x"]),
        Sample(
            "dropout2d-channel",
            {"x": [4, 5, 3, 4], "y": [4, 5, 3, 4]},
            [{"op": "dropout", "p": 0.2, "noise": "channel"}],
            ["x"],
        ),
        Sample(
            "drop-path-row-unscaled",
            {"x": [6, 3, 4], "y": [6, 3, 4]},
            [{"op": "dropout", "p": 0.4, "noise": "row", "scale": False}],
            ["x"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "dropout": [
        # in training mode: a mask drawn as the module draws it
        Spelling("nn.Dropout(0.3)", module=True),
        Spelling("F.dropout2d(x, 0.2, training=True)"),
        # timm's drop_path
        Spelling("x * x.new_empty((x.shape[0], 1, 1, 1)).bernoulli_(0.7).div_(0.7)"),
        # stochastic depth, batch
        Spelling("x * torch.empty([1, 1, 1, 1], dtype=x.dtype).bernoulli_(0.9)"),
    ],
}
