"""What a rule is: one definition per op that gives its shape, forward, pullback and notation.

A rule never prints anything and never sums gradients: it returns sympy expressions, and the
reverse walk (``reverse.py``) owns branch sums, un-broadcasting and naming.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import sympy

from ..algebra import tensor
from ..errors import Location, SpecError, cut


@dataclass(frozen=True)
class Operand:
    """A tensor argument of an op, named as in ``torch.nn.functional``."""

    name: str
    from_in: bool = False
    """Filled, in order, from the layer's ``in:`` list (or the previous node)."""
    optional: bool = False
    constant_ok: bool = False
    """May be a number instead of a node (``mul`` by 0.5)."""
    hyper: bool = False
    """A number (``constant_ok``) in which instances of one block may differ, each setting its own
    (a layer scale, ``mul`` by 0.5 in one block and by 0.25 in the next): the block derives it as
    a symbol, printed by name, so no value specialises its code (``x * 0`` is no zero branch)."""
    variadic: bool = False
    """Takes every ``in:`` source, as operands ``<name>_0``, ``<name>_1``, ... (``cat``'s tensors)."""


@dataclass(frozen=True)
class Param:
    """A non-tensor argument: its default and a function that validates and normalises a value."""

    default: Any
    normalize: Callable[[Any, "ParamContext"], Any]
    hyper: bool = False
    """A float in which instances of one block may differ, each setting its own (a drop
    probability): the rule's code prints it by name (``symgrad.blocks.HyperFloat``), its
    derivation never branches on the value, and ``normalize`` keeps the value it is given.
    ``symgrad trace`` groups instances that differ only in such floats as one block with a hyper."""


@dataclass(frozen=True)
class ParamContext:
    op: str
    name: str
    location: Location
    spatial_dims: int = 0

    def fail(self, problem: str, fix: str) -> SpecError:
        return SpecError(f"{self.op}: argument '{self.name}' {problem}", self.location, fix)


def int_tuple(minimum: int) -> Callable[[Any, ParamContext], tuple[int, ...]]:
    """An int or a list of ``spatial_dims`` ints, each at least ``minimum``; normalised to a tuple."""

    def normalize(value: Any, context: ParamContext) -> tuple[int, ...]:
        n = context.spatial_dims
        values = value if isinstance(value, list) else [value]
        if isinstance(value, list) and len(value) not in (1, n):
            raise context.fail(
                f"has {len(value)} entries but the op has {n} spatial dimensions", f"give one int or a list of {n} ints"
            )
        for item in values:
            if isinstance(item, bool) or not isinstance(item, int):
                raise context.fail(
                    f"must be an int or a list of {n} ints, not {_cut(item)}",
                    f"write e.g. `{context.name}: {max(minimum, 1)}`",
                )
            if item < minimum:
                raise context.fail(
                    f"is {_cut(item)}, below the smallest allowed value {minimum}", f"use a value of at least {minimum}"
                )
            int64(item, context)
        return tuple(values) * (n if len(values) == 1 else 1)  # one value is every dim's, as PyTorch reads [1]

    return normalize


def ints(value, context: ParamContext) -> tuple[int, ...]:
    values = value if isinstance(value, list) else [value]
    if not values or any(isinstance(item, bool) or not isinstance(item, int) for item in values):
        raise context.fail(
            f"must be an int or a list of ints, not {_cut(value)}", f"write e.g. `{context.name}: [0, 2, 1, 3]`"
        )
    return tuple(int64(item, context) for item in values)


def boolean(value, context: ParamContext) -> bool:
    if not isinstance(value, bool):
        raise context.fail(f"must be true or false, not {value!r}", f"write `{context.name}: true`")
    return value


def one_dim(value: Any, context: ParamContext) -> int:
    """A dim: one int (not a list, not a bool), within int64; its range is checked against the rank later."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise context.fail(f"must be an int (a dim), not {_cut(value)}", f"write e.g. `{context.name}: 1`")
    return int64(value, context)


def positive_int(value: Any, context: ParamContext) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise context.fail(f"must be a positive int, not {_cut(value)}", f"write e.g. `{context.name}: 1`")
    return int64(value, context)


INT64 = (-(1 << 63), (1 << 63) - 1)
"""The ints PyTorch takes as an int argument (a larger one is an ``OverflowError`` in the generated code)."""


def _cut(value: Any) -> str:
    """``repr(value)``, cut as every name in a message is (``10**400`` is 401 digits)."""
    return cut(repr(value))


def int64(value: int, context: ParamContext) -> int:
    """An int argument that fits int64, as every int PyTorch takes must."""
    if not INT64[0] <= value <= INT64[1]:
        raise context.fail(
            f"is {_cut(value)}, which does not fit a 64-bit int (PyTorch's ints)",
            f"use a value between {INT64[0]} and {INT64[1]}",
        )
    return value


def finite_float(value: Any, context: ParamContext) -> int | float:
    """A number that PyTorch can take as a float argument, kept as written: a finite float, or an int
    that fits int64 (larger ints would be printed as int literals PyTorch cannot convert)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise context.fail(f"must be a number, not {_cut(value)}", f"write e.g. `{context.name}: 0.5`")
    if isinstance(value, float) and not math.isfinite(value):
        raise context.fail(f"must be finite, not {value!r}", "use a finite number")
    if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
        raise context.fail(
            f"is {_cut(value)}, beyond the numbers a 64-bit int or a float holds exactly",
            f"write it as a float, e.g. `{context.name}: 1.0e+30`, or use a smaller value",
        )
    return value


def positive_number(value: Any, context: ParamContext) -> sympy.Expr:
    """A finite number > 0 (``eps``, ``delta``), at least the smallest normal double, so that its
    reciprocal, which the derivation may print, is finite too."""
    exact = number(value, context)
    if not value > 0:
        raise context.fail(f"must be positive, not {value!r}", f"use a positive value, e.g. `{context.name}: 1.0e-5`")
    if value < sys.float_info.min:
        raise context.fail(
            f"is {value!r}, below the smallest normal float {sys.float_info.min!r}",
            f"use a value of at least {sys.float_info.min!r}, e.g. `{context.name}: 1.0e-5`",
        )
    return exact


def nonzero_number(value: Any, context: ParamContext) -> sympy.Expr:
    """A finite number other than 0 (``beta`` of softplus divides by it)."""
    exact = number(value, context)
    if value == 0:
        raise context.fail("must not be 0 (the op divides by it)", f"use e.g. `{context.name}: 1`")
    return exact


def non_negative_number(value: Any, context: ParamContext) -> sympy.Expr:
    """A finite number >= 0 (``beta`` of smooth_l1_loss, which PyTorch takes as 0, meaning l1_loss);
    a positive one at least the smallest normal double."""
    exact = number(value, context)
    if value == 0:
        return exact
    if not value > 0:
        raise context.fail(f"must be zero or positive, not {value!r}", f"use e.g. `{context.name}: 1.0`")
    return positive_number(value, context)


def choice(*allowed: str) -> Callable[[Any, ParamContext], str]:
    def normalize(value: Any, context: ParamContext) -> str:
        if value not in allowed:
            raise context.fail(
                f"must be one of {', '.join(allowed)}, not {value!r}", f"use `{context.name}: {allowed[0]}`"
            )
        return value

    return normalize


def number(value: Any, context: ParamContext) -> sympy.Expr:
    """A finite int or float, kept exact: 0.5 becomes 1/2 so sympy's algebra stays exact. Its domain
    is :func:`finite_float`'s: the code prints it as a literal that PyTorch must take as a number."""
    finite_float(value, context)
    return sympy.Rational(repr(value)) if isinstance(value, float) else sympy.Integer(value)  # the decimal as written


def _text(problem: str | Callable[[], str]) -> str:
    return problem() if callable(problem) else problem


class Checker:
    """Shape checks that fail with the spec's location in numeric mode, and are recorded as
    constraints when shapes are sympy symbols (see ``shapes.py``)."""

    def __init__(self, location: Location, op: str, symbolic: bool = False):
        self.location = location
        self.op = op
        self.symbolic = symbolic
        self.constraints: list[tuple[sympy.Expr, sympy.Expr]] = []
        self.positives: list[sympy.Expr] = []

    def equal(self, left, right, problem: str | Callable[[], str], fix: str) -> None:
        """``problem`` may be a function giving the text, so that no message is formatted (sympy
        printing is slow) unless the check fails."""
        if self.symbolic:
            self.constraints.append((sympy.sympify(left), sympy.sympify(right)))
        elif left != right:
            raise SpecError(f"{self.op}: {_text(problem)}", self.location, fix)

    def positive(self, size, problem: str | Callable[[], str], fix: str) -> None:
        if self.symbolic:
            self.positives.append(sympy.sympify(size))
        elif size < 1:
            raise SpecError(f"{self.op}: {_text(problem)}", self.location, fix)

    def require(self, condition: bool, problem: str, fix: str) -> None:
        """A check on static facts only (ranks, argument values), never on sizes."""
        if not condition:
            raise SpecError(f"{self.op}: {problem}", self.location, fix)


@dataclass
class NodeSymbols:
    """What a rule sees of one node: its operands as symbols, its normalised params, its shapes."""

    name: str
    operands: dict[str, sympy.Expr]
    params: dict[str, Any]
    shapes: dict[str, tuple[int, ...]]
    out_shape: tuple[int, ...]
    locals: list[tuple[sympy.Symbol, sympy.Expr]] = field(default_factory=list)
    notes: dict[sympy.Symbol, str] = field(default_factory=dict)
    """What a local is, for the comment above it in the emitted code."""
    kinds: dict[sympy.Symbol, str] = field(default_factory=dict)
    """Each local's kind (``mask``, ``local``, ...), which the planner reads (a mask is kept as bool)."""
    fused: bool = False
    """Derive for speed: a rule may then use one fused kernel where the readable form uses several."""

    @property
    def out(self) -> sympy.Symbol:
        return tensor(self.name)

    def local(
        self, kind: str, value: sympy.Expr, plain: bool = False, suffix: str = "", note: str = ""
    ) -> sympy.Symbol:
        """Name ``value`` as ``<kind>_<node>[_<suffix>]`` (or just ``kind``) so the emitted code shows it,
        under the comment ``note`` (default: "local gradient of <node>")."""
        symbol = tensor(kind if plain else f"{kind}_{self.name}" + (f"_{suffix}" if suffix else ""))
        if any(existing == symbol for existing, _ in self.locals):
            raise ValueError(f"rule names two locals {symbol}: one would overwrite the other")
        self.locals.append((symbol, value))
        self.kinds[symbol] = kind
        if note:
            self.notes[symbol] = note
        return symbol


@dataclass(frozen=True)
class Sample:
    """One spec-level case of an op (its rule module's ``SAMPLES``): the spec's inputs (name: shape,
    or ``{"shape": ..., "dtype": "int64"}``, the loss's target among them), its layers and ``wrt``.
    The tests in ``tests/rules/`` build each one, generate its module and check it against
    ``torch.autograd`` (float64, gradcheck, gradgradcheck, hvp), print its emitted lines against
    ``tests/rules/expected/emitted/<op>.txt`` and run its fused kernels with gradients of any
    layout. Plain values only: nothing is built at import."""

    id: str
    """The test id, unique among every rule's samples: the op, then what the sample varies."""
    inputs: dict
    layers: list
    wrt: list
    loss: dict | None = None
    """None: ``half_sq_error`` against the input ``y``, summed."""


@dataclass(frozen=True)
class Spelling:
    """One way a model writes the op (its rule module's ``SPELLINGS``), which ``symgrad trace`` must
    record as this op: ``call`` is a Python expression in the argument names of ``shapes``
    (``F.softmax(x, dim=-1)``, ``x.softmax(-1)``) or, with ``module``, one that makes an
    ``nn.Module`` called on them (``nn.Softmax(dim=1)``). ``tests/trace/test_ops.py`` evaluates it
    (``torch``, ``nn``, ``F``, ``math`` and its own small modules in scope), traces it, checks that
    the spec holds this op and compares the generated gradients with autograd through it. A loss's
    spelling gives the ``reduction`` the spec must hold, and ``dtypes`` for int64 labels. A string:
    nothing is built at import."""

    call: str
    shapes: dict | None = None
    """Argument name: shape; None: ``{"x": (2, 3, 8, 8)}``."""
    module: bool = False
    reduction: str | None = None
    dtypes: dict | None = None


@dataclass(frozen=True)
class Forward:
    value: sympy.Expr
    """What the code computes."""
    math: sympy.Expr | None = None
    """How the docs write it, when that differs (``max(0, h)`` for ``F.relu(h)``)."""


class Rule:
    """Base class. Subclasses set the class attributes and implement the three methods."""

    op: ClassVar[str]
    operands: ClassVar[tuple[Operand, ...]]
    params: ClassVar[dict[str, Param]] = {}
    summary: ClassVar[str] = ""
    linear_in: ClassVar[tuple[str, ...]] = ()
    """Operands the op is linear in (each separately): their adjoints are certified exactly."""
    argument_hints: ClassVar[dict[str, str]] = {}
    """The fix to suggest for an argument the op does not take, where a general list would not help."""
    sizes_read: ClassVar[dict[str, tuple[str, int | None]]] = {}
    """Params whose value may be written as an operand's size, ``{param: (operand, axis)}`` (axis None:
    a list of sizes, the operand's last ones): where every instance of a block gives that size (a
    depthwise conv's ``groups``, its weight's out channels; layer_norm's ``normalized_shape``, its
    input's trailing sizes), ``symgrad trace`` writes it ``{like: OPERAND, dims: [AXIS]}``, read at run
    time, so that instances of several widths are one block (``trace.grouping``)."""
    keeps_input_name: ClassVar[bool] = False
    """The output is the input itself, checked (``size_check``): on a spec input, the generated code after it
    reads the input's own name (``x = _size_check(x, ...)``; ``symgrad.reverse``), not the layer's."""

    # ----- how ``symgrad trace`` finds the op in a model ------------------------------------------------
    calls: ClassVar[tuple[str, ...]] = ()
    """The names torch gives the calls that are this op, as ``symgrad trace`` records them: the
    ``torch.nn.functional`` / ``torch`` function, the tensor method, the in-place variant (traced as the
    out-of-place op) and the operator dunders (``add``, ``add_``, ``__add__``, ``__radd__``, ...)."""
    traced_elsewhere: ClassVar[str] = ""
    """Where ``calls`` is empty: which tracer handler makes the op, and from which calls."""
    signature: ClassVar[tuple[str, ...] | None] = None
    """PyTorch's positional argument names, by which a recorded call's arguments are bound; None: read
    from PyTorch's own signature of the op (:func:`torch_signature`), which is right for most ops."""

    # ----- how the tests exercise the op (declared in its module's SAMPLES and SPELLINGS) -----------
    samples: tuple[Sample, ...] = ()
    """Its spec-level cases, from its module's ``SAMPLES[op]`` (set by the registry); every op has
    one."""
    spellings: tuple[Spelling, ...] = ()
    """The ways models write it, from its module's ``SPELLINGS[op]`` (set by the registry)."""

    # ----- what the rest of the pipeline may ask of the op -----------------------------------------------
    is_loss: ClassVar[bool] = False
    """The op reduces to the spec's scalar loss (its ``loss:`` entry), not a layer."""
    broadcasts: ClassVar[bool] = False
    """Its tensor operands broadcast against each other (``x * s``): the reverse walk sums each
    operand's gradient back to that operand's run-time shape."""
    class_targets: ClassVar[bool] = False
    """A loss whose target holds class indices (int64), not values."""
    index_operands: ClassVar[tuple[str, ...]] = ()
    """Operands that hold integer indices (int64 inputs, never differentiated): test inputs are drawn
    below :meth:`index_bound`."""

    float_index_ok: ClassVar[bool] = False
    """Its ``index_operands`` may hold floats too (``cast`` converts an int64 timestep or a float node)."""

    def index_bound(self, shapes: dict, params: dict) -> int:
        """For an op with ``index_operands``: the values its indices stay below, at these operand shapes."""
        raise NotImplementedError

    operand_roles: ClassVar[dict[str, str]] = {}
    """What an operand that is a spec input is, for drawing test inputs: ``weight`` (fan-in scaled),
    ``scale`` (around 1), ``shift`` (around 0) or ``variance`` (positive)."""
    activation_gain: ClassVar[float] = 1.0
    """How much a weight feeding only this op is scaled up so that activations keep their scale
    (He's sqrt(2) after ReLU-like ops, which cut about half of their inputs)."""

    def fan_in_axes(self, rank: int) -> list[int]:
        """For an operand with the ``weight`` role: the axes whose product is the number of terms each
        output sums (``nn.init``'s fan_in)."""
        return [1, *range(2, rank)]

    def reference(self, arguments: dict, params: dict):
        """The op computed by PyTorch's own function (the independent reference in ``check``), from
        the operands and the keyword arguments :meth:`reference_params` gives."""
        import torch  # the rules are sympy-only elsewhere: torch is needed here alone

        function = getattr(torch.nn.functional, self.op, None) or getattr(torch, self.op)
        return function(**arguments, **params)

    per_sample_pullback: ClassVar[Callable | None] = None
    """For ops with a weight: ``per_sample_pullback(node, grad, operand)``, the gradient of each sample's
    loss alone (``symgrad``'s per-sample gradients); None where the op has none."""

    def elements_per_statistic(self, shapes: dict, params: dict) -> int | None:
        """For a normalisation, how many entries each mean and variance is taken over at these operand
        shapes (the test-shape solver keeps it meaningful); None for every other op."""
        return None

    def running_statistics(self, node: "NodeSymbols") -> tuple[str, str, Any] | None:
        """For an op whose forward moves running statistics in place (training-mode batch_norm given
        them): the operands (running_mean, running_var) and the momentum (None: a cumulative average,
        kept by ``symgrad.bind``); None for every other op."""
        return None

    def reference_params(self, params: dict) -> dict:
        """The keyword arguments with which PyTorch's own function computes this op (the independent
        reference in ``check``): the node's params, unless the rule resolved one into another form."""
        return params

    def spatial_dims(self) -> int:
        return 0

    def infer_shape(self, shapes: dict[str, tuple], params: dict[str, Any], check: Checker) -> tuple:
        raise NotImplementedError

    def forward(self, node: NodeSymbols) -> Forward:
        raise NotImplementedError

    def pullback(self, node: NodeSymbols, grad: sympy.Symbol, wanted: frozenset[str]) -> dict[str, sympy.Expr]:
        """The contribution of ``grad`` (the gradient of this node's output) to each wanted operand."""
        raise NotImplementedError

    def table_row(self) -> tuple[str, str, str]:
        """(op, forward, local gradient) in plain text, for ``symgrad ops`` and the docs."""
        raise NotImplementedError
