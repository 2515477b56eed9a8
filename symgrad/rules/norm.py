"""Normalisations: layer_norm here, and the formula and helpers batch_norm (``norm_batch.py``),
group_norm (``norm_group.py``) and instance_norm (``norm_instance.py``) share.

All three normalise over a set of dims D (layer: the trailing ``normalized_shape``; batch: the
batch and spatial dims, per channel; group: each group's channels and space)::

    mu = mean_D(x),  rstd = 1 / sqrt(mean_D((x - mu)^2) + eps),  xhat = (x - mu) * rstd
    out = xhat * weight + bias

Differentiating ``xhat`` through ``mu`` and ``rstd`` gives the one formula all three share, with
``ghat = grad * weight``::

    grad_x = rstd * (ghat - mean_D(ghat) - xhat * mean_D(ghat * xhat))

``grad_weight`` and ``grad_bias`` sum ``grad * xhat`` and ``grad`` over every dim but the weight's.
In eval mode batch_norm uses fixed running statistics, so it is affine in x:
``grad_x = grad * weight * rstd``.
"""

from __future__ import annotations

import sympy

from ..algebra import LINEAR, op, primitive, tensor
from ..spec_values import Like
from .base import (
    Checker,
    Forward,
    NodeSymbols,
    Operand,
    Param,
    ParamContext,
    Rule,
    Sample,
    Spelling,
    number,
    positive_number,
)
from .norm_helpers import (
    BATCH_NORM_AGAIN,
    BATCH_NORM_BACKWARD,
    GROUP_NORM,
    GROUP_NORM_BACKWARD,
    INSTANCE_NORM,
    INSTANCE_NORM_BACKWARD,
    LAYER_NORM_BACKWARD,
)

primitive(
    "mean_keep",
    code=lambda operands, params, show: (
        f"{operands[0]}.mean(dim={params['dims'][0] if len(params['dims']) == 1 else params['dims']}, keepdim=True)"
    ),
    latex=lambda operands, params, show: rf"\operatorname{{mean}}_{{D}}\left({operands[0]}\right)",
    tangent=LINEAR,
)
primitive(
    "channel_view",
    code=lambda operands, params, show: f"{operands[0]}.reshape(-1{', 1' * params['trailing']})",
    latex=lambda operands, params, show: operands[0],
    tangent=LINEAR,
)
primitive(
    "group_view",
    code=lambda operands, params, show: f"{operands[0]}.unflatten(1, ({params['groups']}, -1))",
    latex=lambda operands, params, show: operands[0],
    tangent=LINEAR,
)
primitive(
    "group_unview",
    code=lambda operands, params, show: f"{operands[0]}.flatten(1, 2)",
    latex=lambda operands, params, show: operands[0],
    tangent=LINEAR,
)


def _normalize(x, dims, eps):
    centered = x - op("mean_keep", x, dims=dims)
    return centered * (op("mean_keep", centered**2, dims=dims) + eps) ** sympy.Rational(-1, 2)


def _expand(name: str, named: dict, params) -> sympy.Expr:
    """The op as a formula in primitives: what forward mode differentiates (the code calls F.<name>)."""
    x = named["input"]
    rank = params["rank"]
    view = lambda value: op("channel_view", value, trailing=rank - 2)  # noqa: E731
    if name == "layer_norm":
        out = _normalize(x, tuple(range(rank - len(params["normalized_shape"]), rank)), params["eps"])
        scale, shift = named.get("weight"), named.get("bias")
    elif name == "group_norm":
        grouped = op("group_view", x, groups=params["num_groups"])
        out = op("group_unview", _normalize(grouped, tuple(range(2, rank + 1)), params["eps"]))
        scale, shift = [view(named[k]) if k in named else None for k in ("weight", "bias")]
    elif name == "instance_norm" and params["use_input_stats"]:
        out = _normalize(x, tuple(range(2, rank)), params["eps"])
        scale, shift = [view(named[k]) if k in named else None for k in ("weight", "bias")]
    elif params.get("training"):
        out = _normalize(x, (0,) + tuple(range(2, rank)), params["eps"])
        scale, shift = [view(named[k]) if k in named else None for k in ("weight", "bias")]
    else:
        out = (x - view(named["running_mean"])) * (view(named["running_var"]) + params["eps"]) ** sympy.Rational(-1, 2)
        scale, shift = [view(named[k]) if k in named else None for k in ("weight", "bias")]
    out = out * scale if scale is not None else out
    return out + shift if shift is not None else out


FUNCTIONAL_DEFAULTS = {"eps": 1e-05, "momentum": 0.1}
"""What ``F.batch_norm``, ``F.layer_norm`` and ``F.group_norm`` take when an argument is left out."""


def _is_functional_default(key: str, value) -> bool:
    return (
        key in FUNCTIONAL_DEFAULTS
        and not isinstance(value, bool)
        and value is not None
        and (float(value) == FUNCTIONAL_DEFAULTS[key])
    )


def _shown(value, show) -> str:
    if isinstance(value, sympy.Basic):
        return show(value)
    if isinstance(value, (list, tuple)) and any(isinstance(item, sympy.Basic) for item in value):
        return show_sizes(value, show)
    return repr(value)


def _call(name: str, fields: tuple[str, ...]):
    def tangent(expr, walk):
        return walk(_expand(name, dict(zip(expr.params["operand_names"], expr.operands)), expr.params))

    def code(operands, params, show):
        named = dict(zip(params["operand_names"], operands))
        if name == "batch_norm":  # as nn.BatchNorm calls it: the tensors positionally, the statistics even as None
            last = max(index for index, key in enumerate(fields) if key in named or index < 2)
            arguments = [named["input"]] + [named.get(key, "None") for key in fields[: last + 1]]
        else:
            arguments = [named["input"]] + [f"{key}={named[key]}" for key in fields if key in named]
        arguments += [
            f"{key}={_shown(params[key], show)}"
            for key in params["shown"]
            if not _is_functional_default(key, params[key])
        ]
        return f"F.{name}({', '.join(arguments)})"

    primitive(
        name,
        code=code,
        latex=lambda operands, params, show: (
            rf"\operatorname{{{name.replace('_', chr(92) + '_')}}}\left({operands[0]}\right)"
        ),
        tangent=tangent,
        fresh=True,
    )


_call("layer_norm", ("weight", "bias"))
_call("batch_norm", ("running_mean", "running_var", "weight", "bias"))
_call("group_norm", ("weight", "bias"))
_call("instance_norm", ("running_mean", "running_var", "weight", "bias"))


NATIVE_ORDER = ("input", "weight", "bias", "running_mean", "running_var")
"""``torch.native_batch_norm``'s tensor arguments, in its order."""


def _native_code(operands, params, show):
    named = dict(zip(params["operand_names"], operands))
    arguments = ", ".join(named.get(name, "None") for name in NATIVE_ORDER)
    return f"torch.native_batch_norm({arguments}, True, {show(params['momentum'])}, {show(params['eps'])})"


def _native_layer_norm_code(operands, params, show):
    named = dict(zip(params["operand_names"], operands))
    return (
        f"torch.native_layer_norm({named['input']}, {show_sizes(params['normalized_shape'], show)}, "
        f"{named.get('weight', 'None')}, {named.get('bias', 'None')}, {show(params['eps'])})"
    )


primitive(
    "native_layer_norm",
    code=_native_layer_norm_code,
    outputs=3,
    fresh=True,
    latex=lambda operands, params, show: rf"\operatorname{{layer\_norm}}\left({operands[0]}\right)",
)


def _group_norm_code(operands, params, show):
    named = dict(zip(params["operand_names"], operands))
    eps = "" if float(params["eps"]) == 1e-05 else f", eps={show(params['eps'])}"
    return (
        f"_group_norm({named['input']}, {named.get('weight', 'None')}, {named.get('bias', 'None')}, "
        f"{params['num_groups']}{eps})"
    )


primitive(
    "native_group_norm",
    code=_group_norm_code,
    outputs=3,
    fresh=True,
    helper=GROUP_NORM,
    latex=lambda operands, params, show: rf"\operatorname{{group\_norm}}\left({operands[0]}\right)",
)


def _instance_norm_code(operands, params, show):
    named = dict(zip(params["operand_names"], operands))
    eps = "" if float(params["eps"]) == 1e-05 else f", eps={show(params['eps'])}"
    return f"_instance_norm({named['input']}, {named.get('weight', 'None')}, {named.get('bias', 'None')}{eps})"


primitive(
    "native_instance_norm",
    code=_instance_norm_code,
    outputs=3,
    fresh=True,
    helper=INSTANCE_NORM,
    latex=lambda operands, params, show: rf"\operatorname{{instance\_norm}}\left({operands[0]}\right)",
)
primitive(
    "native_batch_norm",
    code=_native_code,
    outputs=3,
    fresh=True,
    latex=lambda operands, params, show: rf"\operatorname{{batch\_norm}}\left({operands[0]}\right)",
)


def _again_code(operands, params, show):
    """``_batch_norm_again(x, weight, bias, mean, invstd)``: the forward's output made again."""
    named = dict(zip(params["operand_names"], operands))
    eps = "" if float(params["eps"]) == 1e-05 else f", eps={show(params['eps'])}"
    affine = f"{named.get('weight', 'None')}, {named.get('bias', 'None')}"
    return f"_batch_norm_again({named['input']}, {affine}, {named['mean']}, {named['invstd']}{eps})"


primitive(
    "batch_norm_again",
    code=_again_code,
    helper=BATCH_NORM_AGAIN,
    fresh=True,
    latex=lambda operands, params, show: rf"\operatorname{{batch\_norm}}\left({operands[0]}\right)",
)


def _batch_norm_backward_code(operands, params, show):
    """``_batch_norm_backward(grad, x, weight, mean, invstd)``, eps and the mask where they are not
    the defaults (1e-05, every gradient)."""
    weight = operands[2] if params["weighted"] else "None"
    extra = "" if float(params["eps"]) == 1e-05 else f", eps={show(params['eps'])}"
    if not all(params["output_mask"]):
        extra += f", output_mask={list(params['output_mask'])}"
    return f"_batch_norm_backward({operands[0]}, {operands[1]}, {weight}, {operands[-2]}, {operands[-1]}{extra})"


primitive(
    "batch_norm_backward",
    helper=BATCH_NORM_BACKWARD,
    outputs=3,
    fresh=True,
    code=_batch_norm_backward_code,
    latex=lambda operands, params, show: rf"\operatorname{{bn\_backward}}\left({', '.join(operands)}\right)",
)


def _norm_backward_code(name: str):
    """``_group_norm_backward(grad, x, weight, groups, mean, rstd)`` and ``_layer_norm_backward(grad,
    x, shape, weight, bias, mean, rstd)``: eps and the mask where they are not the defaults (1e-05,
    every gradient)."""

    def code(operands, params, show):
        named = dict(zip(params["operand_names"], operands))
        weight, bias = named.get("weight", "None"), named.get("bias", "None")
        if name == "group_norm":
            # instance_norm's forward with running statistics (F.instance_norm) keeps none: None, computed again
            arguments = [
                named["grad"],
                named["input"],
                weight,
                str(params["num_groups"]),
                named.get("mean", "None"),
                named.get("rstd", "None"),
            ]
        elif name == "instance_norm":
            arguments = [named["grad"], named["input"], weight, named["mean"], named["rstd"]]
        else:
            arguments = [
                named["grad"],
                named["input"],
                show_sizes(params["normalized_shape"], show),
                weight,
                bias,
                named["mean"],
                named["rstd"],
            ]
        if float(params["eps"]) != 1e-05:
            arguments.append(f"eps={show(params['eps'])}")
        if not all(params["output_mask"]):
            arguments.append(f"output_mask={list(params['output_mask'])}")
        return f"_{name}_backward({', '.join(arguments)})"

    return code


for _name, _helper in (
    ("group_norm", GROUP_NORM_BACKWARD),
    ("layer_norm", LAYER_NORM_BACKWARD),
    ("instance_norm", INSTANCE_NORM_BACKWARD),
):
    primitive(
        f"{_name}_backward",
        helper=_helper,
        outputs=3,
        fresh=True,
        code=_norm_backward_code(_name),
        latex=lambda operands, params, show, _name=_name: (
            rf"\operatorname{{{_name.replace('_', chr(92) + '_')}\_backward}}\left({', '.join(operands)}\right)"
        ),
    )


def fused_norm_pullback(node, grad, wanted, name: str, statistics: tuple = (), **params):
    """Every wanted gradient of a group_norm, layer_norm or instance_norm from one call of autograd's own
    backward kernel: the readable formula of :func:`normalized_pullback` in fewer passes over memory
    (``statistics``: the locals the forward kept for it, :meth:`Norm._native_forward`'s; none for
    an instance_norm with running statistics)."""
    names = ("input", "weight", "bias")
    unsupported = wanted - set(names)
    if unsupported:
        raise NotImplementedError(f"gradients of {name}'s {sorted(unsupported)} are not derived")
    present = ("grad", "input") + tuple(key for key in ("weight", "bias") if key in node.operands)
    operands = [
        grad,
        *(node.operands[key] for key in present[1:]),
        *(tensor(f"{kind}_{node.name}") for kind in statistics),
    ]
    together = " and ".join(key for key in names if key in wanted)
    fused = node.local(
        "local",
        op(
            f"{name}_backward",
            *operands,
            operand_names=present + statistics,
            eps=node.params["eps"],
            output_mask=tuple(key in wanted for key in names),
            **params,
        ),
        note=f"{node.name}'s {together} gradients in one native_{name}_backward call "
        "(autograd's own kernel; twice differentiable)",
    )
    return {key: op("item", fused, index=index) for index, key in enumerate(names) if key in wanted}


def flag(value, context: ParamContext):
    if not isinstance(value, bool):
        raise context.fail(f"must be true or false, not {value!r}", "write `training: true`")
    return value


def normalized_pullback(node: NodeSymbols, x_view, grad_view, dims, weight_view):
    """The shared formula; ``*_view`` are x and grad seen with the normalised dims in ``dims``."""
    eps = node.params["eps"]
    centered = node.local("centered", x_view - op("mean_keep", x_view, dims=dims))
    rstd = node.local("rstd", (op("mean_keep", centered**2, dims=dims) + eps) ** sympy.Rational(-1, 2))
    xhat = node.local("xhat", centered * rstd)
    ghat = grad_view * weight_view if weight_view is not None else grad_view
    ghat = node.local("ghat", ghat) if weight_view is not None else ghat
    grad_x = rstd * (ghat - op("mean_keep", ghat, dims=dims) - xhat * op("mean_keep", ghat * xhat, dims=dims))
    return grad_x, xhat


def momentum_param(value, context: ParamContext):
    """How far a training-mode step moves the running statistics, 0 to 1; ``null`` is nn.BatchNorm's
    ``momentum=None``, a cumulative average, which needs the count of batches seen (``symgrad.bind``
    keeps it): the statistics arguments then receive the batch's own statistics (momentum 1)."""
    if value is None:
        return None
    momentum = number(value, context)
    if not 0 <= momentum <= 1:
        raise context.fail(
            f"is {value!r}, outside 0 to 1", "use a momentum between 0 and 1, or null for a cumulative average"
        )
    return momentum


def check_per_channel(shapes, x, check) -> None:
    """batch_norm's and instance_norm's running statistics and affine parameters: one entry per channel."""
    for name in ("running_mean", "running_var", "weight", "bias"):
        if name in shapes:
            check.require(len(shapes[name]) == 1, f"{name} must be 1-d [C]", "give it the shape [C]")
            check.equal(
                shapes[name][0],
                x[1],
                f"{name} has {shapes[name][0]} entries but the input has {x[1]} channels",
                "give it the shape [C]",
            )


class Norm(Rule):
    linear_in = ()

    def _forward_params(self, node: NodeSymbols, shown: tuple[str, ...]):
        names = [name for name in ("input", "running_mean", "running_var", "weight", "bias") if name in node.operands]
        params = {key: node.params[key] for key in node.params if key != "momentum"}
        return names, dict(operand_names=tuple(names), shown=shown, rank=len(node.shapes["input"]), **params)

    def _native_forward(self, node, value, native: str, **params) -> Forward:
        """``value`` (the functional call), or where the derivation is fused the native kernel ``native``,
        whose mean and 1 / std the fused pullback reads (``mean_<node>``, ``rstd_<node>``), as autograd
        keeps them, instead of computing them again: layer_norm's, group_norm's and instance_norm's."""
        if not node.fused:
            return Forward(value)
        present = tuple(name for name in ("input", "weight", "bias") if name in node.operands)
        kernel = node.local(
            "native",
            op(
                native,
                *(node.operands[name] for name in present),
                operand_names=present,
                eps=node.params["eps"],
                **params,
            ),
            note=f"{node.name} with the statistics its gradient reads",
        )
        node.local("mean", op("item", kernel, index=1), note=f"{node.name}'s mean")
        node.local("rstd", op("item", kernel, index=2), note=f"{node.name}'s 1 / std")
        return Forward(op("item", kernel, index=0), math=value)

    def _affine_grads(self, node, grad, xhat, wanted, sum_dims, unview=lambda e: e):
        grads = {}
        if "weight" in wanted:
            grads["weight"] = op("sum", grad * unview(xhat), dim=sum_dims)
        if "bias" in wanted:
            grads["bias"] = op("sum", grad, dim=sum_dims)
        return grads


def _trailing_sizes(value, context: ParamContext) -> tuple:
    """``normalized_shape``: ints, or entries ``{like: x, dims: [-1]}``, the input's trailing sizes read
    at run time (in a block whose instances differ in width: ``Rule.sizes_read``)."""
    values = tuple(value) if isinstance(value, list) else (value,)
    for item in values:
        if isinstance(item, Like) and (item.dims is None or len(item.dims) != 1 or item.size is not None):
            raise context.fail(f"reads one size per entry, not {item}", "write e.g. `[{like: NODE, dims: [-1]}]`")
    return tuple(item.size_at(position) if isinstance(item, Like) else item for position, item in enumerate(values))


def show_sizes(sizes, show) -> str:
    """``[8]``, or ``[x.shape[3]]`` where a size is read at run time."""
    return "[" + ", ".join(show(size) if isinstance(size, sympy.Basic) else str(size) for size in sizes) + "]"


class LayerNorm(Norm):
    op = "layer_norm"
    calls = ("layer_norm",)
    operand_roles = {"weight": "scale", "bias": "shift"}
    operands = (Operand("input", from_in=True), Operand("weight", optional=True), Operand("bias", optional=True))
    params = {
        "normalized_shape": Param(None, _trailing_sizes),
        "eps": Param(1e-5, positive_number),
    }
    sizes_read = {"normalized_shape": ("input", None)}
    summary = "normalise over the trailing normalized_shape dims, then scale and shift"

    def infer_shape(self, shapes, params, check: Checker):
        x, tail = shapes["input"], params["normalized_shape"]
        check.require(
            len(tail) < len(x), f"normalized_shape {list(tail)} must leave a leading dim", "normalise fewer dims"
        )
        for a, b in zip(x[len(x) - len(tail) :], tail):
            check.equal(
                a,
                b,
                f"the input's trailing dims {tuple(x[len(x) - len(tail) :])} are not normalized_shape {tuple(tail)}",
                "make normalized_shape the input's trailing sizes",
            )
        for name in ("weight", "bias"):
            if name in shapes:
                check.require(
                    len(shapes[name]) == len(tail), f"{name} must have the shape normalized_shape", "fix its shape"
                )
                for a, b in zip(shapes[name], tail):
                    check.equal(a, b, f"{name} must have the shape normalized_shape {tuple(tail)}", "fix its shape")
        return tuple(x)

    def forward(self, node):
        names, params = self._forward_params(node, ("normalized_shape", "eps"))
        params["normalized_shape"] = list(node.params["normalized_shape"])
        value = op("layer_norm", *(node.operands[name] for name in names), **params)
        return self._native_forward(node, value, "native_layer_norm", normalized_shape=params["normalized_shape"])

    def pullback(self, node, grad, wanted):
        if node.fused:
            return fused_norm_pullback(
                node,
                grad,
                wanted,
                "layer_norm",
                statistics=("mean", "rstd"),
                normalized_shape=tuple(node.params["normalized_shape"]),
            )
        rank, count = len(node.shapes["input"]), len(node.params["normalized_shape"])
        dims = tuple(range(rank - count, rank))
        grad_x, xhat = normalized_pullback(node, node.operands["input"], grad, dims, node.operands.get("weight"))
        grads = self._affine_grads(node, grad, xhat, wanted, tuple(range(rank - count)))
        if "input" in wanted:
            grads["input"] = grad_x
        return grads

    def table_row(self):
        return (
            self.op,
            "out = (x - mean) / sqrt(var + eps) * weight + bias over the trailing dims",
            "grad_x = rstd (ĝ - mean ĝ - x̂ mean(ĝ x̂)), ĝ = grad * weight; grad_weight = Σ grad x̂; grad_bias = Σ grad",
        )


RULES = [LayerNorm()]
"""batch_norm (``norm_batch.py``), group_norm (``norm_group.py``) and instance_norm
(``norm_instance.py``) reuse the helpers here."""


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "layer_norm": [
        Sample(
            "layer_norm-affine",
            {"x": [3, 2, 5], "w": [5], "b": [5], "y": [3, 2, 5]},
            [{"op": "layer_norm", "weight": "w", "bias": "b", "normalized_shape": [5]}],
            ["x", "w", "b"],
        ),
        Sample(
            "layer_norm-two-dims",
            {"x": [2, 3, 4], "y": [2, 3, 4]},
            [{"op": "layer_norm", "normalized_shape": [3, 4], "eps": 0.001}],
            ["x"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "layer_norm": [
        Spelling("nn.LayerNorm([8, 8])", module=True),
    ],
}
