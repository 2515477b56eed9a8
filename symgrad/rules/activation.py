"""Activations: relu and its kin, sigmoid, tanh, silu, gelu, softplus, elu, leaky_relu, hardtanh, relu6,
hardsigmoid, hardswish. Each is an elementwise op defined by one scalar sympy formula (``elementwise.py``'s
:class:`Elementwise`); here are the ops and the primitives of their fused backward (autograd's own kernels).
"""

from __future__ import annotations

import sympy

from ..algebra import CONSTANT, op, primitive
from ..functions import Sigmoid, Softplus
from .base import Param, Sample, Spelling, choice, nonzero_number
from .elementwise import Elementwise, number_param, unary

# grad where out > 0, else 0: autograd's own ReLU backward, twice differentiable (its derivative in
# grad is itself, in out zero), so the fused derivation's ReLU step is one pass over memory
primitive(
    "threshold_backward",
    fresh=True,
    code=lambda operands, params, show: f"torch.ops.aten.threshold_backward({operands[0]}, {operands[1]}, 0)",
    latex=lambda operands, params, show: rf"{operands[0]} \odot H\left({operands[1]}\right)",
)


# the planner's (kept.py): where ReLU's pullback is all the backward reads of its output, the forward
# keeps where the output is not zero (it is never negative; NaN counts as not zero, as it passes the
# gradient), as 0/1 bytes that threshold_backward reads as it reads the output (.bool() is a vectorised
# cast, five times faster than .ne(0) on the CPU, viewed as uint8 without a copy: threshold_backward
# reads a uint8 mask more than twice as fast as a bool one on the CPU, 1.6 against 4.0 ms on 6.4M).
# Under torch.compile the output itself: Inductor's partitioner keeps or recomputes what the backward
# reads as it does for autograd, and a mask made the compiled step slower (BENCHMARKS.md, WHY_CPU)
primitive(
    "active",
    tangent=CONSTANT,
    code=lambda operands, params, show: (
        f"{operands[0]} if torch.compiler.is_compiling() else {operands[0]}.bool().view(torch.uint8)"
    ),
    latex=lambda operands, params, show: rf"\left[{operands[0]} \ne 0\right]",
)


# grad strictly inside (0, 6), else 0: autograd's ReLU6 (hardtanh) backward, twice differentiable; read
# off the output, which is outside (0, 6) exactly where the input is
primitive(
    "relu6_backward",
    fresh=True,
    code=lambda operands, params, show: f"torch.ops.aten.hardtanh_backward({operands[0]}, {operands[1]}, 0, 6)",
    latex=lambda operands, params, show: (
        rf"{operands[0]} \odot H\left({operands[1]}\right) \odot "
        rf"H\left(6 - {operands[1]}\right)"
    ),
)


# hardswish's local derivative times grad, in one pass: autograd's hardswish backward, twice differentiable
# (derivatives.yaml differentiates it; SiLU's kernel is not, and runs where no derivative is wanted, as
# autograd runs it; hardsigmoid's keeps its formula), read off the input
primitive(
    "hardswish_backward",
    fresh=True,
    code=lambda operands, params, show: f"torch.ops.aten.hardswish_backward({operands[0]}, {operands[1]})",
    latex=lambda operands, params, show: rf"{operands[0]} \odot \operatorname{{hardswish}}'\left({operands[1]}\right)",
)


# GELU's pullback in one pass: autograd's gelu_backward, twice differentiable (derivatives.yaml
# differentiates it), read off the input, in the op's own approximation
primitive(
    "gelu_backward",
    fresh=True,
    code=lambda operands, params, show: (
        f"torch.ops.aten.gelu_backward({operands[0]}, {operands[1]}"
        + (f", approximate={params['approximate']!r})" if params["approximate"] != "none" else ")")
    ),
    latex=lambda operands, params, show: rf"{operands[0]} \odot \operatorname{{gelu}}'\left({operands[1]}\right)",
)


# out (1 - out) times grad in one pass: autograd's sigmoid backward (derivatives.yaml: sigmoid_backward(grad,
# result)), twice differentiable (derivatives.yaml differentiates it), read off the output; one rounding
# where the formula's two products round twice (a bfloat16 gate's gradient was not autograd's bit for bit)
primitive(
    "sigmoid_backward",
    fresh=True,
    code=lambda operands, params, show: f"torch.ops.aten.sigmoid_backward({operands[0]}, {operands[1]})",
    latex=lambda operands, params, show: rf"{operands[0]} \odot {operands[1]} \odot \left(1 - {operands[1]}\right)",
)

# (1 - out²) times grad in one pass: autograd's tanh backward (derivatives.yaml: tanh_backward(grad, result)),
# twice differentiable, read off the output; `grad * (1 - out ** 2)` rounds otherwise in float32
primitive(
    "tanh_backward",
    fresh=True,
    code=lambda operands, params, show: f"torch.ops.aten.tanh_backward({operands[0]}, {operands[1]})",
    latex=lambda operands, params, show: rf"{operands[0]} \odot \left(1 - {operands[1]}^{{2}}\right)",
)


SILU_BACKWARD = '''def _silu_backward(grad_output, input):
    """SiLU's pullback as autograd runs it: its one-pass silu_backward kernel where no derivative
    of the gradient is wanted, else the formula, twice differentiable (the kernel is not)."""
    if not torch.is_grad_enabled():
        return torch.ops.aten.silu_backward(grad_output, input)
    sigmoid = torch.sigmoid(input)
    return grad_output * sigmoid * (1 + input * (1 - sigmoid))
'''
"""Emitted once into each module that calls it (``Primitive.helper``): derivatives.yaml's choice for
``silu``, ``GradMode::is_enabled() ? infinitely_differentiable_silu_backward : silu_backward``."""


primitive(
    "silu_backward",
    fresh=True,
    helper=SILU_BACKWARD,
    code=lambda operands, params, show: f"_silu_backward({operands[0]}, {operands[1]})",
    latex=lambda operands, params, show: rf"{operands[0]} \odot \operatorname{{silu}}'\left({operands[1]}\right)",
)


HE_GAIN = 2**0.5
"""He's gain: a weight before a ReLU-like activation, which cuts about half its inputs, is scaled up by it."""


RULES = [
    Elementwise(
        "relu",
        lambda x: sympy.Max(0, x),
        call="F.relu",
        local_kind="mask",
        from_output=lambda out: sympy.Heaviside(out, 0),
        inplace="torch.relu_",
        fused_pullback=lambda grad, node: op("threshold_backward", grad, node.out),
        summary="rectified linear unit; its derivative is the Heaviside mask of the input",
        activation_gain=HE_GAIN,
    ),
    unary(
        "sigmoid",
        Sigmoid,
        "torch.sigmoid",
        "logistic sigmoid",
        from_output=lambda out: out * (1 - out),
        fused_pullback=lambda grad, node: op("sigmoid_backward", grad, node.out),
    ),
    unary(
        "tanh",
        sympy.tanh,
        "torch.tanh",
        "hyperbolic tangent",
        from_output=lambda out: 1 - out**2,
        fused_pullback=lambda grad, node: op("tanh_backward", grad, node.out),
    ),
    unary(
        "silu",
        lambda x: x * Sigmoid(x),
        "F.silu",
        "x * sigmoid(x)",
        calls=("silu",),
        fused_pullback=lambda grad, node: op("silu_backward", grad, node.operands["input"]),
        activation_gain=HE_GAIN,
        costly_to_recompute=True,  # its exp per element: 1.3x silu_backward's own time on the CPU (bf16)
    ),
    unary(
        "gelu",
        lambda x, approximate: (
            x / 2 * (1 + sympy.erf(x / sympy.sqrt(2)))
            if approximate == "none"
            else x / 2 * (1 + sympy.tanh(sympy.sqrt(2 / sympy.pi) * (x + sympy.Rational(44715, 1000000) * x**3)))
        ),
        "F.gelu",
        "Gaussian error linear unit, exact (erf) or tanh-approximated",
        params={"approximate": Param("none", choice("none", "tanh"))},
        calls=("gelu",),
        activation_gain=HE_GAIN,
        fused_pullback=lambda grad, node: op(
            "gelu_backward", grad, node.operands["input"], approximate=node.params["approximate"]
        ),
    ),
    unary(
        "softplus",
        lambda x, beta, threshold: (
            sympy.Heaviside(beta * x - threshold, 0) * x
            + (1 - sympy.Heaviside(beta * x - threshold, 0)) * Softplus(beta * x) / beta
        ),
        "F.softplus",
        "log(1 + exp(beta x)) / beta, linear above the threshold as in PyTorch",
        params={"beta": Param(1, nonzero_number), "threshold": number_param(20)},
        calls=("softplus",),
    ),
    unary(
        "elu",
        lambda x, alpha: sympy.Heaviside(x, 0) * x + (1 - sympy.Heaviside(x, 0)) * alpha * (sympy.exp(x) - 1),
        "F.elu",
        "x above 0, alpha (exp(x) - 1) below; derivative alpha at 0 as in PyTorch",
        params={"alpha": number_param(1.0)},
        activation_gain=HE_GAIN,
    ),
    unary(
        "leaky_relu",
        lambda x, negative_slope: negative_slope * x + (1 - negative_slope) * sympy.Max(0, x),
        "F.leaky_relu",
        "max(0, x) + negative_slope min(0, x); derivative negative_slope at 0 as in PyTorch",
        params={"negative_slope": number_param(0.01)},
        activation_gain=HE_GAIN,
    ),
    unary(
        "hardtanh",
        lambda x, min_val, max_val: sympy.Max(min_val, sympy.Min(max_val, x)),
        "F.hardtanh",
        "x clamped to [min_val, max_val]; derivative 1 strictly inside",
        params={"min_val": number_param(-1.0), "max_val": number_param(1.0)},
        activation_gain=HE_GAIN,
    ),
    unary(
        "relu6",
        lambda x: sympy.Max(0, sympy.Min(6, x)),
        "F.relu6",
        "x clamped to [0, 6]",
        calls=("relu6",),
        fused_pullback=lambda grad, node: op("relu6_backward", grad, node.out),
        activation_gain=HE_GAIN,
        inplace=True,
    ),  # its fused backward reads the output, as nn.ReLU6(inplace=True)'s does
    unary(
        "hardsigmoid",
        lambda x: sympy.Max(0, sympy.Min(1, x / 6 + sympy.Rational(1, 2))),
        "F.hardsigmoid",
        "x / 6 + 1/2 clamped to [0, 1]; derivative 1/6 strictly inside (-3, 3), as in PyTorch",
        # PyTorch's backward multiplies by 1.0f / 6.0f, the float32 1/6, whatever the dtype
        derivative=lambda x: sympy.Rational(11184811, 2**26) * sympy.Heaviside(x + 3, 0) * sympy.Heaviside(3 - x, 0),
        calls=("hardsigmoid",),
    ),
    # x hardsigmoid(x), written with steps (H(0) = 0) so that sympy's derivative is PyTorch's backward at the
    # kinks too (0 up to -3, x / 3 + 1/2 strictly between, 1 from 3 on) and holds no clamp
    unary(
        "hardswish",
        lambda x: (
            x * (x + 3) / 6 * sympy.Heaviside(x + 3, 0) * sympy.Heaviside(3 - x, 0)
            + x * (1 - sympy.Heaviside(3 - x, 0))
        ),
        "F.hardswish",
        "x hardsigmoid(x); derivative 0 up to -3, x / 3 + 1/2 inside, 1 from 3 on, as in PyTorch",
        calls=("hardswish",),
        fused_pullback=lambda grad, node: op("hardswish_backward", grad, node.operands["input"]),
    ),
]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "relu": [
        Sample("relu", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "relu"}], ["x"]),
    ],
    "sigmoid": [
        Sample("sigmoid", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "sigmoid"}], ["x"]),
    ],
    "tanh": [
        Sample("tanh", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "tanh"}], ["x"]),
    ],
    "silu": [
        Sample("silu", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "silu"}], ["x"]),
    ],
    "gelu": [
        Sample("gelu", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "gelu"}], ["x"]),
        Sample(
            "gelu-approximate=tanh", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "gelu", "approximate": "tanh"}], ["x"]
        ),
    ],
    "softplus": [
        Sample("softplus", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "softplus"}], ["x"]),
        Sample(
            "softplus-beta=2-threshold=1",
            {"x": [2, 3, 5], "y": [2, 3, 5]},
            [{"op": "softplus", "beta": 2, "threshold": 1}],
            ["x"],
        ),
    ],
    "elu": [
        Sample("elu", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "elu"}], ["x"]),
        Sample("elu-alpha=0.5", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "elu", "alpha": 0.5}], ["x"]),
    ],
    "leaky_relu": [
        Sample("leaky_relu", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "leaky_relu"}], ["x"]),
        Sample(
            "leaky_relu-negative_slope=0.2",
            {"x": [2, 3, 5], "y": [2, 3, 5]},
            [{"op": "leaky_relu", "negative_slope": 0.2}],
            ["x"],
        ),
    ],
    "hardtanh": [
        Sample("hardtanh", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "hardtanh"}], ["x"]),
        Sample(
            "hardtanh-min_val=-0.5-max_val=2.0",
            {"x": [2, 3, 5], "y": [2, 3, 5]},
            [{"op": "hardtanh", "min_val": -0.5, "max_val": 2.0}],
            ["x"],
        ),
    ],
    "relu6": [
        Sample("relu6", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "relu6"}], ["x"]),
    ],
    "hardsigmoid": [
        Sample("hardsigmoid", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "hardsigmoid"}], ["x"]),
        # x (N(0, 1)) times 4 reaches all three pieces, past the kinks at -3 and 3
        Sample(
            "hardsigmoid-past-its-kinks",
            {"x": [2, 3, 5], "y": [2, 3, 5]},
            [{"op": "mul", "other": 4}, {"op": "hardsigmoid"}],
            ["x"],
        ),
    ],
    "hardswish": [
        Sample("hardswish", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "hardswish"}], ["x"]),
        # x (N(0, 1)) times 4 reaches all three pieces, past the kinks at -3 and 3
        Sample(
            "hardswish-past-its-kinks",
            {"x": [2, 3, 5], "y": [2, 3, 5]},
            [{"op": "mul", "other": 4}, {"op": "hardswish"}],
            ["x"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "relu": [
        Spelling("nn.ReLU(inplace=True)", module=True),
        Spelling("x.relu_()"),
    ],
    "sigmoid": [
        Spelling("nn.Sigmoid()", module=True),
    ],
    "tanh": [
        Spelling("nn.Tanh()", module=True),
    ],
    "silu": [
        Spelling("nn.SiLU()", module=True),
    ],
    "gelu": [
        Spelling('nn.GELU(approximate="tanh")', module=True),
    ],
    "softplus": [
        Spelling("nn.Softplus(beta=2, threshold=10)", module=True),
    ],
    "elu": [
        Spelling("nn.ELU(alpha=0.5)", module=True),
    ],
    "leaky_relu": [
        Spelling("nn.LeakyReLU(0.2, inplace=True)", module=True),
    ],
    "hardtanh": [
        Spelling("nn.Hardtanh(-0.5, 0.5)", module=True),
    ],
    "relu6": [
        Spelling("nn.ReLU6()", module=True),
    ],
    "hardsigmoid": [
        Spelling("nn.Hardsigmoid(inplace=True)", module=True),
        Spelling("F.hardsigmoid(4 * x)"),  # past the kinks at -3 and 3
    ],
    "hardswish": [
        Spelling("nn.Hardswish()", module=True),
        Spelling("F.hardswish(4 * x, inplace=True)"),
    ],
}
