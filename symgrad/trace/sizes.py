"""Sizes that remember where they were read: ``B, N, C = x.shape`` in traced code gives ints that carry
``x.shape[0]``, ``x.shape[1]``, ``x.shape[2]`` along, through the arithmetic the code does with them
(``B * C * num_patch_h``, ``h // 2``, ``math.ceil(W / 2)``, einops' products of axis lengths).

A reshape, view or expand then writes each size as the spec's ``{like: NODE, dims: [...]}`` where it is a
product of one node's dims, or ``{like: NODE, size: 'shape[2] // 2'}`` for another expression of them,
instead of guessing from the numbers. What no such form holds stays a number (or the reshape's one -1),
and the second run, at other sizes, refuses it if it follows the input: never frozen.

``W % 2``, ``math.floor(H)`` and ``round(T)`` stay traced sizes; ``int(T)`` and ``len(x[0])`` are plain ints
whatever a size returns (Python makes them so), and the trace refuses them in one line where the code compares
them (a branch it could not check at run time).

``TracedSize`` is an ``int``: torch, einops and the user's code take it as one. Its hash is the int's, so
``{(H, W): ...}`` caches keep working; einops' own cache of shapes is bypassed while tracing, so that each
call's sizes carry that call's tensor.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import math
import sys
import textwrap
from typing import Any, Iterator

import sympy
import torch

from .errors import Refusal


class Dim(sympy.Symbol):
    """``tensor.shape[dim]`` of the ``index``-th tensor whose size the code read (``Recorder.size_tensors``)."""

    def __new__(cls, index: int, dim: int):
        symbol = super().__new__(cls, f"size_{index}_{dim}", integer=True, positive=True)
        symbol.index, symbol.dim = index, dim
        return symbol

    def __getnewargs_ex__(self):
        return (self.index, self.dim), {}


def _expr(value: Any) -> sympy.Expr | None:
    if isinstance(value, (TracedSize, TracedFloat)):
        return value.expr
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return sympy.Integer(value) if isinstance(value, int) else None


def _combine(name: str, function, reflected: bool = False, floating: bool = False):
    """An arithmetic dunder: the int's result, carrying the sympy expression of the same operation."""

    def method(self, other):
        result = getattr(int if not isinstance(self, float) else float, name)(self, other)
        if result is NotImplemented or isinstance(result, bool):
            return result
        theirs = _expr(other)
        if theirs is None or not isinstance(result, (int, float)):
            return result
        left, right = (theirs, self.expr) if reflected else (self.expr, theirs)
        expr = function(left, right)
        if isinstance(result, float) and not float(result).is_integer() and not floating:
            return result
        return (TracedFloat if isinstance(result, float) else TracedSize)(result, expr)

    return method


def _floor_div(a, b):
    return sympy.floor(a / b)


COMPARED: list | None = None
"""While the recorder runs: each comparison of a size computed from tensor sizes with another size, as
``(relation, left, right, outcome, frame)`` (``new_h != H`` in timm's MobileViT block, which decides whether
it interpolates): the recorder keeps the user's own and the walk writes each as a ``size_check`` layer."""


class _At:
    """The frame of a comparison as it was then: its line is the comparison's (``if t > 1:``), where the frame's
    own ``f_lineno`` moves on to the call the recorder hands the comparison to."""

    __slots__ = ("f_code", "f_lineno", "f_back")

    def __init__(self, frame):
        self.f_code, self.f_lineno, self.f_back = frame.f_code, frame.f_lineno, frame.f_back


def _compare(name: str, relation: str):
    def method(self, other):
        result = getattr(int if isinstance(self, int) else float, name)(self, other)
        theirs = _expr(other)
        if (
            COMPARED is not None
            and isinstance(result, bool)
            and theirs is not None
            and (self.expr.free_symbols or theirs.free_symbols)
        ):
            COMPARED.append((relation, self.expr, theirs, result, _At(sys._getframe(1))))
        return result

    return method


def _comparisons(cls):
    """``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=`` of a traced size, recorded (:data:`COMPARED`)."""
    for name, relation in (
        ("__eq__", "eq"),
        ("__ne__", "ne"),
        ("__lt__", "lt"),
        ("__le__", "le"),
        ("__gt__", "gt"),
        ("__ge__", "ge"),
    ):
        setattr(cls, name, _compare(name, relation))
    return cls


@_comparisons
class TracedSize(int):
    """An int computed from tensor sizes, with ``expr``, the sympy expression of :class:`Dim` it equals."""

    def __new__(cls, value: int, expr: sympy.Expr):
        made = super().__new__(cls, int(value))
        made.expr = expr
        return made

    __hash__ = int.__hash__
    __add__ = _combine("__add__", lambda a, b: a + b)
    __radd__ = _combine("__radd__", lambda a, b: a + b, reflected=True)
    __sub__ = _combine("__sub__", lambda a, b: a - b)
    __rsub__ = _combine("__rsub__", lambda a, b: a - b, reflected=True)
    __mul__ = _combine("__mul__", lambda a, b: a * b)
    __rmul__ = _combine("__rmul__", lambda a, b: a * b, reflected=True)
    __floordiv__ = _combine("__floordiv__", _floor_div)
    __rfloordiv__ = _combine("__rfloordiv__", _floor_div, reflected=True)
    __truediv__ = _combine("__truediv__", lambda a, b: a / b, floating=True)
    __rtruediv__ = _combine("__rtruediv__", lambda a, b: a / b, reflected=True, floating=True)

    __mod__ = _combine("__mod__", sympy.Mod)  # if W % 2 == 1: F.pad(...) is a branch on the size, checked
    __rmod__ = _combine("__rmod__", sympy.Mod, reflected=True)

    def __neg__(self):
        return TracedSize(-int(self), -self.expr)

    def __pos__(self):
        return self

    def __floor__(self):  # math.floor, math.ceil, math.trunc, round of a size: the size itself, still traced
        return self

    __ceil__ = __trunc__ = __floor__

    def __round__(self, ndigits=None):
        return self

    def __index__(self):
        return int(self)

    def __int__(self):
        """``int(x.shape[1])``: Python makes a plain int of what this returns, so a comparison of it records
        no check; where the code compares it, the trace refuses (:func:`refuse_plain_compared`)."""
        if COMPARED is not None and self.expr.free_symbols:
            refuse_plain_compared(sys._getframe(1), "int", "int(x.shape[1])")
        return int.__int__(self)

    def __repr__(self):
        return int.__repr__(self)


@_comparisons
class TracedFloat(float):
    """A size divided by a number (``W / 2``): ``math.ceil`` and ``math.floor`` of it are sizes again."""

    def __new__(cls, value: float, expr: sympy.Expr):
        made = super().__new__(cls, value)
        made.expr = expr
        return made

    __hash__ = float.__hash__

    def __ceil__(self):
        return TracedSize(math.ceil(float(self)), sympy.ceiling(self.expr))

    def __floor__(self):
        return TracedSize(math.floor(float(self)), sympy.floor(self.expr))

    __mul__ = _combine("__mul__", lambda a, b: a * b, floating=True)
    __rmul__ = _combine("__rmul__", lambda a, b: a * b, reflected=True, floating=True)


class PlainCompared(Refusal):
    """A plain int made of a size (``int(x.shape[1])``), compared: :func:`refuse_plain_compared`."""


_COMPARED_AT: dict[tuple, bool] = {}
"""``(code, line, function)`` -> whether the code compares what the call of ``function`` there makes."""


def refuse_plain_compared(frame, function: str, example: str) -> None:
    """Refuse, in one line, a plain int made of a size (``int(x.shape[1])``, ``len(x[0])``: Python makes it
    plain whatever the size returns) where the user's code at ``frame`` compares it, directly or through the
    name it is given (``t = int(x.shape[1])`` ... ``if t > 1:``): the branch would be taken at every size
    without a check (a silent wrong result where it comes out otherwise)."""
    from .frames import is_users

    while frame is not None and not is_users(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return
    key = (frame.f_code, frame.f_lineno, function)
    if key not in _COMPARED_AT:
        _COMPARED_AT[key] = _compares_call(frame.f_code, frame.f_lineno, function)
    if _COMPARED_AT[key]:
        raise PlainCompared(
            f"{frame.f_code.co_filename}:{frame.f_lineno}: error: the code compares {function}() of a tensor's "
            f"size, a plain int, so the trace cannot check the branch at run time (fix: compare the size itself, "
            f"e.g. x.shape[1], not {example})"
        )


def _compares_call(code, line: int, function: str) -> bool:
    """Whether the source of ``code`` compares the result of a call of ``function`` on ``line`` (through
    arithmetic, or a name it is assigned to)."""
    try:
        lines, first = inspect.getsourcelines(code)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return False
    line -= max(first, 1) - 1
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for call in ast.walk(tree):
        if not (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == function
            and call.lineno <= line <= (call.end_lineno or call.lineno)
        ):
            continue
        node = call
        while isinstance(parents.get(node), (ast.BinOp, ast.UnaryOp)):
            node = parents[node]
        parent = parents.get(node)
        if isinstance(parent, ast.Compare):
            return True
        targets = parent.targets if isinstance(parent, ast.Assign) else [getattr(parent, "target", None)]
        names = {target.id for target in targets if isinstance(target, ast.Name)}
        if names and any(
            isinstance(name, ast.Name) and name.id in names
            for compare in ast.walk(tree)
            if isinstance(compare, ast.Compare)
            for side in (compare.left, *compare.comparators)
            for name in ast.walk(side)
        ):
            return True
    return False


def traced_shape(index: int, shape: torch.Size) -> torch.Size:
    """``shape`` with each entry a :class:`TracedSize` of its dim."""
    return torch.Size([TracedSize(size, Dim(index, dim)) for dim, size in enumerate(shape)])


def traced(index: int, tensor: torch.Tensor, name: str, arguments: tuple, result: Any) -> Any:
    """The result of a size query (``x.shape``, ``x.size()``, ``x.size(1)``, ``x.numel()``), carrying its dims."""
    if name == "shape" or (name == "size" and len(arguments) == 1):
        return traced_shape(index, result) if isinstance(result, torch.Size) else result
    if name == "size" and isinstance(result, int) and len(arguments) == 2 and isinstance(arguments[1], int):
        return TracedSize(result, Dim(index, arguments[1] % max(tensor.dim(), 1)))
    if name in ("numel", "nelement") and isinstance(result, int):
        return TracedSize(result, sympy.Mul(*(Dim(index, dim) for dim in range(tensor.dim()))))
    if name == "__len__" and COMPARED is not None:  # len(x[0]): Python makes the result a plain int
        refuse_plain_compared(sys._getframe(1), "len", "len(x[0])")
    return result


def shape_text(expr: sympy.Expr) -> str | None:
    """``expr`` in the spec's size language (``spec.size_expression``): ``shape[i]`` for a :class:`Dim`."""
    if isinstance(expr, Dim):
        return f"shape[{expr.dim}]"
    if expr.is_Integer:
        return str(int(expr))
    if isinstance(expr, sympy.Mod):  # the size's remainder, Python's %: ``shape[3] % 2``
        inner = shape_text(expr.args[0])
        if inner is None or not expr.args[1].is_Integer or expr.args[1] < 1:
            return None
        return f"({inner}) % {expr.args[1]}" if " " in inner else f"{inner} % {expr.args[1]}"
    if isinstance(expr, (sympy.floor, sympy.ceiling)):
        numerator, denominator = sympy.fraction(sympy.together(expr.args[0]))
        inner = shape_text(numerator)
        if inner is None or not denominator.is_Integer or denominator < 1:
            return None
        inner = f"({inner})" if " " in inner else inner
        return f"{inner} // {denominator}" if isinstance(expr, sympy.floor) else f"ceil({inner} / {denominator})"
    if expr.is_Mul or expr.is_Add:
        parts = [shape_text(arg) for arg in expr.args]
        if any(part is None for part in parts):
            return None
        if expr.is_Add:  # * and // bind tighter than +
            return " + ".join(parts)
        return " * ".join(
            f"({part})" if isinstance(arg, (sympy.Add, sympy.floor, sympy.Mod)) else part
            for arg, part in zip(expr.args, parts)
        )
    return None


def spec_size(value: Any, resolve) -> dict | None:
    """``{like: NODE, dims: [...]}`` for a traced size that is a product of one node's dims, ``{like: NODE, size:
    'shape[2] // 2 * (shape[3] // 2)'}`` for another expression of them; None when it reads several nodes or
    none (``resolve`` maps a :class:`Dim` to ``(node, dim)``, or None where its tensor is no node)."""
    expr = getattr(value, "expr", None)
    if not isinstance(value, TracedSize) or expr is None or not expr.free_symbols:
        return None
    found = [resolve(symbol) for symbol in expr.free_symbols]
    if any(item is None for item in found) or len({node for node, _ in found}) != 1:
        return None
    node = found[0][0]
    factors = sympy.Mul.make_args(expr)
    if all(isinstance(factor, Dim) for factor in factors) and len(set(factors)) == len(factors):
        return {"like": node, "dims": sorted(factor.dim for factor in factors)}
    text = shape_text(expr)
    if text is None:
        return None
    try:  # the tracer writes only what the spec reads back to the same value
        from ..spec_values import size_expression

        by_dim = {symbol.dim: symbol for symbol in expr.free_symbols}
        if sympy.simplify(size_expression(text, lambda dim: by_dim[dim]) - expr) != 0:
            return None
    except (ValueError, KeyError):
        return None
    return {"like": node, "size": text}


class _Shown(sympy.printing.str.StrPrinter):
    def _print_Mod(self, expr):
        return f"{self.parenthesize(expr.args[0], sympy.printing.precedence.PRECEDENCE['Mul'])} % {expr.args[1]}"

    def _print_ceiling(self, expr):
        return f"ceil({self._print(expr.args[0])})"


def shown(expr: sympy.Expr) -> str:
    """``expr`` as a person reads it in a message: ``x.shape[3] % 2``, ``ceil(x.shape[2]/2)``."""
    return _Shown().doprint(expr)


def has_dims(value: Any) -> bool:
    """Whether ``value`` is a size computed from tensor sizes."""
    return isinstance(value, TracedSize) and bool(value.expr.free_symbols)


@contextlib.contextmanager
def einops_uncached() -> Iterator[None]:
    """einops keeps each shape's recipe in an ``lru_cache`` keyed by the sizes' values: while tracing, every
    call computes its own, so that its sizes carry its own tensor's dims."""
    module = sys.modules.get("einops.einops")
    cached = getattr(module, "_reconstruct_from_shape", None)
    uncached = getattr(module, "_reconstruct_from_shape_uncached", None)
    if cached is None or uncached is None:
        yield
        return
    module._reconstruct_from_shape = uncached
    try:
        yield
    finally:
        module._reconstruct_from_shape = cached


def spec_sizes(values, node_of, tensors: list[torch.Tensor], spare: bool = True) -> list | None:
    """The spec's list for a reshape's or expand's sizes when any carries dims (None otherwise: the caller
    matches the numbers as before): each size a ``{like: ...}`` where it is one node's dims, a number where it
    is one (a literal, or what no form holds), and, with ``spare``, the one size no form holds as -1 when the
    list has no -1 yet (``C // heads`` in einops' ``b (head c) h w`` reshape)."""
    if not any(has_dims(value) for value in values):
        return None

    def resolve(dim: Dim):
        found = node_of(tensors[dim.index]) if dim.index < len(tensors) else None
        return (found, dim.dim) if isinstance(found, str) else None

    entries: list[Any] = [spec_size(value, resolve) or int(value) for value in values]
    unexpressed = [
        position for position, value in enumerate(values) if has_dims(value) and not isinstance(entries[position], dict)
    ]
    if spare and len(unexpressed) == 1 and -1 not in entries:
        entries[unexpressed[0]] = -1
    return entries
