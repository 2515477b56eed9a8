"""Losses: the scalar-per-element density is a sympy formula; the reduction is ``sum``, ``mean``
or ``per_sample`` (a vector over dim 0, the seed's ``.sum(dim=[1, 2, 3])``).

The gradient the generated code returns is that of the sum of the loss entries, weighted by the
cotangent ``grad_loss`` (ones unless the caller passes one): ``d(sum_n c_n loss_n)/d input``.
"""

from __future__ import annotations

import sympy

from ..algebra import CONSTANT, LINEAR, TensorOp, op, primitive, tensor
from ..printing import to_code
from . import softmax  # noqa: F401 (defines the softmax primitive used here)
from .base import (
    Checker,
    Forward,
    NodeSymbols,
    Operand,
    Param,
    Rule,
    Sample,
    Spelling,
    choice,
    non_negative_number,
    number,
    positive_number,
)
from .loss_helpers import CROSS_ENTROPY_BACKWARD, LOG_SOFTMAX

RESIDUAL = sympy.Symbol("residual", real=True)


def _reduce_code(operands, params, show):
    (value,) = operands
    how, rank = params["how"], params["rank"]
    if how == "mean":
        return f"{value}.mean()"
    if how == "sum":
        return f"{value}.sum()"
    if rank == 1:
        return value
    return f"{value}.sum(dim=({', '.join(str(axis) for axis in range(1, rank))}))"


def _reduce_latex(operands, params, show):
    how = params["how"]
    if how == "per_sample":
        return rf"\left[\sum_{{i}} {{{operands[0]}}}_{{n,i}}\right]_{{n}}"
    return (r"\operatorname{mean}" if how == "mean" else r"\sum") + f" {operands[0]}"


primitive("reduce", code=_reduce_code, latex=_reduce_latex, tangent=LINEAR)
primitive(
    "per_sample_view",
    code=lambda operands, params, show: f"{operands[0]}.reshape(-1{', 1' * (params['rank'] - 1)})",
    latex=lambda operands, params, show: operands[0],
    tangent=LINEAR,
)
primitive(
    "numel",
    code=lambda operands, params, show: f"{operands[0]}.numel()",
    latex=lambda operands, params, show: rf"\lvert {operands[0]} \rvert",
    tangent=CONSTANT,
)


def _cast_tangent(expr, moved):
    """Linear in the value cast; the second operand gives only its dtype (a piecewise-constant
    gradient, l1's sign, moves by nothing)."""
    return moved if moved == 0 else TensorOp("cast_like", expr.params, moved, expr.operands[1])


# autograd's engine casts each gradient to its input's dtype: a float64 target promotes the residual,
# and the prediction's gradient goes back in the prediction's dtype (a no-op where they agree)
primitive(
    "cast_like",
    code=lambda operands, params, show: f"{operands[0]}.to({operands[1]}.dtype)",
    latex=lambda operands, params, show: operands[0],
    tangent=lambda expr, tangent_of: _cast_tangent(expr, tangent_of(expr.operands[0])),
)
primitive(
    "ones_cotangent",
    code=lambda operands, params, show: (
        f"{operands[0]}.new_ones({operands[0]}.shape[0])" if params["per_sample"] else f"{operands[0]}.new_ones(())"
    ),
    latex=lambda operands, params, show: r"\mathbf{1}",
    tangent=CONSTANT,
)


class Loss(Rule):
    """A loss whose value is a reduction of an elementwise density of the residual ``input - target``.

    ``density(residual, **params)`` is a sympy formula; its derivative by ``sympy.diff`` is the
    local gradient. PyTorch's losses default to ``reduction: mean``; ``per_sample`` (sum over all
    but dim 0) is symgrad's addition for the seed's per-sample losses."""

    operands = (Operand("input", from_in=True), Operand("target"))
    is_loss = True
    traced_elsewhere = (
        "0.5 * (prediction - target).pow(2).sum() and its variants: the tracer's "
        "reduction handler reads a scaled sum or mean of squares as this loss"
    )

    def __init__(self, op_name: str, density, summary: str, default_reduction: str = "mean", params=None):
        self.op = op_name
        self.calls = () if op_name == "half_sq_error" else (op_name,)
        self.density_formula = density
        self.summary = summary
        self.params = {"reduction": Param(default_reduction, choice("sum", "mean", "per_sample")), **(params or {})}

    def density(self, params: dict | None = None) -> sympy.Expr:
        """The per-element loss as a formula in the residual r = input - target."""
        values = {key: value for key, value in (params or self._defaults()).items() if key != "reduction"}
        return self.density_formula(RESIDUAL, **values)

    def local_derivative(self, params: dict | None = None) -> sympy.Expr:
        """d density / d r by sympy.diff (kinks as PyTorch takes them: H(0) = 0, no Dirac terms)."""
        derivative = sympy.diff(self.density(params), RESIDUAL).replace(sympy.DiracDelta, lambda *_: sympy.Integer(0))
        return derivative.replace(sympy.Heaviside, lambda argument, *_: sympy.Heaviside(argument, 0))

    def _defaults(self) -> dict:
        return {
            key: number(param.default, None) if isinstance(param.default, (int, float)) else param.default
            for key, param in self.params.items()
        }

    def infer_shape(self, shapes, params, check: Checker):
        prediction, target = shapes["input"], shapes["target"]
        check.require(
            len(prediction) == len(target),
            f"prediction has shape {tuple(prediction)} but target has {len(target)} dimensions",
            "give the target the prediction's shape",
        )
        for a, b in zip(prediction, target):
            check.equal(
                a,
                b,
                f"prediction has shape {tuple(prediction)} but target has shape {tuple(target)}",
                "give the target the prediction's shape",
            )
        return (prediction[0],) if params["reduction"] == "per_sample" else ()

    def forward(self, node: NodeSymbols) -> Forward:
        prediction, target = node.operands["input"], node.operands["target"]
        residual = node.local("residual", prediction - target, plain=True)
        per_element = self.density(node.params).xreplace({RESIDUAL: residual})
        coefficient, rest = per_element.as_coeff_Mul()
        rank = len(node.shapes["input"])
        reduced = coefficient * op("reduce", rest, how=node.params["reduction"], rank=rank)
        return Forward(reduced)

    def cotangent(self, node: NodeSymbols, grad) -> sympy.Expr:
        """The cotangent of the loss, broadcast against one element of the prediction."""
        prediction = node.operands["input"]
        reduction = node.params["reduction"]
        if reduction == "per_sample":
            return op("per_sample_view", grad, rank=len(node.shapes["input"]))
        if reduction == "mean":
            return grad / op("numel", prediction)
        return grad

    def default_cotangent(self, node: NodeSymbols) -> sympy.Expr:
        return op("ones_cotangent", node.operands["input"], per_sample=node.params["reduction"] == "per_sample")

    def pullback(self, node: NodeSymbols, grad, wanted):
        weight = self.cotangent(node, grad)
        residual = tensor("residual")
        grads = {}
        local = self.local_derivative(node.params).xreplace({RESIDUAL: residual})
        for sign, operand in ((1, "input"), (-1, "target")):  # r = input - target
            if operand in wanted:
                grads[operand] = op("cast_like", sign * local * weight, node.operands[operand])
        return grads

    def reference(self, arguments: dict, params: dict):
        """The unreduced loss of each element, by PyTorch's own loss (``check`` reduces it)."""
        import torch.nn.functional as F

        if self.op == "half_sq_error":  # symgrad's own: no PyTorch function
            return 0.5 * (arguments["input"] - arguments["target"]) ** 2
        return getattr(F, self.op)(arguments["input"], arguments["target"], reduction="none", **params)

    def table_row(self):
        return (
            self.op,
            f"loss = reduce({to_code(self.density())}), residual = input - target",
            f"d/dinput = -d/dtarget = {to_code(self.local_derivative())} (times the reduction's weight)",
        )


IGNORE_INDEX = -100
"""The class index ``F.cross_entropy`` and ``F.nll_loss`` skip by default (``ignore_index=-100``): such an
entry adds nothing to the loss, gets a zero gradient, and is not counted by the mean."""

# the class indices as ones in a zero tensor of the scores' shape, dtype, device and layout; scattered
# rather than F.one_hot, which reads the indices' range back to the host (a device sync on a GPU); an
# ignored entry's index is clamped to 0 here, and its row zeroed by the `counted` mask
primitive(
    "one_hot",
    code=lambda operands, params, show: (
        f"torch.zeros_like({operands[1]}).scatter_(1, {operands[0]}.clamp_min(0).unsqueeze(1), 1)"
    ),
    latex=lambda operands, params, show: rf"\mathbf{{1}}_{{{operands[0]}}}",
    tangent=CONSTANT,
)
# 1 where a class index is counted (not ignore_index), 0 where ignored: [N, 1, ...] in the scores' dtype
primitive(
    "counted",
    code=lambda operands, params, show: f"({operands[0]} != {IGNORE_INDEX}).unsqueeze(1).to({operands[1]}.dtype)",
    latex=lambda operands, params, show: rf"\mathbb{{1}}[{operands[0]} \neq {IGNORE_INDEX}]",
    tangent=CONSTANT,
)
# how many class indices the mean averages over: those that are not ignore_index
primitive(
    "count_counted",
    code=lambda operands, params, show: f"({operands[0]} != {IGNORE_INDEX}).sum()",
    latex=lambda operands, params, show: rf"\lvert {operands[0]} \neq {IGNORE_INDEX} \rvert",
    tangent=CONSTANT,
)
primitive(
    "class_loss",
    code=lambda operands, params, show: (
        f"F.{params['function']}({operands[0]}, {operands[1]}"
        + (
            f", reduction={params['how']!r})"
            if params["how"] != "per_sample"
            else ", reduction='none')"
            + (f".sum(dim={tuple(range(1, params['rank'] - 1))})" if params["rank"] > 2 else "")
        )
    ),
    latex=lambda operands, params, show: (
        rf"\operatorname{{{params['function'].replace('_', chr(92) + '_')}}}\left({operands[0]}, {operands[1]}\right)"
    ),
    tangent=None,
)


# cross_entropy's fused forward: the log-probabilities it keeps for its backward, as autograd keeps them
primitive(
    "class_log_softmax",
    helper=LOG_SOFTMAX,  # not fresh: log_softmax's own backward reads its output
    code=lambda operands, params, show: f"_log_softmax({operands[0]})",
    latex=lambda operands, params, show: rf"\operatorname{{log\,softmax}}_{{1}}\left({operands[0]}\right)",
)


def _cross_entropy_backward_code(operands, params, show):
    """``_cross_entropy_backward(grad, log_probs, target, scores.dtype)``, the reduction where it is not
    the mean (a per-sample loss: ``'none'``, summed)."""
    grad, log_probs, target, scores = operands
    how = {"mean": "", "sum": ", 'sum'", "per_sample": ", 'none'"}[params["how"]]
    return f"_cross_entropy_backward({grad}, {log_probs}, {target}, {scores}.dtype{how})"


# cross_entropy's fused backward: autograd's nll_loss and log_softmax backward kernels; the scores give
# only their dtype (kept as a layout where nothing else reads them: kept.kept_as_layouts)
primitive(
    "cross_entropy_backward",
    helper=CROSS_ENTROPY_BACKWARD,
    fresh=True,
    layout_operands=(3,),
    code=_cross_entropy_backward_code,
    latex=lambda operands, params, show: (
        rf"\operatorname{{softmax}}_{{1}}\left({operands[3]}\right) - \mathbf{{1}}_{{{operands[2]}}}"
    ),
)


class ClassificationLoss(Loss):
    """``cross_entropy`` on logits and ``nll_loss`` on log-probabilities, with int64 class-index
    targets [N, ...] for an input [N, C, ...]. Per sample, cross entropy is ``logsumexp(x) - x[t]``,
    so its local gradient is ``softmax(x) - one_hot(t)``; nll_loss is ``-x[t]``, so ``-one_hot(t)``."""

    class_targets = True

    def __init__(self, op_name: str, summary: str):
        super().__init__(op_name, None, summary)

    def infer_shape(self, shapes, params, check: Checker):
        scores, target = shapes["input"], shapes["target"]
        check.require(
            len(scores) == len(target) + 1 and len(scores) >= 2,
            f"input {tuple(scores)} must be [N, C, ...] with target {tuple(target)} as [N, ...]",
            "give the target the input's shape without the class dim",
        )
        for a, b in zip((scores[0], *scores[2:]), target):
            check.equal(
                a,
                b,
                f"input {tuple(scores)} and target {tuple(target)} differ outside the class dim",
                "give the target the input's shape without the class dim",
            )
        return (scores[0],) if params["reduction"] == "per_sample" else ()

    def _kernels(self, node) -> bool:
        """Derived by autograd's own kernels: cross_entropy's fused derivation."""
        return node.fused and self.op == "cross_entropy"

    def forward(self, node):
        scores, target = node.operands["input"], node.operands["target"]
        how, rank = node.params["reduction"], len(node.shapes["input"])
        value = op("class_loss", scores, target, function=self.op, how=how, rank=rank)
        if not self._kernels(node):
            return Forward(value)
        # as F.cross_entropy runs it (the same kernels: the same loss, bit for bit), keeping the
        # log-probabilities its backward reads, as autograd keeps them
        log_probs = node.local(
            "log_probs", op("class_log_softmax", scores), note=f"{node.name}'s log-probabilities, kept for its backward"
        )
        return Forward(op("class_loss", log_probs, target, function="nll_loss", how=how, rank=rank), math=value)

    def cotangent(self, node, grad):
        reduction = node.params["reduction"]
        if reduction == "per_sample":
            return op("per_sample_view", grad, rank=len(node.shapes["input"]))
        if reduction == "mean":  # PyTorch averages over the target's counted entries (no class weights)
            return grad / op("count_counted", node.operands["target"])
        return grad

    def default_cotangent(self, node):
        """cross_entropy's: ones of the loss's own dtype, as autograd seeds ``loss.backward()`` (float32
        under autocast), read from the loss, so that the scores need not be kept for it."""
        if self.op != "cross_entropy":
            return super().default_cotangent(node)
        return op("ones_cotangent", node.out, per_sample=node.params["reduction"] == "per_sample")

    def pullback(self, node, grad, wanted):
        if "target" in wanted:
            raise NotImplementedError("class indices have no gradient")
        scores, target = node.operands["input"], node.operands["target"]
        if self._kernels(node):
            log_probs = tensor(f"log_probs_{node.name}")
            how, rank = node.params["reduction"], len(node.shapes["input"])  # rank: the helper's parts
            return {"input": op("cross_entropy_backward", grad, log_probs, target, scores, how=how, rank=rank)}
        hot = op("one_hot", target, scores)
        local = op("softmax", scores, dim=1) - hot if self.op == "cross_entropy" else -hot
        return {"input": local * op("counted", target, scores) * self.cotangent(node, grad)}

    def table_row(self):
        derivative = "softmax(input) - one_hot(target)" if self.op == "cross_entropy" else "-one_hot(target)"
        forward = "logsumexp(input) - input[target]" if self.op == "cross_entropy" else "-input[target]"
        return (
            self.op,
            f"loss = reduce({forward}) over [N, ...]",
            f"d/dinput = {derivative} (times the reduction's weight)",
        )


def _inside(r, width):
    """1 where |r| < width (PyTorch's strict inequality), 0 outside."""
    return sympy.Heaviside(width - sympy.Abs(r), 0)


RULES = [
    Loss(
        "half_sq_error",
        lambda r: sympy.Rational(1, 2) * r**2,
        "half the squared error, ½‖input − target‖², reduced by sum, mean or per sample",
        default_reduction="sum",
    ),
    Loss("mse_loss", lambda r: r**2, "squared error, as F.mse_loss"),
    Loss("l1_loss", lambda r: sympy.Abs(r), "absolute error, as F.l1_loss; derivative sign(r), 0 at 0"),
    Loss(
        "smooth_l1_loss",
        lambda r, beta: (
            sympy.Abs(r)
            if beta == 0
            else _inside(r, beta) * r**2 / (2 * beta) + (1 - _inside(r, beta)) * (sympy.Abs(r) - beta / 2)
        ),  # beta 0 is l1_loss, as PyTorch computes it
        "as F.smooth_l1_loss: quadratic inside |r| < beta, linear outside",
        params={"beta": Param(1.0, non_negative_number)},
    ),
    ClassificationLoss("cross_entropy", "as F.cross_entropy on logits [N, C, ...] with int64 class targets"),
    ClassificationLoss("nll_loss", "as F.nll_loss on log-probabilities [N, C, ...] with int64 class targets"),
    Loss(
        "huber_loss",
        lambda r, delta: _inside(r, delta) * r**2 / 2 + (1 - _inside(r, delta)) * delta * (sympy.Abs(r) - delta / 2),
        "as F.huber_loss: quadratic inside |r| < delta, delta-linear outside",
        params={"delta": Param(1.0, positive_number)},
    ),
]


PREDICTION = {"p": (2, 3, 4, 4), "y": (2, 3, 4, 4)}
"""A prediction and its target: what each loss spelling reads."""
LABELLED = {"z": (4, 5), "labels": (4,)}
"""Scores and their int64 class labels."""
SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "half_sq_error": [
        Sample(
            "loss-mean-target-wrt",
            {"p": [3, 2, 4], "y": [3, 2, 4]},
            [],
            ["p", "y"],
            {"op": "half_sq_error", "target": "y", "reduction": "mean", "in": "p"},
        ),
        Sample(
            "loss-per-sample",
            {"p": [3, 2, 4], "y": [3, 2, 4]},
            [],
            ["p", "y"],
            {"op": "half_sq_error", "target": "y", "reduction": "per_sample", "in": "p"},
        ),
    ],
    "mse_loss": [
        Sample(
            "mse_loss-defaults",
            {"p": [3, 2, 4], "y": [3, 2, 4]},
            [],
            ["p", "y"],
            {"op": "mse_loss", "in": "p", "target": "y"},
        ),
        Sample(
            "mse_loss-reduction=sum",
            {"p": [3, 2, 4], "y": [3, 2, 4]},
            [],
            ["p", "y"],
            {"op": "mse_loss", "in": "p", "target": "y", "reduction": "sum"},
        ),
    ],
    "l1_loss": [
        Sample(
            "l1_loss-defaults",
            {"p": [3, 2, 4], "y": [3, 2, 4]},
            [],
            ["p", "y"],
            {"op": "l1_loss", "in": "p", "target": "y"},
        ),
        Sample(
            "l1_loss-reduction=per_sample",
            {"p": [3, 2, 4], "y": [3, 2, 4]},
            [],
            ["p", "y"],
            {"op": "l1_loss", "in": "p", "target": "y", "reduction": "per_sample"},
        ),
    ],
    "smooth_l1_loss": [
        Sample(
            "smooth_l1_loss-defaults",
            {"p": [3, 2, 4], "y": [3, 2, 4]},
            [],
            ["p", "y"],
            {"op": "smooth_l1_loss", "in": "p", "target": "y"},
        ),
        Sample(
            "smooth_l1_loss-beta=0.5-reduction=sum",
            {"p": [3, 2, 4], "y": [3, 2, 4]},
            [],
            ["p", "y"],
            {"op": "smooth_l1_loss", "in": "p", "target": "y", "beta": 0.5, "reduction": "sum"},
        ),
    ],
    "cross_entropy": [
        Sample(
            "cross_entropy-default",
            {"x": [4, 5], "w": [3, 5], "t": {"shape": [4], "dtype": "int64"}},
            [{"op": "linear", "weight": "w", "out": "logits"}],
            ["x", "w"],
            {"op": "cross_entropy", "in": "logits", "target": "t"},
        ),
        Sample(
            "cross_entropy-sum",
            {"x": [4, 5], "w": [3, 5], "t": {"shape": [4], "dtype": "int64"}},
            [{"op": "linear", "weight": "w", "out": "logits"}],
            ["x", "w"],
            {"op": "cross_entropy", "in": "logits", "target": "t", "reduction": "sum"},
        ),
        Sample(
            "cross_entropy-per_sample",
            {"x": [4, 5], "w": [3, 5], "t": {"shape": [4], "dtype": "int64"}},
            [{"op": "linear", "weight": "w", "out": "logits"}],
            ["x", "w"],
            {"op": "cross_entropy", "in": "logits", "target": "t", "reduction": "per_sample"},
        ),
        Sample(
            "cross_entropy-segmentation-per_sample",
            {"x": [2, 3, 4, 5], "w": [4, 3, 1, 1], "t": {"shape": [2, 4, 5], "dtype": "int64"}},
            [{"op": "conv2d", "weight": "w", "out": "scores"}],
            ["x", "w"],
            {"op": "cross_entropy", "in": "scores", "target": "t", "reduction": "per_sample"},
        ),
    ],
    "nll_loss": [
        Sample(
            "nll_loss-default",
            {"x": [4, 5], "w": [3, 5], "t": {"shape": [4], "dtype": "int64"}},
            [{"op": "linear", "weight": "w", "out": "logits"}],
            ["x", "w"],
            {"op": "nll_loss", "in": "logits", "target": "t"},
        ),
        Sample(
            "nll_loss-sum",
            {"x": [4, 5], "w": [3, 5], "t": {"shape": [4], "dtype": "int64"}},
            [{"op": "linear", "weight": "w", "out": "logits"}],
            ["x", "w"],
            {"op": "nll_loss", "in": "logits", "target": "t", "reduction": "sum"},
        ),
        Sample(
            "nll_loss-per_sample",
            {"x": [4, 5], "w": [3, 5], "t": {"shape": [4], "dtype": "int64"}},
            [{"op": "linear", "weight": "w", "out": "logits"}],
            ["x", "w"],
            {"op": "nll_loss", "in": "logits", "target": "t", "reduction": "per_sample"},
        ),
    ],
    "huber_loss": [
        Sample(
            "huber_loss-defaults",
            {"p": [3, 2, 4], "y": [3, 2, 4]},
            [],
            ["p", "y"],
            {"op": "huber_loss", "in": "p", "target": "y"},
        ),
        Sample(
            "huber_loss-delta=2.0-reduction=per_sample",
            {"p": [3, 2, 4], "y": [3, 2, 4]},
            [],
            ["p", "y"],
            {"op": "huber_loss", "in": "p", "target": "y", "delta": 2.0, "reduction": "per_sample"},
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "half_sq_error": [
        Spelling("0.5 * (p - y).pow(2).sum()", PREDICTION, reduction="sum"),
        Spelling("((y - p) ** 2).sum() / 2", PREDICTION, reduction="sum"),
        Spelling("0.5 * torch.sum(torch.square(p - y))", PREDICTION, reduction="sum"),
        Spelling('F.mse_loss(p, y, reduction="sum") * 0.5', PREDICTION, reduction="sum"),
        Spelling("0.5 * ((p - y) ** 2).mean()", PREDICTION, reduction="mean"),
        Spelling("0.5 * (p - y).pow(2).sum(dim=[1, 2, 3])", PREDICTION, reduction="per_sample"),
    ],
    "mse_loss": [
        Spelling("F.mse_loss(p, y)", PREDICTION, reduction="mean"),
        Spelling("nn.MSELoss()(p, y)", PREDICTION, reduction="mean"),
        Spelling("((p - y) ** 2).sum()", PREDICTION, reduction="sum"),
        Spelling('F.mse_loss(p, y, reduction="none").sum(dim=(1, 2, 3))', PREDICTION, reduction="per_sample"),
    ],
    "l1_loss": [
        Spelling("(y - p).abs().mean()", PREDICTION, reduction="mean"),
        Spelling('F.l1_loss(p, y, reduction="sum")', PREDICTION, reduction="sum"),
    ],
    "smooth_l1_loss": [
        Spelling("F.smooth_l1_loss(p, y, beta=0.5)", PREDICTION, reduction="mean"),
    ],
    "cross_entropy": [
        Spelling("F.cross_entropy(z, labels)", LABELLED, dtypes={"labels": "int64"}),
        Spelling('F.nll_loss(F.log_softmax(z, dim=1), labels, reduction="sum")', LABELLED, dtypes={"labels": "int64"}),
    ],
    "nll_loss": [
        # z read as log-probabilities
        Spelling("F.nll_loss(z, labels)", LABELLED, dtypes={"labels": "int64"}),
    ],
    "huber_loss": [
        Spelling('nn.HuberLoss(reduction="sum", delta=0.7)(p, y)', PREDICTION, reduction="sum"),
    ],
}
