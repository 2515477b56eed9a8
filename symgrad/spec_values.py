"""The values a spec holds, each checked where it stands: names (identifiers that cannot shadow what the
generated module uses), sizes read at run time (``{like: NODE}``, :class:`Like`), input shapes, and the
typed fields of a mapping, each refusal one line with a fix."""

from __future__ import annotations

import difflib
import keyword
import re
import sys
from dataclasses import dataclass
from typing import Any

import sympy

from .algebra import Size, tensor
from .errors import Location, SpecError, cut
from .names import generated_names, scan_template, template_names
from .spec_yaml import MAX_NAME, Mapping, Sequence

MAX_RANK = 8
MAX_DIM = 1 << 31

IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}\Z")

# Names the generated module defines or uses itself; a spec name equal to one would shadow it. Most
# are read off the template and the derivation's source (symgrad.names); generation then checks the
# rendered module itself (names.check_module_source), so a name missed here is still refused.
RESERVED_NAMES = (
    frozenset(
        {
            "torch",
            "F",
            "NamedTuple",
            "Gradients",
            "ExplicitGradient",
            "forward",
            "gradients",
            "loss",
            "grad_loss",
            "residual",
            "ctx",
            "self",
            "saved",
            "recompute",
            "grads",
            "loss_with_explicit_backward",
            "hvp",
            "PerSampleGradients",
            "outputs_with_explicit_backward",
        }
    )
    | template_names()[0]
    | generated_names()[1]
    | scan_template("module.py.jinja").top
)
# Prefixes of names the derivation creates (grad_x, mask_relu1, shared_0, ...), read off its source,
# and of the module's per_sample_* functions.
RESERVED_PREFIXES = tuple(sorted(generated_names()[0] | {"per_sample_"}))
# Suffixes the template puts after an input's name (x_layout: x's memory format).
RESERVED_SUFFIXES = tuple(sorted(template_names()[1]))
# Module names that would shadow a package the generated files import when they sit side by side.
RESERVED_MODULES = frozenset(sys.stdlib_module_names) | {
    "torch",
    "pytest",
    "symgrad",
    "numpy",
    "sympy",
    "jinja2",
    "yaml",
    "click",
    "hypothesis",
    "conftest",
}
SOURCE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}(\.[A-Za-z0-9_][A-Za-z0-9_-]{0,63}){0,31}\Z")
"""An input's ``source:``, the ``state_dict()`` key of the model parameter or buffer it was traced
from (``layer1.0.conv1.weight``, ``0.weight`` for an nn.Sequential, ``block1-0.proj.0.weight`` for
torchvision's RegNet, whose module names hold hyphens): dotted parts of letters, digits, ``_`` and ``-``
(not first), nothing else (it is written into the generated module inside double quotes)."""


class HalfDown(sympy.Function):
    """``n // 2`` of a size expression: the pad before, when a size difference is split as evenly as
    ints allow (U-Net's ``diff // 2, diff - diff // 2``). Printed with Python's floor division, in
    parentheses, so that a minus sign in front stays outside it."""

    is_integer = True

    @classmethod
    def eval(cls, n):
        if n.is_Integer:
            return sympy.Integer(int(n) // 2)
        return None

    def _torchcode(self, printer) -> str:
        return f"(({printer._print(self.args[0])}) // 2)"

    def _sympystr(self, printer) -> str:
        return f"(({printer._print(self.args[0])}) // 2)"

    def _latex(self, printer) -> str:
        return rf"\left\lfloor \frac{{{printer._print(self.args[0])}}}{{2}} \right\rfloor"


@dataclass(frozen=True, repr=False)
class Like:
    """``{like: NODE}``: a size argument read at run time from node NODE's spatial dims (its dims from 2
    on), never frozen into the spec. ``interpolate``'s ``size: {like: skip}`` is ``size=skip.shape[2:]``;
    ``pad``'s ``pad: {like: skip}`` pads (or crops) the input's spatial dims to skip's sizes, the
    difference split as U-Net's up-step splits it: ``diff // 2`` before, the rest after.

    The spec gives ``node``; the graph adds its ``rank`` and the layer's own ``input`` node, so that a
    rule's argument normaliser can turn the reference into size expressions (``skip.shape[2]``)."""

    node: str
    location: Location
    rank: int = 0
    input: str | None = None
    input_rank: int = 0
    dims: tuple[int, ...] | None = None
    """In a list of sizes (``reshape``'s ``shape``, ``full``'s ``size``): the product of NODE's sizes at
    these dims (``{like: x, dims: [2, 3]}`` is ``x.shape[2] * x.shape[3]``); None: NODE's size at the
    entry's own position in the list."""
    size: str | None = None
    """A size computed from NODE's sizes, written as Python (``shape[2] // 2 * (shape[3] // 2)``,
    ``4 * shape[0]``, ``ceil(shape[3] / 2)``): MobileViT's patches, einops' axis lengths. Only ints,
    ``shape[i]``, ``+ - * //``, parentheses and ``ceil(a / k)`` are taken (:func:`size_expression`)."""

    def size_at(self, position: int) -> sympy.Expr:
        """The size this reference stands for as entry ``position`` of a list of sizes."""
        dims = self.dims if self.dims is not None else (position,)
        product = sympy.Integer(1)
        for dim in dims:
            product = product * Size(tensor(self.node), dim % self.rank)
        if self.size is not None:
            return size_expression(self.size, lambda dim: Size(tensor(self.node), dim % self.rank))
        return product

    def sizes(self) -> tuple[sympy.Expr, ...]:
        """``(NODE.shape[2], NODE.shape[3], ...)``."""
        return tuple(Size(tensor(self.node), dim) for dim in range(2, self.rank))

    def pads(self) -> tuple[sympy.Expr, ...]:
        """``F.pad``'s list taking the input's spatial dims to NODE's: last dim first, (before, after)."""
        pads: list[sympy.Expr] = []
        for dim in reversed(range(2, self.rank)):
            difference = Size(tensor(self.node), dim) - Size(tensor(self.input), dim)
            pads += [HalfDown(difference), difference - HalfDown(difference)]
        return tuple(pads)

    def __str__(self) -> str:
        dims = "" if self.dims is None else f", dims: [{', '.join(map(str, self.dims))}]"
        dims += "" if self.size is None else f", size: {self.size!r}"
        return f"{{like: {self.node}{dims}}}"

    __repr__ = __str__


LIKE_KEYS = ("like", "dims", "size")


def size_expression(text: str, shape_at) -> sympy.Expr:
    """The sympy value of a ``{like: NODE, size: TEXT}`` size: ``shape_at(i)`` for ``shape[i]``; ValueError
    naming what is not taken (anything but ints, ``shape[i]``, ``+ - * // %``, parentheses, ``ceil(a / k)``)."""
    import ast

    def value(node) -> sympy.Expr:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return sympy.Integer(node.value)
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "shape"
            and isinstance(node.slice, ast.Constant)
            and type(node.slice.value) is int
        ):
            return shape_at(node.slice.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod)):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, (ast.FloorDiv, ast.Mod)):
                if not (right.is_Integer and right > 0):
                    raise ValueError("// and % take a positive int on their right")
                return sympy.floor(left / right) if isinstance(node.op, ast.FloorDiv) else sympy.Mod(left, right)
            return (
                left + right
                if isinstance(node.op, ast.Add)
                else left - right
                if isinstance(node.op, ast.Sub)
                else left * right
            )
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "ceil"
            and not node.keywords
            and len(node.args) == 1
            and isinstance(node.args[0], ast.BinOp)
            and isinstance(node.args[0].op, ast.Div)
        ):
            left, right = value(node.args[0].left), value(node.args[0].right)
            if not (right.is_Integer and right > 0):
                raise ValueError("ceil(a / k) takes a positive int k")
            return sympy.ceiling(left / right)
        raise ValueError(f"{ast.dump(node)[:40]} is not an int, shape[i], + - * // %, or ceil(a / k)")

    if not isinstance(text, str) or len(text) > 400:
        raise ValueError("it must be a string of at most 400 characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError("it is not a Python expression") from None
    return value(tree.body)


def check_identifier(name: str, prefixes: bool = True) -> str | None:
    """Why ``name`` may not appear in generated code, or None if it may; ``prefixes=False``: a module's name,
    never a variable of the code (a class ``MaskHead`` traces as ``mask_head_gradients``)."""
    if not IDENTIFIER.match(name):
        return "must be an ASCII identifier: a letter, then letters, digits or '_' (at most 64 characters)"
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        return "is a Python keyword"
    if name in RESERVED_NAMES:
        return "is a name the generated module uses itself"
    if prefixes and name.startswith(RESERVED_PREFIXES):
        return f"starts with a prefix the generated code reserves ({', '.join(RESERVED_PREFIXES)})"
    return None


def check_name(name: Any, location: Location, kind: str, prefixes: bool = True) -> None:
    if not isinstance(name, str):
        raise SpecError(f"{kind} {name!r} is not a string", location, "use an identifier such as x or w1")
    problem = check_identifier(name, prefixes)
    if problem:
        shown = cut(name)
        raise SpecError(f"{kind} {shown!r} {problem}", location, "rename it, e.g. x, w1 or conv_out")


def check_value(value: Any, location: Location, what: str, depth: int = 0) -> None:
    """Only plain scalars, size references and flat lists of them may be op arguments."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, float, str, Like)):
        return
    if isinstance(value, list) and depth == 0:
        for item in value:
            check_value(item, location, what, depth + 1)
        return
    raise SpecError(
        f"{what} has an unsupported value {str(value)[:40]!r}",
        location,
        "use a number, a name, or a flat list of numbers",
    )


def did_you_mean(word: str, candidates) -> str:
    matches = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean '{matches[0]}'?" if matches else ""


def reject_unknown_keys(mapping: Mapping, allowed, where: str) -> None:
    for key in mapping:
        if key not in allowed:
            raise SpecError(
                f"unknown key '{key}' at {where}" + did_you_mean(key, allowed),
                mapping.key_locations[key],
                f"allowed keys here: {', '.join(allowed)}",
            )


def typed_at(mapping: Mapping, key: str, kind: type, described: str):
    value = mapping[key]
    if not isinstance(value, kind):
        raise SpecError(
            f"'{key}' must be {described}, not {kind_of(value)}",
            mapping.value_locations[key],
            f"write '{key}' as {described}",
        )
    return value


def kind_of(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, Sequence):
        return "a list"
    if value is None:
        return "empty"
    return f"{type(value).__name__} {str(value)[:40]!r}"


def string_at(mapping: Mapping, key: str) -> str:
    value = mapping[key]
    if not isinstance(value, str):
        read = "null" if value is None else str(value).lower() if isinstance(value, bool) else None
        raise SpecError(
            f"'{key}' must be a name, not {kind_of(value)}",
            mapping.value_locations[key],
            f"write '{key}' as a plain name"
            + (f", quoted where YAML reads it as another value (`{key}: '{read}'`)" if read else ""),
        )
    if len(value) > MAX_NAME:  # no op, reduction or tensor has a longer name: echoed cut
        raise SpecError(
            f"'{key}' is {cut(value)!r}, longer than any name ({len(value)} characters)",
            mapping.value_locations[key],
            f"write '{key}' as a name of at most {MAX_NAME} characters"
            + ("; `symgrad ops` lists the ops" if key == "op" else ""),
        )
    return value


def identifier_at(mapping: Mapping, key: str, kind: str, prefixes: bool = True) -> str:
    value = string_at(mapping, key)
    check_name(value, mapping.value_locations[key], kind, prefixes)
    return value


def defined(name: str, location: Location, known: dict[str, Location]) -> str:
    if name not in known:
        raise SpecError(
            f"'{name}' is not defined before this point" + did_you_mean(name, known),
            location,
            "name a declared input or the `out:` of an earlier layer",
        )
    return name


def reference_at(mapping: Mapping, key: str, known: dict[str, Location]) -> tuple[str, Location]:
    value = string_at(mapping, key)
    location = mapping.value_locations[key]
    return defined(value, location, known), location


def input_shape(declaration: Mapping, name: str) -> tuple[int, ...]:
    value = declaration["shape"]
    location = declaration.value_locations["shape"]
    if not isinstance(value, Sequence):
        raise SpecError(
            f"shape of '{name}' must be a list of positive integers, not {kind_of(value)}",
            location,
            "write e.g. `shape: [8, 3, 32, 32]`",
        )
    if not 1 <= len(value) <= MAX_RANK:
        raise SpecError(
            f"shape of '{name}' has {len(value)} dimensions; symgrad supports 1 to {MAX_RANK}",
            location,
            "give the tensor's full example shape",
        )
    for size, item_location in zip(value, value.item_locations):
        if isinstance(size, bool) or not isinstance(size, int):
            raise SpecError(
                f"shape of '{name}' has a non-integer size {size!r}",
                item_location,
                "sizes are whole numbers such as 8 or 128",
            )
        if not 1 <= size <= MAX_DIM:
            raise SpecError(
                f"shape of '{name}' has size {size}; sizes must be between 1 and {MAX_DIM}",
                item_location,
                "use a positive size",
            )
    return tuple(value)


def parse_likes(value: Any, location: Location, key: str, known: dict[str, Location]) -> Any:
    """An argument with ``{like: NODE}`` read as :class:`Like`, itself or as the items of a list."""
    if isinstance(value, Mapping):
        return parse_like(value, location, key, known)
    if isinstance(value, Sequence) and any(isinstance(item, Mapping) for item in value):
        return [
            parse_like(item, item_location, key, known) if isinstance(item, Mapping) else item
            for item, item_location in zip(value, value.item_locations)
        ]
    return value


def parse_like(value: Mapping, location: Location, key: str, known: dict[str, Location]) -> Like:
    """``{like: NODE}``, a size read from an earlier node at run time."""
    reject_unknown_keys(value, LIKE_KEYS, f"argument '{key}'")
    if "like" not in value:
        raise SpecError(
            f"argument '{key}' is a mapping without 'like'",
            location,
            f"write `{key}: {{like: NODE}}` to read the size of node NODE at run time, or give numbers",
        )
    name = string_at(value, "like")
    dims = value.get("dims")
    if dims is not None and (
        not isinstance(dims, list) or not dims or any(isinstance(dim, bool) or not isinstance(dim, int) for dim in dims)
    ):
        raise SpecError(
            f"argument '{key}': dims of {{like: {name}}} must be a list of ints, not {str(dims)[:40]!r}",
            value.value_locations.get("dims", location),
            "write e.g. `{like: x, dims: [2, 3]}`",
        )
    size = value.get("size")
    if size is not None and dims is not None:
        raise SpecError(
            f"argument '{key}': {{like: {name}}} gives both dims and size",
            location,
            "give one: dims for a product of sizes, size for any other expression of them",
        )
    if size is not None:
        try:
            size_expression(size, lambda dim: sympy.Integer(1))
        except ValueError as error:
            raise SpecError(
                f"argument '{key}': size of {{like: {name}}} is {str(size)[:60]!r}: {error}",
                value.value_locations.get("size", location),
                "write e.g. `{like: x, size: 'shape[2] // 2 * (shape[3] // 2)'}`",
            ) from None
    return Like(
        defined(name, value.value_locations["like"], known),
        value.value_locations["like"],
        dims=tuple(dims) if dims is not None else None,
        size=size,
    )


def has_like(value: Any) -> bool:
    """Whether an argument reads a size from a node: ``{like: NODE}``, itself or in a list."""
    return isinstance(value, Like) or (isinstance(value, list) and any(isinstance(item, Like) for item in value))


def shifted(key: str, offset: int) -> str | None:
    """A block's parameter key as the instance's: ``1.weight`` at offset 3 is ``4.weight``; None where
    an offset is given and the key does not start with an index."""
    if not offset:
        return key
    index, _, rest = key.partition(".")
    return f"{int(index) + offset}.{rest}" if index.isdigit() and rest else None
