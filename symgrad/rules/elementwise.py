"""Elementwise ops, each defined by one scalar sympy formula.

The formula gives everything: the forward (printed, or a named torch call), the local derivative
(``sympy.diff``), the math in the docs and the row of the ops table. PyTorch takes one-sided
derivatives at kinks with strict inequalities (``relu'(0) = 0``), so every Heaviside step that
sympy produces is taken with ``H(0) = 0``.

Broadcasting is allowed between the two operands of a binary op; the reverse walk sums each
contribution back to its operand's shape (rules never un-broadcast).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import sympy

from ..algebra import CONSTANT, keyword_arguments, op, primitive
from ..functions import Sigmoid, Softplus
from ..printing import to_code
from .base import Checker, Forward, NodeSymbols, Operand, Param, Rule, Sample, Spelling, choice, nonzero_number, number

INPUT, OTHER = sympy.symbols("input other", real=True)


def _call_primitive(name: str, call: str, math: Callable[..., sympy.Expr], inplace: str | bool | None,
                    derivative: Callable[..., sympy.Expr], defaults: dict):
    def code(operands, params, show):
        return f"{call}({', '.join(operands)}{keyword_arguments(params, defaults, show)})"

    def inplace_code(operands, params, show):
        arguments = ", ".join(operands) + keyword_arguments(params, defaults, show)
        return f"{call}({arguments}, inplace=True)" if inplace is True else f"{inplace}({arguments})"

    def latex(operands, params, show):
        from ..printing import to_latex  # the scalar formula, shown with the operand in place

        placeholder = sympy.Symbol("□", real=True)
        return to_latex(math(placeholder, **dict(params.items()))).replace("□", operands[0])

    def tangent(expr, tangent_of):  # f(x) elementwise: d f(x) = f'(x) * dx, with f' from sympy.diff
        (operand,) = expr.operands
        return derivative(operand, dict(expr.params.items())) * tangent_of(operand)

    primitive(name, code=code, latex=latex, inplace=inplace_code if inplace else None, tangent=tangent,
              recomputable=True)


@dataclass
class Elementwise(Rule):
    op: str
    formula: Callable[..., sympy.Expr]
    """The scalar forward, as a function of ``input`` (and ``other``)."""
    call: str | None = None
    """The torch call that computes the forward, when not the printed formula (``F.relu``)."""
    local_kind: str = "local"
    """The name given to a non-trivial local derivative: ``mask_relu1``, ``local_t1``."""
    from_output: Callable[[sympy.Symbol], sympy.Expr] | None = None
    """The local derivative written with the op's output instead of its input, when that is exact
    (``H(x) = H(relu(x))``): the input can then be freed after the forward. Tests check the identity."""
    inplace: str | bool | None = None
    """An in-place torch call for the forward (``torch.relu_``), or True for the call's own flag
    (``F.relu6(x, inplace=True)``), used by the fast function where its backward reads the output."""
    fused_pullback: Callable[[sympy.Expr, NodeSymbols], sympy.Expr] | None = None
    """``(grad, node) -> grad_input`` by autograd's own kernel, for the fused derivation (ReLU's
    ``threshold_backward`` of the output, hardswish's and GELU's of the input: one pass instead of a
    mask or a local derivative and a product); where that kernel is not twice differentiable (SiLU's),
    a helper runs it only where no derivative of the gradient is wanted, as autograd does."""
    derivative: Callable[..., sympy.Expr] | None = None
    """The local derivative, as a function of ``input``, where PyTorch's backward is not the formula's
    own (hardsigmoid's slope is the float32 constant 1/6, in float64 too); None: ``sympy.diff``."""
    summary: str = ""
    operands: tuple[Operand, ...] = field(default=(Operand("input", from_in=True),))
    params: dict = field(default_factory=dict)
    """PyTorch's keyword arguments of the op (``negative_slope``), passed to ``formula``."""
    calls: tuple[str, ...] = ()
    """The recorded torch calls that are this op; empty: the op's own name and its in-place variant."""
    activation_gain: float = 1.0

    @property
    def broadcasts(self) -> bool:
        """Only between two operands: a one-operand op's output has its operand's shape."""
        return len(self.operands) > 1

    def __post_init__(self):
        self.calls = self.calls or (self.op, f"{self.op}_")
        if self.call is not None:
            defaults = {key: param.default for key, param in self.params.items()}
            _call_primitive(self.op, self.call, self.formula, self.inplace,
                            lambda operand, params: self.local_derivative(INPUT, params).xreplace({INPUT: operand}),
                            defaults)

    @property
    def scalars(self) -> tuple[sympy.Symbol, ...]:
        return (INPUT, OTHER)[: len(self.operands)]

    def scalar_forward(self, params: dict | None = None) -> sympy.Expr:
        return self.formula(*self.scalars, **self._values(params))

    def _values(self, params: dict | None) -> dict:
        """The op's params as sympy values: the node's, or PyTorch's defaults (for the ops table)."""
        if params is not None:
            return dict(params)
        return {key: (number(param.default, None) if isinstance(param.default, (int, float)) else param.default)
                for key, param in self.params.items()}

    def infer_shape(self, shapes, params, check: Checker):
        if "min_val" in params and "max_val" in params:  # hardtanh
            check.require(params["min_val"] <= params["max_val"],
                          f"min_val {params['min_val']} is greater than max_val {params['max_val']} (PyTorch refuses it)",
                          "give a min_val no greater than max_val")
        if len(shapes) == 1:
            return next(iter(shapes.values()))
        left, right = shapes["input"], shapes["other"]
        rank = max(len(left), len(right))
        left, right = (1,) * (rank - len(left)) + tuple(left), (1,) * (rank - len(right)) + tuple(right)
        out = []
        for axis, (a, b) in enumerate(zip(left, right)):
            if check.symbolic:
                check.equal(a, b, "", "")  # the solver keeps operands the same shape
                out.append(a)
                continue
            check.require(a == b or a == 1 or b == 1,
                          f"operands of shapes {shapes['input']} and {shapes['other']} do not broadcast (axis {axis}: {a} vs {b})",
                          "make the sizes equal, or 1 on one side")
            out.append(max(a, b))
        return tuple(out)

    def _substitute(self, expr: sympy.Expr, node: NodeSymbols) -> sympy.Expr:
        return expr.xreplace({scalar: node.operands[operand.name] for scalar, operand in zip(self.scalars, self.operands)})

    def forward(self, node: NodeSymbols) -> Forward:
        math = self._substitute(self.scalar_forward(node.params), node)
        if self.call is None:
            # unevaluated, so sub(x, x) prints as `x - x` (a tensor), never as the number 0
            with sympy.evaluate(False):
                value = self.formula(*(node.operands[operand.name] for operand in self.operands), **node.params)
            return Forward(value, math)
        return Forward(op(self.op, *(node.operands[operand.name] for operand in self.operands), **node.params), math)

    def local_derivative(self, scalar: sympy.Symbol, params: dict | None = None) -> sympy.Expr:
        """``d forward / d scalar`` by ``sympy.diff``, with every Heaviside step taken as H(0) = 0 and
        the Dirac terms of a continuous function's kinks (``x * delta(x)``, zero) dropped."""
        cache = self.__dict__.setdefault("_derivatives", {})
        key = (scalar, tuple(sorted(self._values(params).items(), key=lambda item: item[0])))
        if key not in cache:
            derivative = (self.derivative(*self.scalars, **self._values(params)) if self.derivative is not None
                          else sympy.diff(self.scalar_forward(params), scalar))
            derivative = derivative.replace(sympy.DiracDelta, lambda *_: sympy.Integer(0))
            cache[key] = derivative.replace(sympy.Heaviside, lambda argument, *_: sympy.Heaviside(argument, 0))
        return cache[key]

    def pullback(self, node: NodeSymbols, grad, wanted):
        if node.fused and self.fused_pullback is not None:
            return {"input": self.fused_pullback(grad, node)}
        grads = {}
        for scalar, operand in zip(self.scalars, self.operands):
            if operand.name not in wanted:
                continue
            if self.from_output is not None:
                local = self.from_output(node.out)
            else:
                local = self._substitute(self.local_derivative(scalar, node.params), node)
            if not (local.is_number or local.is_Symbol):
                # one local per operand: local_div_2_input, local_div_2_other
                local = node.local(self.local_kind, local, suffix=operand.name if len(self.operands) > 1 else "")
            grads[operand.name] = local * grad
        return grads

    def table_row(self):
        derivatives = "; ".join(f"d/d{scalar} = {to_code(self.local_derivative(scalar))}" for scalar in self.scalars)
        return self.op, f"out = {to_code(self.scalar_forward())}", derivatives


# grad where out > 0, else 0: autograd's own ReLU backward, twice differentiable (its derivative in
# grad is itself, in out zero), so the fused derivation's ReLU step is one pass over memory
primitive("threshold_backward", fresh=True,
          code=lambda operands, params, show: f"torch.ops.aten.threshold_backward({operands[0]}, {operands[1]}, 0)",
          latex=lambda operands, params, show: rf"{operands[0]} \odot H\left({operands[1]}\right)")


# the planner's (kept.py): where ReLU's pullback is all the backward reads of its output, the forward
# keeps where the output is not zero (it is never negative; NaN counts as not zero, as it passes the
# gradient), as 0/1 bytes that threshold_backward reads as it reads the output (.bool() is a vectorised
# cast, five times faster than .ne(0) on the CPU, viewed as uint8 without a copy: threshold_backward
# reads a uint8 mask more than twice as fast as a bool one on the CPU, 1.6 against 4.0 ms on 6.4M).
# Under torch.compile the output itself: Inductor's partitioner keeps or recomputes what the backward
# reads as it does for autograd, and a mask made the compiled step slower (BENCHMARKS.md, WHY_CPU)
primitive("active", tangent=CONSTANT, code=lambda operands, params, show: (
    f"{operands[0]} if torch.compiler.is_compiling() else {operands[0]}.bool().view(torch.uint8)"),
    latex=lambda operands, params, show: rf"\left[{operands[0]} \ne 0\right]")


# grad strictly inside (0, 6), else 0: autograd's ReLU6 (hardtanh) backward, twice differentiable; read
# off the output, which is outside (0, 6) exactly where the input is
primitive("relu6_backward", fresh=True,
          code=lambda operands, params, show: f"torch.ops.aten.hardtanh_backward({operands[0]}, {operands[1]}, 0, 6)",
          latex=lambda operands, params, show: rf"{operands[0]} \odot H\left({operands[1]}\right) \odot "
                                               rf"H\left(6 - {operands[1]}\right)")


# the local derivative above times grad, in one pass: autograd's hardswish backward, twice differentiable
# (derivatives.yaml differentiates it; SiLU's kernel is not, and runs where no derivative is wanted, as
# autograd runs it; hardsigmoid's keeps its formula), read off the input
primitive("hardswish_backward", fresh=True,
          code=lambda operands, params, show: f"torch.ops.aten.hardswish_backward({operands[0]}, {operands[1]})",
          latex=lambda operands, params, show: rf"{operands[0]} \odot \operatorname{{hardswish}}'\left({operands[1]}\right)")


# GELU's pullback in one pass: autograd's gelu_backward, twice differentiable (derivatives.yaml
# differentiates it), read off the input, in the op's own approximation
primitive("gelu_backward", fresh=True,
          code=lambda operands, params, show: (f"torch.ops.aten.gelu_backward({operands[0]}, {operands[1]}"
                                               + (f", approximate={params['approximate']!r})"
                                                  if params["approximate"] != "none" else ")")),
          latex=lambda operands, params, show: rf"{operands[0]} \odot \operatorname{{gelu}}'\left({operands[1]}\right)")


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
primitive("silu_backward", fresh=True, helper=SILU_BACKWARD,
          code=lambda operands, params, show: f"_silu_backward({operands[0]}, {operands[1]})",
          latex=lambda operands, params, show: rf"{operands[0]} \odot \operatorname{{silu}}'\left({operands[1]}\right)")


def _binary(name: str, formula, summary: str, calls: tuple[str, ...]) -> Elementwise:
    return Elementwise(name, formula, summary=summary, calls=calls,
                       operands=(Operand("input", from_in=True), Operand("other", from_in=True, constant_ok=True)))


def _unary(name: str, formula, call: str | None, summary: str, **options) -> Elementwise:
    return Elementwise(name, formula, call=call, summary=summary, **options)


def _param(default) -> Param:
    return Param(default, number)


def _bound(value, context):
    """One side of ``torch.clamp``: a number, or None for no bound on that side."""
    return None if value is None else number(value, context)


def _clamp(x, min=None, max=None):
    value = x if max is None else sympy.Min(max, x)
    return value if min is None else sympy.Max(min, value)


def _clamp_derivative(x, min=None, max=None):
    """1 where min <= x <= max, both ends included (PyTorch's clamp backward), as 1 - H(min - x) with H(0) = 0."""
    inside = sympy.Integer(1)
    if min is not None:
        inside = inside * (1 - sympy.Heaviside(min - x, 0))
    if max is not None:
        inside = inside * (1 - sympy.Heaviside(x - max, 0))
    return inside


HE_GAIN = 2 ** 0.5
"""He's gain: a weight before a ReLU-like activation, which cuts about half its inputs, is scaled up by it."""

RULES = [
    Elementwise("relu", lambda x: sympy.Max(0, x), call="F.relu", local_kind="mask",
                from_output=lambda out: sympy.Heaviside(out, 0), inplace="torch.relu_",
                fused_pullback=lambda grad, node: op("threshold_backward", grad, node.out),
                summary="rectified linear unit; its derivative is the Heaviside mask of the input",
                activation_gain=HE_GAIN),
    _binary("add", lambda a, b: a + b, "elementwise sum, broadcasting",
            ("add", "add_", "__add__", "__iadd__", "__radd__")),
    _binary("sub", lambda a, b: a - b, "elementwise difference, broadcasting",
            ("sub", "sub_", "__sub__", "__isub__", "subtract")),
    _binary("mul", lambda a, b: a * b, "elementwise product (or scaling by a constant), broadcasting",
            ("mul", "mul_", "__mul__", "__imul__", "__rmul__", "multiply")),
    _binary("div", lambda a, b: a / b, "elementwise quotient, broadcasting",
            ("div", "div_", "__truediv__", "__itruediv__", "true_divide", "divide")),
    _unary("neg", lambda x: -x, None, "negation", calls=("neg", "neg_", "__neg__", "negative")),
    _unary("pow", lambda x, exponent: x ** exponent, None, "power by a constant exponent",
           params={"exponent": _param(2)}, calls=("pow", "pow_", "__pow__", "__ipow__")),
    _unary("exp", sympy.exp, "torch.exp", "exponential", from_output=lambda out: out),
    _unary("log", sympy.log, "torch.log", "natural logarithm"),
    _unary("sin", sympy.sin, "torch.sin", "sine (timestep and position embeddings)"),
    _unary("cos", sympy.cos, "torch.cos", "cosine (timestep and position embeddings)"),
    # every traced clamp is this op (x.clamp(min=0) too: autograd's clamp passes the gradient at a bound,
    # relu's does not), one-sided to another bound as SwinV2's logit scale, clamp(max=log(100))
    _unary("clamp", _clamp, "torch.clamp", "x clamped to [min, max], either side optional; derivative 1 from "
           "min to max, both included, as in PyTorch", derivative=_clamp_derivative,
           params={"min": Param(None, _bound), "max": Param(None, _bound)}, calls=("clamp", "clamp_", "clip", "clip_")),
    _unary("sqrt", sympy.sqrt, "torch.sqrt", "square root", from_output=lambda out: 1 / (2 * out)),
    _unary("abs", sympy.Abs, "torch.abs", "absolute value; derivative sign(x), 0 at 0 as in PyTorch",
           calls=("abs", "abs_", "__abs__", "absolute")),
    _unary("sigmoid", Sigmoid, "torch.sigmoid", "logistic sigmoid", from_output=lambda out: out * (1 - out)),
    _unary("tanh", sympy.tanh, "torch.tanh", "hyperbolic tangent", from_output=lambda out: 1 - out ** 2),
    _unary("silu", lambda x: x * Sigmoid(x), "F.silu", "x * sigmoid(x)", calls=("silu",),
           fused_pullback=lambda grad, node: op("silu_backward", grad, node.operands["input"]), activation_gain=HE_GAIN),
    _unary("gelu", lambda x, approximate: (
        x / 2 * (1 + sympy.erf(x / sympy.sqrt(2))) if approximate == "none"
        else x / 2 * (1 + sympy.tanh(sympy.sqrt(2 / sympy.pi) * (x + sympy.Rational(44715, 1000000) * x ** 3)))),
        "F.gelu", "Gaussian error linear unit, exact (erf) or tanh-approximated",
        params={"approximate": Param("none", choice("none", "tanh"))}, calls=("gelu",), activation_gain=HE_GAIN,
        fused_pullback=lambda grad, node: op("gelu_backward", grad, node.operands["input"],
                                             approximate=node.params["approximate"])),
    _unary("softplus", lambda x, beta, threshold: (
        sympy.Heaviside(beta * x - threshold, 0) * x
        + (1 - sympy.Heaviside(beta * x - threshold, 0)) * Softplus(beta * x) / beta),
        "F.softplus", "log(1 + exp(beta x)) / beta, linear above the threshold as in PyTorch",
        params={"beta": Param(1, nonzero_number), "threshold": _param(20)}, calls=("softplus",)),
    _unary("elu", lambda x, alpha: sympy.Heaviside(x, 0) * x + (1 - sympy.Heaviside(x, 0)) * alpha * (sympy.exp(x) - 1),
           "F.elu", "x above 0, alpha (exp(x) - 1) below; derivative alpha at 0 as in PyTorch",
           params={"alpha": _param(1.0)}, activation_gain=HE_GAIN),
    _unary("leaky_relu", lambda x, negative_slope: negative_slope * x + (1 - negative_slope) * sympy.Max(0, x),
           "F.leaky_relu", "max(0, x) + negative_slope min(0, x); derivative negative_slope at 0 as in PyTorch",
           params={"negative_slope": _param(0.01)}, activation_gain=HE_GAIN),
    _unary("hardtanh", lambda x, min_val, max_val: sympy.Max(min_val, sympy.Min(max_val, x)), "F.hardtanh",
           "x clamped to [min_val, max_val]; derivative 1 strictly inside",
           params={"min_val": _param(-1.0), "max_val": _param(1.0)}, activation_gain=HE_GAIN),
    _unary("relu6", lambda x: sympy.Max(0, sympy.Min(6, x)), "F.relu6", "x clamped to [0, 6]", calls=("relu6",),
           fused_pullback=lambda grad, node: op("relu6_backward", grad, node.out), activation_gain=HE_GAIN,
           inplace=True),  # its fused backward reads the output, as nn.ReLU6(inplace=True)'s does
    _unary("hardsigmoid", lambda x: sympy.Max(0, sympy.Min(1, x / 6 + sympy.Rational(1, 2))), "F.hardsigmoid",
           "x / 6 + 1/2 clamped to [0, 1]; derivative 1/6 strictly inside (-3, 3), as in PyTorch",
           # PyTorch's backward multiplies by 1.0f / 6.0f, the float32 1/6, whatever the dtype
           derivative=lambda x: sympy.Rational(11184811, 2 ** 26) * sympy.Heaviside(x + 3, 0) * sympy.Heaviside(3 - x, 0),
           calls=("hardsigmoid",)),
    # x hardsigmoid(x), written with steps (H(0) = 0) so that sympy's derivative is PyTorch's backward at the
    # kinks too (0 up to -3, x / 3 + 1/2 strictly between, 1 from 3 on) and holds no clamp
    _unary("hardswish", lambda x: (x * (x + 3) / 6 * sympy.Heaviside(x + 3, 0) * sympy.Heaviside(3 - x, 0)
                                   + x * (1 - sympy.Heaviside(3 - x, 0))), "F.hardswish",
           "x hardsigmoid(x); derivative 0 up to -3, x / 3 + 1/2 inside, 1 from 3 on, as in PyTorch",
           calls=("hardswish",), fused_pullback=lambda grad, node: op("hardswish_backward", grad, node.operands["input"])),
]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "relu": [
        Sample("relu", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "relu"}], ["x"]),
    ],
    "add": [
        Sample("add", {"a": [2, 3], "b": [2, 3], "y": [2, 3]}, [{"op": "add", "in": ["a", "b"]}],
               ["a", "b"]),
        Sample("residual-branch-sum", {"x": [2, 2, 6, 6], "w": [2, 2, 3, 3], "y": [2, 2, 6, 6]},
               [{"op": "conv2d", "weight": "w", "padding": 1, "out": "h"},
                {"op": "relu", "out": "a"}, {"op": "add", "in": ["a", "x"], "out": "r"}],
               ["x", "w"]),
        # two strided convs read one node: their adjoints (with symbolic output_padding) are summed
        Sample("two-strided-convs-share-input",
               {"x": [2, 2, 9, 9], "u": [2, 2, 3, 3], "v": [2, 2, 3, 3], "y": [2, 2, 4, 4]},
               [{"op": "conv2d", "in": "x", "weight": "u", "stride": 2, "out": "p"},
                {"op": "conv2d", "in": "x", "weight": "v", "stride": 2, "out": "q"},
                {"op": "add", "in": ["p", "q"], "out": "s"}],
               ["x", "u", "v"]),
    ],
    "sub": [
        Sample("sub", {"a": [2, 3], "b": [2, 3], "y": [2, 3]}, [{"op": "sub", "in": ["a", "b"]}],
               ["a", "b"]),
        Sample("sub-constant", {"a": [2, 3], "y": [2, 3]}, [{"op": "sub", "other": 3}], ["a"]),
        # found by the fuzzer: sympy folds x - x to the number 0; forward and gradient must stay
        # tensors
        Sample("sub-same-node-cancels", {"x": [2, 3], "y": [2, 3]},
               [{"op": "sub", "in": ["x", "x"]}], ["x"]),
        Sample("conv-of-cancelled-difference",
               {"x": [1, 1, 5, 5], "w": [1, 1, 1, 1], "y": [1, 1, 5, 5]},
               [{"op": "sub", "in": ["x", "x"], "out": "d"},
                {"op": "conv2d", "weight": "w", "out": "c"}],
               ["x", "w"]),
    ],
    "mul": [
        Sample("mul-broadcast", {"a": [2, 3, 4], "b": [3, 1], "y": [2, 3, 4]},
               [{"op": "mul", "in": ["a", "b"]}], ["a", "b"]),
        Sample("mul-constant", {"a": [2, 3], "y": [2, 3]}, [{"op": "mul", "other": 0.25}], ["a"]),
        Sample("same-node-both-operands", {"x": [2, 3], "y": [2, 3]},
               [{"op": "mul", "in": ["x", "x"]}], ["x"]),
    ],
    "div": [
        Sample("div-broadcast", {"a": [2, 3, 4], "b": [3, 1], "y": [2, 3, 4]},
               [{"op": "softplus", "in": "b", "out": "pb"}, {"op": "div", "in": ["a", "pb"]}],
               ["a", "b"]),
        Sample("div-constant", {"a": [2, 3], "y": [2, 3]}, [{"op": "div", "other": 4}], ["a"]),
    ],
    "neg": [
        Sample("neg", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "neg"}], ["x"]),
    ],
    "pow": [
        Sample("pow-exponent=3", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "pow", "exponent": 3}],
               ["x"]),
        # pow's default exponent (2) must reach PyTorch
        Sample("pow", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "pow"}], ["x"]),
        Sample("pow-of-positive-exponent=0.5", {"x": [2, 3, 5], "y": [2, 3, 5]},
               [{"op": "softplus"}, {"op": "pow", "exponent": 0.5}], ["x"]),
        Sample("pow-of-positive-exponent=-1.5", {"x": [2, 3, 5], "y": [2, 3, 5]},
               [{"op": "softplus"}, {"op": "pow", "exponent": -1.5}], ["x"]),
    ],
    "exp": [
        Sample("exp", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "exp"}], ["x"]),
    ],
    "log": [
        Sample("log-of-positive", {"x": [2, 3, 5], "y": [2, 3, 5]},
               [{"op": "softplus"}, {"op": "log"}], ["x"]),
    ],
    "sin": [
        Sample("sin", {"x": [2, 3, 4], "y": [2, 3, 4]}, [{"op": "sin", "out": "out"}], ["x"]),
    ],
    "cos": [
        Sample("cos", {"x": [2, 3, 4], "y": [2, 3, 4]}, [{"op": "cos", "out": "out"}], ["x"]),
    ],
    "clamp": [
        Sample("clamp-max-only", {"x": [2, 3, 4], "y": [2, 3, 4]},
               [{"op": "clamp", "max": 0.5, "out": "out"}], ["x"]),
        Sample("clamp-both", {"x": [2, 3, 4], "y": [2, 3, 4]},
               [{"op": "clamp", "min": -0.25, "max": 0.75, "out": "out"}], ["x"]),
    ],
    "sqrt": [
        Sample("sqrt-of-positive", {"x": [2, 3, 5], "y": [2, 3, 5]},
               [{"op": "softplus"}, {"op": "sqrt"}], ["x"]),
    ],
    "abs": [
        Sample("abs", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "abs"}], ["x"]),
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
        Sample("gelu-approximate=tanh", {"x": [2, 3, 5], "y": [2, 3, 5]},
               [{"op": "gelu", "approximate": "tanh"}], ["x"]),
    ],
    "softplus": [
        Sample("softplus", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "softplus"}], ["x"]),
        Sample("softplus-beta=2-threshold=1", {"x": [2, 3, 5], "y": [2, 3, 5]},
               [{"op": "softplus", "beta": 2, "threshold": 1}], ["x"]),
    ],
    "elu": [
        Sample("elu", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "elu"}], ["x"]),
        Sample("elu-alpha=0.5", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "elu", "alpha": 0.5}],
               ["x"]),
    ],
    "leaky_relu": [
        Sample("leaky_relu", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "leaky_relu"}], ["x"]),
        Sample("leaky_relu-negative_slope=0.2", {"x": [2, 3, 5], "y": [2, 3, 5]},
               [{"op": "leaky_relu", "negative_slope": 0.2}], ["x"]),
    ],
    "hardtanh": [
        Sample("hardtanh", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "hardtanh"}], ["x"]),
        Sample("hardtanh-min_val=-0.5-max_val=2.0", {"x": [2, 3, 5], "y": [2, 3, 5]},
               [{"op": "hardtanh", "min_val": -0.5, "max_val": 2.0}], ["x"]),
    ],
    "relu6": [
        Sample("relu6", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "relu6"}], ["x"]),
    ],
    "hardsigmoid": [
        Sample("hardsigmoid", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "hardsigmoid"}], ["x"]),
        # x (N(0, 1)) times 4 reaches all three pieces, past the kinks at -3 and 3
        Sample("hardsigmoid-past-its-kinks", {"x": [2, 3, 5], "y": [2, 3, 5]},
               [{"op": "mul", "other": 4}, {"op": "hardsigmoid"}], ["x"]),
    ],
    "hardswish": [
        Sample("hardswish", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "hardswish"}], ["x"]),
        # x (N(0, 1)) times 4 reaches all three pieces, past the kinks at -3 and 3
        Sample("hardswish-past-its-kinks", {"x": [2, 3, 5], "y": [2, 3, 5]},
               [{"op": "mul", "other": 4}, {"op": "hardswish"}], ["x"]),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "relu": [
        Spelling("nn.ReLU(inplace=True)", module=True),
        Spelling("x.relu_()"),
    ],
    "add": [
        Spelling("x + y", {"x": (2, 3, 4), "y": (2, 3, 4)}),
        Spelling("x.add_(y)", {"x": (2, 3, 4), "y": (2, 3, 4)}),
        Spelling("torch.zeros_like(x).add_(x) + x.new_full((1,), 1.5)"),
    ],
    "sub": [
        Spelling("torch.sub(x, y)", {"x": (2, 3, 4), "y": (3, 4)}),
    ],
    "mul": [
        Spelling("2 * x * y", {"x": (2, 3, 4), "y": (2, 3, 4)}),
        # constants made inside forward: one value broadcast against a tensor is a number (a map of
        # one value, read as a tensor, is a full layer: fill.py)
        Spelling("torch.full_like(x, 2.0) * x"),
        Spelling("x * torch.ones(1, 3, 1, 1) * torch.tensor(0.5)"),
        Spelling("torch.mul(0.5, x)"),
    ],
    "div": [
        Spelling("x / positive(y)", {"x": (2, 3, 4), "y": (2, 3, 4)}),
    ],
    "neg": [
        Spelling("1 - x", {"x": (2, 3)}),  # (-x) + 1
        Spelling("-x"),
        Spelling("torch.ones_like(x) - x"),  # (-x) + 1.0
    ],
    "pow": [
        Spelling("torch.full_like(x, 3.0) / positive(x)"),  # positive(x) ** -1 * 3.0
        Spelling("x ** 3"),
        Spelling("x.square()"),
    ],
    "exp": [
        Spelling("torch.exp(x)"),
    ],
    "log": [
        Spelling("torch.log(positive(x))"),
    ],
    "sin": [
        Spelling("torch.sin(x)"),
    ],
    "cos": [
        Spelling("x.cos()"),
    ],
    "clamp": [
        Spelling("x.clamp(min=0)"),  # not relu: autograd's clamp passes the gradient at 0
        Spelling("torch.clamp(x, -0.5, 0.25)"),
        Spelling("x.clamp(0, 6)"),
        Spelling("torch.clamp(x, max=0.5)"),  # SwinV2's logit scale, one-sided
        Spelling("x.clamp_min(-0.2) * torch.clamp_max(x, 0.3)"),
        Spelling("x.clip(min=0.1)"),
    ],
    "sqrt": [
        Spelling("positive(x).sqrt()"),
    ],
    "abs": [
        Spelling("abs(x)"),
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
