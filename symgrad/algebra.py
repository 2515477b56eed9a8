"""The sympy vocabulary the engine derives in.

A tensor is a commutative ``sympy.Symbol``: sympy's ``Add`` and ``Mul`` between tensors mean
elementwise (broadcasting) sum and product, which are commutative and associative, so sympy's
algebra, ``diff`` and ``cse`` apply unchanged. What is not elementwise (a convolution, a sum over
axes, a reshape) is a :class:`TensorOp`: an unevaluated function of tensor operands whose meaning,
code and notation come from one :class:`Primitive`, defined beside the rule that uses it.

Runtime sizes such as ``z.shape[2]`` are :class:`Size` expressions, so shape arithmetic (the
``output_padding`` of a transposed convolution, say) is simplified by sympy and printed as
shape-generic code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import sympy
from sympy.core.symbol import Str
from sympy.printing.precedence import PRECEDENCE


def tensor(name: str) -> sympy.Symbol:
    """The symbol standing for the tensor called ``name``."""
    return sympy.Symbol(name)


class ShapeOf(sympy.Symbol):
    """A tensor's shape (a ``torch.Size``), kept for a backward pass that reads nothing else of the
    tensor: ``up_shape`` for ``up``, so ``up`` itself is freed at its last forward use."""


def shape_text(text: str, tensor: sympy.Basic) -> str:
    """``text.shape``, the shape of the tensor printed as ``text``; ``text`` itself where that
    tensor is a kept :class:`ShapeOf`, which already is one."""
    return text if isinstance(tensor, ShapeOf) else f"{text}.shape"


class Size(sympy.Expr):
    """``tensor.shape[axis]`` (``shape[axis]`` of a :class:`ShapeOf`): a positive integer known
    only when the generated code runs."""

    is_integer = True
    is_positive = True
    is_commutative = True

    def __new__(cls, of: sympy.Symbol, axis: int | sympy.Integer):
        return sympy.Expr.__new__(cls, of, sympy.Integer(axis))

    @property
    def of(self) -> sympy.Symbol:
        return self.args[0]

    @property
    def axis(self) -> int:
        return int(self.args[1])

    def _sympystr(self, printer) -> str:
        return f"{shape_text(self.of.name, self.of)}[{self.axis}]"

    def _latex(self, printer) -> str:
        return rf"\lvert {printer._print(self.of)} \rvert_{{{self.axis}}}"


class OrderedAdd(sympy.Add):
    """``a + b`` of two tensors in the model's order: a sum to sympy (``diff``, ``cse``, the docs' math),
    which keeps its two terms as the trace met them, through renamings (``xreplace``) and the printer. The
    order changes no value (a + b is b + a, bit for bit) but a tensor sum takes its strides from its first
    operand (TensorIterator), and what reads it next (a reduction) rounds in that memory order: ConvNeXt's
    ``input + branch``, the branch permuted to channels_last, printed ``branch + input``, laid the sum out
    channels_last and the next layer norm's float32 sums rounded otherwise. A number term, a sum or a
    negated term (nothing a forward add makes) gives sympy's own sum."""

    def __new__(cls, *args, **options):
        args = tuple(map(sympy.sympify, args))
        if len(args) != 2 or any(arg.is_number or arg.is_Add or arg.could_extract_minus_sign() for arg in args):
            return sympy.Add(*args, **options)
        return cls._from_args(args, is_commutative=True)

    def _torchcode(self, printer) -> str:  # the code printer's: the terms in their order, as the model wrote them
        return " + ".join(printer.parenthesize(term, PRECEDENCE["Add"], strict=False) for term in self.args)


class Params(sympy.Atom):
    """The non-tensor arguments of a :class:`TensorOp`, as one atom so ``cse`` never splits them.

    Values are ints, strings, tuples of them, or sympy expressions of :class:`Size` (whose
    tensors count as free symbols, so dependency tracking still sees them).
    """

    is_commutative = True

    def __new__(cls, items: tuple[tuple[str, Any], ...] = ()):
        obj = sympy.Atom.__new__(cls)
        obj._items = tuple(items)
        return obj

    @classmethod
    def of(cls, **items: Any) -> "Params":
        return cls(tuple(items.items()))

    def _hashable_content(self):
        # canonical strings: sympy sorts terms by comparing this, and symbolic sizes compared with
        # `<` would be relations, not booleans (two strided conv adjoints summed in one branch)
        return tuple(
            (key, sympy.srepr(value) if isinstance(value, sympy.Basic) else repr(value)) for key, value in self._items
        )

    def __getitem__(self, key: str) -> Any:
        return dict(self._items)[key]

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self._items).get(key, default)

    def items(self):
        return self._items

    @property
    def free_symbols(self):
        symbols = set()
        for _, value in self._items:
            for part in value if isinstance(value, tuple) else (value,):
                if isinstance(part, sympy.Basic):
                    symbols |= part.free_symbols
        return symbols

    def _sympystr(self, printer) -> str:
        return ", ".join(f"{key}={value}" for key, value in self._items)

    def _xreplace(self, rule):
        """``xreplace`` reaches the values too: a renamed tensor whose sizes a param reads (a weight
        gradient's ``weight_size``, ``Size(w, 0)``) is renamed there as in the operands."""
        if self in rule:
            return rule[self], True
        items = tuple((key, _replaced(value, rule)) for key, value in self._items)
        if items == self._items:
            return self, False
        return Params(items), True


def _replaced(value, rule):
    if isinstance(value, tuple):
        return tuple(_replaced(part, rule) for part in value)
    return value.xreplace(rule) if isinstance(value, sympy.Basic) else value


@dataclass(frozen=True)
class Primitive:
    """One tensor-valued function: how it is written in PyTorch, in LaTeX and in plain text.

    ``code(operands, params, show)`` gets the operands already printed as Python source and
    returns a Python expression that binds as tightly as a call; ``show`` prints a param value
    (a sympy shape expression, say) in the same language. ``latex`` does the same in LaTeX.
    """

    name: str
    code: Callable[[list[str], Params, Callable[[Any], str]], str]
    latex: Callable[[list[str], Params, Callable[[Any], str]], str]
    inplace: Callable[[list[str], Params, Callable[[Any], str]], str] | None = None
    """The same op overwriting its first operand, for the fast function."""
    tangent: Any = None
    """How the op is differentiated in forward mode (``tangent.py``): ``LINEAR`` (linear in each
    operand separately, so the product rule over operands applies), ``CONSTANT`` (its value does not
    depend on operand values: a shape, a count), a callable ``(expr, tangent_of) -> expr``, or None:
    not differentiable in forward mode, which is an error, never a silent zero."""
    helper: str = ""
    """Source of a module-level function the emitted code calls, written once into every generated
    module whose statements use this primitive."""
    outputs: int | None = None
    """For an op returning a tuple (a fused kernel's gradients): how many entries it has, so that
    the code unpacks it as ``a, b, _ = ...``; None: a single value, or a tuple of unknown length."""
    fresh: bool = False
    """Its output (each entry, for a tuple) is a new tensor, no view of another, that its own autograd
    backward does not read: an in-place op (``inplace``) may overwrite it where nothing else reads it
    (a convolution's, a norm's, a linear map's output)."""
    shape_operands: tuple[int, ...] = ()
    """The operands it reads only for their shape, which ``code`` gets printed as ``x.shape`` (a kept
    :class:`ShapeOf` as itself): the planner may then keep that shape instead of the tensor."""
    layout_operands: tuple[int, ...] = ()
    """The operands its kernel reads only for their sizes, strides, dtype and device, never their values
    (a pooling backward's input, which sizes and lays out the gradient it returns): the planner may
    keep that layout instead and pass an uninitialised tensor of it (:func:`symgrad.kept.kept_as_layouts`)."""
    autocast_operands: tuple[int, ...] = ()
    """The operands its kernel reads cast to autocast's lower precision, as the forward op read them (a
    convolution's input, in its backward): a forward value that only such operands read is saved so
    under autocast, as autograd saves the op's cast copy (its helper takes ``(copy, own dtype)``)."""
    keeps_operands: bool = False
    """Its call keeps its operands itself (a block's forward, in the list its backward reads): a value
    passed to it stays alive anyway, so the planner keeps nothing less of it (:mod:`symgrad.kept`)."""
    recomputable: bool = False
    """A cheap elementwise map of one tensor (an activation): where the backward reads its output and
    keeps its operand anyway, the saving forward does not keep the output; the backward computes it
    again from the operand (``plan._recomputed``), as torch.compile's partitioner does."""
    costly_to_recompute: bool = False
    """Computed again (``recomputable``) only under ``--keep lean``: a transcendental per element (SiLU's
    exp) that costs about as much as the backward kernel it feeds, so ``--keep all`` keeps its output,
    as autograd does (EfficientNet-B0's stages under AMP: 0.93x autograd's speed recomputing, 0.98x not)."""

    def printed(self, operands: list[str], expressions) -> list[str]:
        """``operands`` (printed) with each shape operand read as a shape."""
        return [
            shape_text(text, expression) if index in self.shape_operands else text
            for index, (text, expression) in enumerate(zip(operands, expressions))
        ]


AUTOCAST_SAVING = '''def _saved_as_autocast_casts(value):
    """``value``, read in the backward only as a convolution's input, kept as autograd keeps it:
    under autocast the convolution ran on ``value`` cast to autocast's dtype, and that copy is what
    its backward reads, so the copy is kept, beside ``value``'s own dtype for its gradient:
    ``(copy, dtype)``. Elsewhere (no autocast, a value already in that dtype, float64) ``value``."""
    device = value.device.type
    if not torch.is_autocast_enabled(device):
        return value
    dtype = torch.get_autocast_dtype(device)
    if not value.is_floating_point() or value.dtype in (dtype, torch.float64):
        return value
    return value.to(dtype), value.dtype
'''
"""Emitted into a module that keeps a value so (``Plan.saved_as_autocast_casts``), beside the helpers
of the primitives that read it (``Primitive.autocast_operands``)."""


LINEAR = "linear"
CONSTANT = "constant"


PRIMITIVES: dict[str, Primitive] = {}


def primitive(
    name: str,
    *,
    code,
    latex,
    inplace=None,
    tangent=None,
    helper: str = "",
    outputs: int | None = None,
    fresh: bool = False,
    shape_operands: tuple[int, ...] = (),
    autocast_operands: tuple[int, ...] = (),
    recomputable: bool = False,
    layout_operands: tuple[int, ...] = (),
    keeps_operands: bool = False,
    costly_to_recompute: bool = False,
) -> Primitive:
    """Register the primitive ``name``; each name is defined once, beside the rule that uses it."""
    if name in PRIMITIVES:
        raise ValueError(f"primitive {name!r} is defined twice")
    PRIMITIVES[name] = Primitive(
        name,
        code,
        latex,
        inplace,
        tangent,
        helper,
        outputs,
        fresh,
        shape_operands,
        layout_operands,
        autocast_operands,
        keeps_operands,
        recomputable,
        costly_to_recompute,
    )
    return PRIMITIVES[name]


class TensorOp(sympy.Expr):
    """``primitive(operands...; params)``, unevaluated. Printers ask the primitive how to write it."""

    is_commutative = True

    def __new__(cls, kind: str | Str, params: Params, *operands: sympy.Expr):
        kind = kind if isinstance(kind, Str) else Str(kind)
        if kind.name not in PRIMITIVES:
            raise KeyError(f"no primitive named {kind.name!r}")
        return sympy.Expr.__new__(cls, kind, params, *map(sympy.sympify, operands))

    @property
    def primitive(self) -> Primitive:
        return PRIMITIVES[self.args[0].name]

    @property
    def params(self) -> Params:
        return self.args[1]

    @property
    def operands(self) -> tuple[sympy.Expr, ...]:
        return self.args[2:]

    def _sympystr(self, printer) -> str:
        operands = self.primitive.printed([printer._print(o) for o in self.operands], self.operands)
        return self.primitive.code(operands, self.params, printer._print)

    def _latex(self, printer) -> str:
        return self.primitive.latex([printer._print(o) for o in self.operands], self.params, printer._print)


def laid_out(operands: list[str], params: Params) -> str:
    """A layout operand (``Primitive.layout_operands``, the second) as its kernel is passed it: the
    tensor, or, where the planner kept only its layout (``params["stand_in"]``, :mod:`symgrad.kept`),
    a tensor of that layout whose values are never set, on the device of the gradient (the first),
    made by the ``layout`` primitive's helper."""
    if params.get("stand_in"):
        return f"_stand_in({operands[1]}, {operands[0]}.device)"
    return operands[1]


def show_ints(value: tuple | int) -> str:
    """``(2, 2)`` as ``2``, ``(2, 3)`` as ``(2, 3)``: how a person writes conv arguments."""
    if isinstance(value, tuple):
        if len(set(value)) == 1:
            return str(value[0])
        return "(" + ", ".join(map(str, value)) + ")"
    return str(value)


def keyword_arguments(params: "Params | dict", defaults: dict[str, Any], show: Callable[[Any], str]) -> str:
    """``, stride=2, padding=1``: the params that differ from their defaults, in declaration order."""
    parts = []
    for key, default in defaults.items():
        value = params.get(key, default)
        if _is_default(value, default):
            continue
        if isinstance(value, tuple) and any(isinstance(v, sympy.Basic) for v in value):
            parts.append(f"{key}=(" + ", ".join(show(v) for v in value) + ("," if len(value) == 1 else "") + ")")
        elif isinstance(value, sympy.Basic):
            parts.append(f"{key}={show(value)}")
        elif isinstance(value, str):  # validated against a fixed choice list, never free text
            parts.append(f"{key}={value!r}")
        else:
            parts.append(f"{key}={show_ints(value)}")
    return "".join(", " + part for part in parts)


def _is_default(value: Any, default: Any) -> bool:
    if isinstance(value, tuple) and not isinstance(default, tuple):
        return all(item == default for item in value)
    return value == default


def op(kind: str, *operands: sympy.Expr, **params: Any) -> TensorOp:
    """Shorthand used by rules: ``op("sum", grad, dim=(0, 2, 3))``."""
    return TensorOp(kind, Params.of(**params), *operands)
