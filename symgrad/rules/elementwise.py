"""Elementwise ops, each defined by one scalar sympy formula: the arithmetic here, the activations (relu,
sigmoid, gelu, ...) in ``activation.py``.

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

from ..algebra import OrderedAdd, keyword_arguments, op, primitive
from ..printing import to_code
from .base import Checker, Forward, NodeSymbols, Operand, Param, Rule, Sample, Spelling, number

INPUT, OTHER = sympy.symbols("input other", real=True)


def _call_primitive(
    name: str,
    call: str,
    math: Callable[..., sympy.Expr],
    inplace: str | bool | None,
    derivative: Callable[..., sympy.Expr],
    defaults: dict,
    costly_to_recompute: bool = False,
):
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

    primitive(
        name,
        code=code,
        latex=latex,
        inplace=inplace_code if inplace else None,
        tangent=tangent,
        recomputable=True,
        costly_to_recompute=costly_to_recompute,
    )


# autograd's quotient and square root pullbacks, rounded as derivatives.yaml rounds them (div:
# grad / other and -grad * ((self / other) / other); sqrt: grad / (2 * result)); sympy's local
# derivatives (grad * (1 / other), grad * (-self / other**2), grad * (0.5 * (1 / result))) round
# otherwise, one float32 ulp apart in a by-hand layer norm (ConvNeXt's channels_first norm). Each is
# written bracketed: the printer takes a primitive's code as one term (``(...).sum_to_size(...)``), its
# operands come bracketed where they are not one
primitive(
    "div_backward_input",
    fresh=True,
    code=lambda operands, params, show: f"({operands[0]} / {operands[1]})",
    latex=lambda operands, params, show: rf"\frac{{{operands[0]}}}{{{operands[1]}}}",
)
primitive(
    "div_backward_other",
    fresh=True,
    code=lambda operands, params, show: f"(-{operands[0]} * (({operands[1]} / {operands[2]}) / {operands[2]}))",
    latex=lambda operands, params, show: rf"-{operands[0]} \odot \frac{{{operands[1]}}}{{{operands[2]}^2}}",
)
primitive(
    "sqrt_backward",
    fresh=True,
    code=lambda operands, params, show: f"({operands[0]} / (2 * {operands[1]}))",
    latex=lambda operands, params, show: rf"\frac{{{operands[0]}}}{{2 {operands[1]}}}",
)
primitive(  # rsqrt: -0.5 * grad * result.pow(3), as derivatives.yaml
    "rsqrt_backward",
    fresh=True,
    code=lambda operands, params, show: f"(-0.5 * {operands[0]} * {operands[1]}.pow(3))",
    latex=lambda operands, params, show: rf"-\frac{{1}}{{2}} {operands[0]} \odot {operands[1]}^3",
)


ADD_INTO_SECOND = '''def _add_into_second(first, fresh):
    """``first + fresh`` laid out as ``first``: into ``fresh`` (new) where it has those strides."""
    if (torch.is_grad_enabled() or torch.compiler.is_compiling()
            or torch._C._are_functorch_transforms_active() or not isinstance(first, torch.Tensor)
            or first.shape != fresh.shape or first.dtype != fresh.dtype
            or first.stride() != fresh.stride()):
        return first + fresh
    return fresh.add_(first)
'''
"""A forward's ``a + b`` (:class:`~symgrad.algebra.OrderedAdd`) added into its fresh second term
(``lifetimes.added_in_place``: a model's ``x + block(x)``): a sum takes its first operand's strides, so in
place only where the second has them too, and where no graph is recorded (as ``_add_into``)."""

primitive(
    "add_into_second",
    helper=ADD_INTO_SECOND,
    fresh=True,
    tangent=lambda expr, tangent_of: sympy.Add(*(tangent_of(operand) for operand in expr.operands)),
    code=lambda operands, params, show: f"_add_into_second({', '.join(operands)})",
    latex=lambda operands, params, show: " + ".join(operands),
)


def _div_pullback(grad, node: NodeSymbols) -> dict:
    a, b = node.operands["input"], node.operands["other"]
    return {"input": op("div_backward_input", grad, b), "other": op("div_backward_other", grad, a, b)}


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
    fused_pullback: Callable[[sympy.Expr, NodeSymbols], sympy.Expr | dict] | None = None
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
    costly_to_recompute: bool = False
    """Its output computed again in the backward only under ``--keep lean`` (``Primitive.costly_to_recompute``)."""

    @property
    def broadcasts(self) -> bool:
        """Only between two operands: a one-operand op's output has its operand's shape."""
        return len(self.operands) > 1

    def __post_init__(self):
        self.calls = self.calls or (self.op, f"{self.op}_")
        if self.call is not None:
            defaults = {key: param.default for key, param in self.params.items()}
            _call_primitive(
                self.op,
                self.call,
                self.formula,
                self.inplace,
                lambda operand, params: self.local_derivative(INPUT, params).xreplace({INPUT: operand}),
                defaults,
                self.costly_to_recompute,
            )

    @property
    def scalars(self) -> tuple[sympy.Symbol, ...]:
        return (INPUT, OTHER)[: len(self.operands)]

    def scalar_forward(self, params: dict | None = None) -> sympy.Expr:
        return self.formula(*self.scalars, **self._values(params))

    def _values(self, params: dict | None) -> dict:
        """The op's params as sympy values: the node's, or PyTorch's defaults (for the ops table)."""
        if params is not None:
            return dict(params)
        return {
            key: (number(param.default, None) if isinstance(param.default, (int, float)) else param.default)
            for key, param in self.params.items()
        }

    def infer_shape(self, shapes, params, check: Checker):
        if "min_val" in params and "max_val" in params:  # hardtanh
            check.require(
                params["min_val"] <= params["max_val"],
                f"min_val {params['min_val']} is greater than max_val {params['max_val']} (PyTorch refuses it)",
                "give a min_val no greater than max_val",
            )
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
            check.require(
                a == b or a == 1 or b == 1,
                f"operands of shapes {shapes['input']} and {shapes['other']} do not broadcast (axis {axis}: {a} vs {b})",
                "make the sizes equal, or 1 on one side",
            )
            out.append(max(a, b))
        return tuple(out)

    def _substitute(self, expr: sympy.Expr, node: NodeSymbols) -> sympy.Expr:
        return expr.xreplace(
            {scalar: node.operands[operand.name] for scalar, operand in zip(self.scalars, self.operands)}
        )

    def forward(self, node: NodeSymbols) -> Forward:
        math = self._substitute(self.scalar_forward(node.params), node)
        if self.call is None:
            # unevaluated, so sub(x, x) prints as `x - x` (a tensor), never as the number 0
            operands = [node.operands[operand.name] for operand in self.operands]
            with sympy.evaluate(False):
                # a tensor sum in the model's order: its strides are its first operand's (OrderedAdd)
                value = OrderedAdd(*operands) if self.op == "add" else self.formula(*operands, **node.params)
            return Forward(value, math)
        return Forward(op(self.op, *(node.operands[operand.name] for operand in self.operands), **node.params), math)

    def local_derivative(self, scalar: sympy.Symbol, params: dict | None = None) -> sympy.Expr:
        """``d forward / d scalar`` by ``sympy.diff``, with every Heaviside step taken as H(0) = 0 and
        the Dirac terms of a continuous function's kinks (``x * delta(x)``, zero) dropped."""
        cache = self.__dict__.setdefault("_derivatives", {})
        key = (scalar, tuple(sorted(self._values(params).items(), key=lambda item: item[0])))
        if key not in cache:
            derivative = (
                self.derivative(*self.scalars, **self._values(params))
                if self.derivative is not None
                else sympy.diff(self.scalar_forward(params), scalar)
            )
            derivative = derivative.replace(sympy.DiracDelta, lambda *_: sympy.Integer(0))
            cache[key] = derivative.replace(sympy.Heaviside, lambda argument, *_: sympy.Heaviside(argument, 0))
        return cache[key]

    def pullback(self, node: NodeSymbols, grad, wanted):
        if node.fused and self.fused_pullback is not None:
            fused = self.fused_pullback(grad, node)
            if isinstance(fused, dict):  # one kernel call per operand (div's)
                return {name: value for name, value in fused.items() if name in wanted}
            return {"input": fused}
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


def _binary(name: str, formula, summary: str, calls: tuple[str, ...], hyper: bool = False) -> Elementwise:
    """``hyper``: a constant ``other`` may be a block's per-instance hyper (a scale: mul, div)."""
    return Elementwise(
        name,
        formula,
        summary=summary,
        calls=calls,
        operands=(Operand("input", from_in=True), Operand("other", from_in=True, constant_ok=True, hyper=hyper)),
    )


def unary(name: str, formula, call: str | None, summary: str, **options) -> Elementwise:
    return Elementwise(name, formula, call=call, summary=summary, **options)


def number_param(default) -> Param:
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


RULES = [
    _binary(
        "add", lambda a, b: a + b, "elementwise sum, broadcasting", ("add", "add_", "__add__", "__iadd__", "__radd__")
    ),
    _binary(
        "sub",
        lambda a, b: a - b,
        "elementwise difference, broadcasting",
        ("sub", "sub_", "__sub__", "__isub__", "subtract"),
    ),
    _binary(
        "mul",
        lambda a, b: a * b,
        "elementwise product (or scaling by a constant), broadcasting",
        ("mul", "mul_", "__mul__", "__imul__", "__rmul__", "multiply"),
        hyper=True,
    ),
    Elementwise(
        "div",
        lambda a, b: a / b,
        summary="elementwise quotient, broadcasting",
        calls=("div", "div_", "__truediv__", "__itruediv__", "true_divide", "divide"),
        operands=(Operand("input", from_in=True), Operand("other", from_in=True, constant_ok=True, hyper=True)),
        fused_pullback=_div_pullback,
    ),
    unary("neg", lambda x: -x, None, "negation", calls=("neg", "neg_", "__neg__", "negative")),
    unary(
        "pow",
        lambda x, exponent: x**exponent,
        None,
        "power by a constant exponent",
        params={"exponent": number_param(2)},
        calls=("pow", "pow_", "__pow__", "__ipow__"),
    ),
    unary("exp", sympy.exp, "torch.exp", "exponential", from_output=lambda out: out),
    unary("log", sympy.log, "torch.log", "natural logarithm"),
    unary("sin", sympy.sin, "torch.sin", "sine (timestep and position embeddings)"),
    unary("cos", sympy.cos, "torch.cos", "cosine (timestep and position embeddings)"),
    # every traced clamp is this op (x.clamp(min=0) too: autograd's clamp passes the gradient at a bound,
    # relu's does not), one-sided to another bound as SwinV2's logit scale, clamp(max=log(100))
    unary(
        "clamp",
        _clamp,
        "torch.clamp",
        "x clamped to [min, max], either side optional; derivative 1 from min to max, both included, as in PyTorch",
        derivative=_clamp_derivative,
        params={"min": Param(None, _bound), "max": Param(None, _bound)},
        calls=("clamp", "clamp_", "clip", "clip_"),
    ),
    unary(
        "sqrt",
        sympy.sqrt,
        "torch.sqrt",
        "square root",
        from_output=lambda out: 1 / (2 * out),
        fused_pullback=lambda grad, node: op("sqrt_backward", grad, node.out),
    ),
    unary(  # LLaMA's and T5's RMSNorm: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        "rsqrt",
        lambda x: 1 / sympy.sqrt(x),
        "torch.rsqrt",
        "reciprocal square root",
        from_output=lambda out: -(out**3) / 2,
        fused_pullback=lambda grad, node: op("rsqrt_backward", grad, node.out),
    ),
    unary(
        "abs",
        sympy.Abs,
        "torch.abs",
        "absolute value; derivative sign(x), 0 at 0 as in PyTorch",
        calls=("abs", "abs_", "__abs__", "absolute"),
    ),
]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "add": [
        Sample("add", {"a": [2, 3], "b": [2, 3], "y": [2, 3]}, [{"op": "add", "in": ["a", "b"]}], ["a", "b"]),
        Sample(
            "residual-branch-sum",
            {"x": [2, 2, 6, 6], "w": [2, 2, 3, 3], "y": [2, 2, 6, 6]},
            [
                {"op": "conv2d", "weight": "w", "padding": 1, "out": "h"},
                {"op": "relu", "out": "a"},
                {"op": "add", "in": ["a", "x"], "out": "r"},
            ],
            ["x", "w"],
        ),
        # two strided convs read one node: their adjoints (with symbolic output_padding) are summed
        Sample(
            "two-strided-convs-share-input",
            {"x": [2, 2, 9, 9], "u": [2, 2, 3, 3], "v": [2, 2, 3, 3], "y": [2, 2, 4, 4]},
            [
                {"op": "conv2d", "in": "x", "weight": "u", "stride": 2, "out": "p"},
                {"op": "conv2d", "in": "x", "weight": "v", "stride": 2, "out": "q"},
                {"op": "add", "in": ["p", "q"], "out": "s"},
            ],
            ["x", "u", "v"],
        ),
    ],
    "sub": [
        Sample("sub", {"a": [2, 3], "b": [2, 3], "y": [2, 3]}, [{"op": "sub", "in": ["a", "b"]}], ["a", "b"]),
        Sample("sub-constant", {"a": [2, 3], "y": [2, 3]}, [{"op": "sub", "other": 3}], ["a"]),
        # found by the fuzzer: sympy folds x - x to the number 0; forward and gradient must stay
        # tensors
        Sample("sub-same-node-cancels", {"x": [2, 3], "y": [2, 3]}, [{"op": "sub", "in": ["x", "x"]}], ["x"]),
        Sample(
            "conv-of-cancelled-difference",
            {"x": [1, 1, 5, 5], "w": [1, 1, 1, 1], "y": [1, 1, 5, 5]},
            [{"op": "sub", "in": ["x", "x"], "out": "d"}, {"op": "conv2d", "weight": "w", "out": "c"}],
            ["x", "w"],
        ),
    ],
    "mul": [
        Sample(
            "mul-broadcast",
            {"a": [2, 3, 4], "b": [3, 1], "y": [2, 3, 4]},
            [{"op": "mul", "in": ["a", "b"]}],
            ["a", "b"],
        ),
        Sample("mul-constant", {"a": [2, 3], "y": [2, 3]}, [{"op": "mul", "other": 0.25}], ["a"]),
        Sample("same-node-both-operands", {"x": [2, 3], "y": [2, 3]}, [{"op": "mul", "in": ["x", "x"]}], ["x"]),
    ],
    "div": [
        Sample(
            "div-broadcast",
            {"a": [2, 3, 4], "b": [3, 1], "y": [2, 3, 4]},
            [{"op": "softplus", "in": "b", "out": "pb"}, {"op": "div", "in": ["a", "pb"]}],
            ["a", "b"],
        ),
        Sample("div-constant", {"a": [2, 3], "y": [2, 3]}, [{"op": "div", "other": 4}], ["a"]),
    ],
    "neg": [
        Sample("neg", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "neg"}], ["x"]),
    ],
    "pow": [
        Sample("pow-exponent=3", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "pow", "exponent": 3}], ["x"]),
        # pow's default exponent (2) must reach PyTorch
        Sample("pow", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "pow"}], ["x"]),
        Sample(
            "pow-of-positive-exponent=0.5",
            {"x": [2, 3, 5], "y": [2, 3, 5]},
            [{"op": "softplus"}, {"op": "pow", "exponent": 0.5}],
            ["x"],
        ),
        Sample(
            "pow-of-positive-exponent=-1.5",
            {"x": [2, 3, 5], "y": [2, 3, 5]},
            [{"op": "softplus"}, {"op": "pow", "exponent": -1.5}],
            ["x"],
        ),
    ],
    "exp": [
        Sample("exp", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "exp"}], ["x"]),
    ],
    "log": [
        Sample("log-of-positive", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "softplus"}, {"op": "log"}], ["x"]),
    ],
    "sin": [
        Sample("sin", {"x": [2, 3, 4], "y": [2, 3, 4]}, [{"op": "sin", "out": "out"}], ["x"]),
    ],
    "cos": [
        Sample("cos", {"x": [2, 3, 4], "y": [2, 3, 4]}, [{"op": "cos", "out": "out"}], ["x"]),
    ],
    "clamp": [
        Sample("clamp-max-only", {"x": [2, 3, 4], "y": [2, 3, 4]}, [{"op": "clamp", "max": 0.5, "out": "out"}], ["x"]),
        Sample(
            "clamp-both",
            {"x": [2, 3, 4], "y": [2, 3, 4]},
            [{"op": "clamp", "min": -0.25, "max": 0.75, "out": "out"}],
            ["x"],
        ),
    ],
    "sqrt": [
        Sample("sqrt-of-positive", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "softplus"}, {"op": "sqrt"}], ["x"]),
    ],
    "rsqrt": [
        Sample("rsqrt-of-positive", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "softplus"}, {"op": "rsqrt"}], ["x"]),
    ],
    "abs": [
        Sample("abs", {"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "abs"}], ["x"]),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
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
    "rsqrt": [
        Spelling("positive(x).rsqrt()"),
        Spelling("torch.rsqrt(positive(x) + 1e-6)"),
    ],
    "abs": [
        Spelling("abs(x)"),
    ],
}
