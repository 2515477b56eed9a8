"""The YAML spec: loading with line numbers, structural validation, and the validated spec objects.

Everything a spec says that later becomes Python source passes through here first: names must be
strict ASCII identifiers that cannot shadow what the generated module uses, and values must be
plain YAML scalars (int, float, bool, string) or lists of them. Op-specific arguments are checked
against the op's rule when the graph is built (``graph.py``), still with the spec's line numbers.

It is one of the longer modules because every key of the format is checked here, each with its own
one-line message and fix; splitting the checks from the objects they build would make each rule of
the format live in two places.
"""

from __future__ import annotations

import difflib
import keyword
import os
import re
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sympy
import yaml

from .algebra import Size, tensor
from .errors import Location, SpecError, cut
from .names import generated_names, scan_template, template_names

MAX_SPEC_BYTES = 1 << 20
MAX_NESTING = 32
MAX_YAML_NODES = 100_000
MAX_RANK = 8
MAX_DIM = 1 << 31

IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}\Z")
MAX_NAME = 64
"""The longest name (and so the longest op name or key) a spec may hold."""
MAX_PATH = 1000
"""The longest module path a spec's ``fingerprint:`` keys (``stages.3.blocks.2.token_mixer...``) may have."""

# Names the generated module defines or uses itself; a spec name equal to one would shadow it. Most
# are read off the template and the derivation's source (symgrad.names); generation then checks the
# rendered module itself (names.check_module_source), so a name missed here is still refused.
RESERVED_NAMES = frozenset(
    {"torch", "F", "NamedTuple", "Gradients", "ExplicitGradient", "forward", "gradients",
     "loss", "grad_loss", "residual", "ctx", "self", "saved", "recompute", "grads", "loss_with_explicit_backward",
     "hvp", "PerSampleGradients"}
) | template_names()[0] | generated_names()[1] | scan_template("module.py.jinja").top \
  | scan_template("structured.py.jinja").top  # both forms: a spec may be generated either way
# Prefixes of names the derivation creates (grad_x, mask_relu1, shared_0, ...), read off its source,
# and of the module's per_sample_* functions.
RESERVED_PREFIXES = tuple(sorted(generated_names()[0] | {"per_sample_"}))
# Suffixes the template puts after an input's name (x_layout: x's memory format).
RESERVED_SUFFIXES = tuple(sorted(template_names()[1]))
# Module names that would shadow a package the generated files import when they sit side by side.
RESERVED_MODULES = frozenset(sys.stdlib_module_names) | {
    "torch", "pytest", "symgrad", "numpy", "sympy", "jinja2", "yaml", "click", "hypothesis", "conftest"}

TOP_LEVEL_KEYS = ("name", "inputs", "blocks", "layers", "loss", "outputs", "wrt", "extras", "eval", "fingerprint")
REQUIRED_KEYS = ("name", "inputs", "layers", "wrt")
"""And one of ``loss`` or ``outputs``."""
EXTRAS = ("hvp", "per_sample")
"""Optional functions a spec may ask for besides forward and gradients."""
INPUT_KEYS = ("shape", "dtype", "source")
SOURCE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}(\.[A-Za-z0-9_][A-Za-z0-9_-]{0,63}){0,31}\Z")
"""An input's ``source:``, the ``state_dict()`` key of the model parameter or buffer it was traced
from (``layer1.0.conv1.weight``, ``0.weight`` for an nn.Sequential, ``block1-0.proj.0.weight`` for
torchvision's RegNet, whose module names hold hyphens): dotted parts of letters, digits, ``_`` and ``-``
(not first), nothing else (it is written into the generated module inside double quotes)."""
DTYPES = ("float", "int64")
"""``int64`` inputs are class indices (the target of cross_entropy / nll_loss): never differentiated."""
LOSS_STRUCTURE_KEYS = ("op", "in", "target", "reduction")
LAYER_STRUCTURE_KEYS = ("op", "in", "out")


# --------------------------------------------------------------------------------------------
# YAML with locations
# --------------------------------------------------------------------------------------------


class Mapping(dict):
    """A YAML mapping that remembers where it, each key and each value stand in the file."""

    location: Location
    key_locations: dict[str, Location]
    value_locations: dict[str, Location]


class Sequence(list):
    """A YAML sequence that remembers where it and each item stand in the file."""

    location: Location
    item_locations: list[Location]


def _location(file: str, mark: yaml.Mark | None) -> Location:
    if mark is None:
        return Location(file, 1, 1)
    return Location(file, mark.line + 1, mark.column + 1)


def load_yaml(text: str, file: str) -> Mapping:
    """Parse ``text`` with PyYAML's safe loader, keeping the location of every node.

    Anchors and aliases are refused outright: a spec never needs them, and refusing them removes
    the "billion laughs" expansion attack. Size, nesting and node count are bounded too.
    """
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise SpecError(f"spec is larger than the {MAX_SPEC_BYTES} byte limit", Location(file, 1, 1),
                        "split it or remove what it does not need")
    try:
        depth = 0  # the event stream is parsed without recursion; PyYAML's composer recurses, so bound it first
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise SpecError("YAML anchors and aliases are not allowed in a spec",
                                _location(file, event.start_mark), "write the value out in full")
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                depth += 1
                if depth > MAX_NESTING + 1:
                    raise SpecError(f"spec is nested deeper than {MAX_NESTING} levels", _location(file, event.start_mark),
                                    "flatten the structure; specs need at most 4 levels")
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                depth -= 1
        loader = yaml.SafeLoader(text)
        try:
            root = loader.get_single_node()
            if root is None:
                raise SpecError("the spec is empty", Location(file, 1, 1),
                                "start from `symgrad init`, or read `symgrad spec-help`")
            counter = [0]
            value = _convert(root, loader, file, 0, counter)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        problem = error.problem or error.context or "malformed YAML"
        raise SpecError(f"malformed YAML: {problem}", _location(file, mark),
                        "check the indentation, colons and brackets on this line") from None
    except yaml.YAMLError as error:  # pragma: no cover - PyYAML raises marked errors for text input
        raise SpecError(f"malformed YAML: {error}", Location(file, 1, 1), "fix the YAML syntax") from None
    if not isinstance(value, Mapping):
        raise SpecError("the spec must be a YAML mapping with keys name, inputs, layers, loss, wrt",
                        _location(file, root.start_mark), "`symgrad spec-help` prints the format")
    return value


def _convert(node: yaml.Node, loader: yaml.SafeLoader, file: str, depth: int, counter: list[int]) -> Any:
    counter[0] += 1
    if counter[0] > MAX_YAML_NODES:
        raise SpecError(f"spec has more than {MAX_YAML_NODES} YAML nodes", _location(file, node.start_mark),
                        "a layer chain never needs this many; remove the excess")
    if depth > MAX_NESTING:
        raise SpecError(f"spec is nested deeper than {MAX_NESTING} levels", _location(file, node.start_mark),
                        "flatten the structure; specs need at most 4 levels")
    if isinstance(node, yaml.MappingNode):
        result = Mapping()
        result.location = _location(file, node.start_mark)
        result.key_locations, result.value_locations = {}, {}
        for key_node, value_node in node.value:
            key = _convert(key_node, loader, file, depth + 1, counter)
            key_location = _location(file, key_node.start_mark)
            if not isinstance(key, str):
                raise SpecError(f"mapping key {cut(repr(key))} is not a string", key_location, "use a plain name as the key")
            limit = MAX_PATH if "." in key else MAX_NAME  # a module path (fingerprint:) or a name
            if len(key) > limit:  # no key or name (an input's, a block's) of a spec is this long: echoed cut
                raise SpecError(f"key {cut(key)!r} is {len(key)} characters, longer than any key or name a spec "
                                f"holds", key_location, f"shorten the name to at most {limit} characters "
                                "(`symgrad spec-help` lists the keys)")
            if key in result:
                first = result.key_locations[key]
                raise SpecError(f"duplicate key '{key}' (first given on line {first.line})", key_location,
                                "remove one of the two")
            result[key] = _convert(value_node, loader, file, depth + 1, counter)
            result.key_locations[key] = key_location
            result.value_locations[key] = _location(file, value_node.start_mark)
        return result
    if isinstance(node, yaml.SequenceNode):
        result = Sequence()
        result.location = _location(file, node.start_mark)
        result.item_locations = []
        for item in node.value:
            result.append(_convert(item, loader, file, depth + 1, counter))
            result.item_locations.append(_location(file, item.start_mark))
        return result
    try:
        return loader.construct_object(node)
    except ValueError:  # an int of more than 4,300 digits (Python's limit on converting a string)
        raise SpecError(f"the number {cut(node.value)} has {len(node.value)} characters, too long to read",
                        _location(file, node.start_mark), "write a number that fits a 64-bit int or a float") from None


# --------------------------------------------------------------------------------------------
# Validated spec
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]
    location: Location
    dtype: str = "float"
    source: str | None = None
    """The model's ``state_dict()`` key this tensor was traced from (``symgrad.bind`` reads it)."""


@dataclass(frozen=True)
class Argument:
    """One op argument as written in the spec, still unchecked against the op's rule."""

    name: str
    value: Any
    location: Location


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
    naming what is not taken (anything but ints, ``shape[i]``, ``+ - * //``, parentheses, ``ceil(a / k)``)."""
    import ast

    def value(node) -> sympy.Expr:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return sympy.Integer(node.value)
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "shape"
                and isinstance(node.slice, ast.Constant) and type(node.slice.value) is int):
            return shape_at(node.slice.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv)):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.FloorDiv):
                if not (right.is_Integer and right > 0):
                    raise ValueError("// takes a positive int on its right")
                return sympy.floor(left / right)
            return left + right if isinstance(node.op, ast.Add) else left - right if isinstance(node.op, ast.Sub) else left * right
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "ceil" and not node.keywords
                and len(node.args) == 1 and isinstance(node.args[0], ast.BinOp) and isinstance(node.args[0].op, ast.Div)):
            left, right = value(node.args[0].left), value(node.args[0].right)
            if not (right.is_Integer and right > 0):
                raise ValueError("ceil(a / k) takes a positive int k")
            return sympy.ceiling(left / right)
        raise ValueError(f"{ast.dump(node)[:40]} is not an int, shape[i], + - * //, or ceil(a / k)")

    if not isinstance(text, str) or len(text) > 400:
        raise ValueError("it must be a string of at most 400 characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError("it is not a Python expression") from None
    return value(tree.body)


@dataclass(frozen=True)
class LayerSpec:
    index: int
    op: str
    sources: tuple[tuple[str, Location], ...]
    """The nodes named by ``in:`` (or the previous node), in order."""
    arguments: tuple[Argument, ...]
    out: str
    location: Location
    op_location: Location
    out_location: Location
    implicit_in: bool = False
    """No ``in:``: ``sources`` is the previous node, which an op that reads no tensor (``full``) ignores."""
    block: str | None = None
    """For a block instance (``{block: NAME, ...}``): the block it uses; ``op`` is its name too."""
    binding: tuple[tuple[str, str], ...] = ()
    """For a block instance: (the block's parameter, the spec input bound to it)."""
    hyper: tuple = ()
    """For a block instance: (hyper name, its int value, where the spec gives it) for each it sets."""
    offset: int = 0
    """For a block instance with ``prefix:``: the index of its first child there (``blocks._offset``)."""


@dataclass(frozen=True)
class LossSpec:
    op: str
    source: tuple[str, Location]
    target: tuple[str, Location]
    reduction: str | None
    """None: the loss op's own default (``sum`` for half_sq_error, ``mean`` for PyTorch's losses)."""
    location: Location
    reduction_location: Location
    arguments: tuple[Argument, ...] = ()
    """The loss op's own arguments (``beta`` of smooth_l1_loss), checked by its rule."""


@dataclass(frozen=True)
class Spec:
    name: str
    inputs: tuple[InputSpec, ...]
    layers: tuple[LayerSpec, ...]
    loss: LossSpec | None
    wrt: tuple[tuple[str, Location], ...]
    file: str
    text: str = field(repr=False)
    extras: tuple[str, ...] = ()
    blocks: dict = field(default_factory=dict)
    """name -> :class:`symgrad.blocks.BlockSpec`, the blocks the layers use (``flatten`` inlines them)."""
    fingerprint: dict | None = None
    """The traced model's submodules (``symgrad.fingerprint``), which ``symgrad.bind`` compares."""
    outputs: "OutputsSpec | None" = None
    """A spec that ends in outputs (``outputs:``) instead of a loss; ``loss`` is then None."""
    eval: str | None = None
    """``eval: NAME``: the spec (module) traced from the same model in eval mode, where it differs."""


@dataclass(frozen=True)
class OutputsSpec:
    """``outputs:``: the tensors a spec ends in, returned as the traced model returns them: one node
    (``outputs: logits``), a tuple (``outputs: [logits, aux]``) or a dict (``outputs: {out: fc, aux: head}``).
    The backward takes their cotangents (``grad_outputs``, one per entry, in this order)."""

    kind: str
    """``tensor``, ``tuple`` or ``dict``."""
    entries: tuple[tuple[str, str, Location], ...]
    """(key, node, where): the key is the dict's key, or the entry's position for a tensor or tuple."""
    location: Location

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(node for _, node, _ in self.entries)


OUTPUT_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
"""A dict output's key: written into the generated module inside double quotes."""


def _outputs(document: Mapping, known: dict[str, Location]) -> OutputsSpec:
    value, location = document["outputs"], document.value_locations["outputs"]
    if isinstance(value, str):
        return OutputsSpec("tensor", (("0", _known(value, location, known), location),), location)
    if isinstance(value, Sequence) and value:
        entries = []
        for index, (item, item_location) in enumerate(zip(value, value.item_locations)):
            if not isinstance(item, str):
                raise SpecError(f"'outputs' entry {cut(repr(item))} is not a node name", item_location,
                                "name a layer's `out:`, e.g. `outputs: [logits, aux]`")
            entries.append((str(index), _known(item, item_location, known), item_location))
        return OutputsSpec("tuple", tuple(entries), location)
    if isinstance(value, Mapping) and value:
        entries = []
        for key, item in value.items():
            if not OUTPUT_KEY.match(key):
                raise SpecError(f"'outputs' key {cut(key)!r} is not an identifier", value.key_locations[key],
                                "name each output with letters, digits and '_'")
            if not isinstance(item, str):
                raise SpecError(f"'outputs' entry {key} is {_kind(item)}, not a node name", value.value_locations[key],
                                f"write `{key}: NODE` with a layer's `out:`")
            entries.append((key, _known(item, value.value_locations[key], known), value.value_locations[key]))
        return OutputsSpec("dict", tuple(entries), location)
    raise SpecError(f"'outputs' must be a node name, a list or a mapping of them, not {_kind(value)}", location,
                    "write e.g. `outputs: logits`, `outputs: [logits, aux]` or `outputs: {logits: fc, aux: head}`")


def read_spec(path: str | Path) -> Spec:
    """Read and validate the spec file at ``path``."""
    path = Path(path)
    try:
        data = _read_bounded(path)
        text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # as read_text's newlines
    except FileNotFoundError:
        raise SpecError(f"no spec file at {path}", None, "check the path") from None
    except UnicodeDecodeError as error:
        raise SpecError(f"spec is not UTF-8 text ({error.reason} at byte {error.start})",
                        Location(str(path), 1, 1), "save the file as UTF-8") from None
    except OSError as error:
        raise SpecError(f"cannot read {path}: {error.strerror}", None, "check the path and permissions") from None
    return parse_spec(text, str(path))


def _read_bounded(path: Path) -> bytes:
    """The bytes of the regular file at ``path``, reading at most one byte past :data:`MAX_SPEC_BYTES`
    (``/dev/zero`` is never read to the end). A folder, pipe, device or socket is refused unread:
    opening a pipe without blocking, and looking at what was opened before reading it."""
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a folder" if stat.S_ISDIR(mode) else "a named pipe (FIFO)" if stat.S_ISFIFO(mode)
                    else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                    else "not a regular file")
            raise SpecError(f"{path} is {kind}, not a spec file", None,
                            "pass a .yaml spec file, or on the command line a folder of them")
        chunks, size = [], 0
        while size <= MAX_SPEC_BYTES:
            chunk = os.read(descriptor, MAX_SPEC_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(descriptor)
    if size > MAX_SPEC_BYTES:
        raise SpecError(f"spec is larger than the {MAX_SPEC_BYTES} byte limit", Location(str(path), 1, 1),
                        "split it or remove what it does not need")
    return b"".join(chunks)


def parse_spec(text: str, file: str = "<spec>") -> Spec:
    """Validate spec ``text``; ``file`` is only used in error messages."""
    document = load_yaml(text, file)
    _reject_unknown_keys(document, TOP_LEVEL_KEYS, "top level")
    for key in REQUIRED_KEYS:
        if key not in document:
            raise SpecError(f"missing required key '{key}'", document.location,
                            f"add a '{key}:' entry (see `symgrad spec-help`)")

    name = _identifier(document, "name", kind="module name")
    if name in RESERVED_MODULES or name.startswith("test_"):
        raise SpecError(f"module name '{name}' would shadow a Python module or be collected as a test",
                        document.value_locations["name"], "choose a more specific name, e.g. 'my_model_grad'")

    inputs_map = _typed(document, "inputs", Mapping, "a mapping of tensor names to {shape: [...]}")
    if not inputs_map:
        raise SpecError("'inputs' is empty", document.value_locations["inputs"], "declare at least one tensor")
    inputs = []
    for input_name, declaration in inputs_map.items():
        location = inputs_map.key_locations[input_name]
        _check_name(input_name, location, "tensor name")
        if not isinstance(declaration, Mapping):
            raise SpecError(f"input '{input_name}' must be a mapping like {{shape: [8, 3, 32, 32]}}",
                            inputs_map.value_locations[input_name], "write `NAME: {shape: [...]}`")
        _reject_unknown_keys(declaration, INPUT_KEYS, f"input '{input_name}'")
        if "shape" not in declaration:
            raise SpecError(f"input '{input_name}' has no shape", declaration.location,
                            "add `shape: [...]` with the example shape")
        dtype = declaration.get("dtype", "float")
        if dtype not in DTYPES:
            raise SpecError(f"input '{input_name}' has dtype {cut(repr(dtype))}" + _did_you_mean(str(dtype), DTYPES),
                            declaration.value_locations["dtype"], f"use one of: {', '.join(DTYPES)}")
        source = declaration.get("source")
        if source is not None and not (isinstance(source, str) and SOURCE.match(source)):
            shown = repr(source[:80]) if isinstance(source, str) else _kind(source)
            raise SpecError(f"input '{input_name}' has source {shown}, not a state_dict key", declaration.value_locations["source"],
                            "write the parameter's or buffer's dotted path, e.g. `source: layer1.0.conv1.weight`")
        inputs.append(InputSpec(input_name, _shape(declaration, input_name), location, dtype, source))

    from .blocks import check_instance_names, parse_blocks, parse_instance
    from .rules import LAYER_RULES, LOSS_RULES

    blocks = parse_blocks(document, set(LAYER_RULES) | set(LOSS_RULES) | set(inputs_map))
    layers_seq = _typed(document, "layers", Sequence, "a list of layers, each `- {op: ..., ...}`")
    known = {item.name: item.location for item in inputs}
    previous = inputs[0].name
    layers = []
    for index, layer in enumerate(layers_seq):
        location = layers_seq.item_locations[index]
        if not isinstance(layer, Mapping):
            raise SpecError(f"layer {index + 1} must be a mapping like {{op: conv2d, weight: w}}", location,
                            "write each layer as `- {op: NAME, ...}`")
        if "block" in layer:
            layers.append(parse_instance(layer, index, previous, known, blocks, inputs))
        else:
            layers.append(_layer(layer, index, previous, known))
        previous = layers[-1].out
        known[previous] = layers[-1].out_location
    check_instance_names(blocks, layers, known)
    for known_name, location in known.items():  # x_layout beside x: the generated code names x's layout so
        for suffix in RESERVED_SUFFIXES:
            if known_name.endswith(suffix) and known_name[:-len(suffix)] in inputs_map:
                raise SpecError(f"name '{known_name}' is what the generated code calls the {suffix[1:]} of input "
                                f"'{known_name[:-len(suffix)]}'", location, f"rename it, e.g. '{known_name}_in'")

    if ("loss" in document) == ("outputs" in document):
        raise SpecError("the spec needs either 'loss' or 'outputs'" if "loss" not in document
                        else "the spec has both 'loss' and 'outputs'", document.location,
                        "end it in `loss: {op: ..., target: ...}` or in `outputs: [NODE, ...]`, not both")
    outputs = loss = None
    if "outputs" in document:
        outputs = _outputs(document, known)
    else:
        loss = _loss(document, known, previous)
    eval_name = None
    if "eval" in document:
        if outputs is None:
            raise SpecError("'eval' is for a spec that ends in outputs", document.value_locations["eval"],
                            "remove it: a loss-ending spec trains in one mode")
        eval_name = _identifier(document, "eval", kind="eval module name")
    wrt = _wrt(document, inputs_map)
    extras = _extras(document)
    fingerprint = None
    if "fingerprint" in document:
        from .fingerprint import parse_fingerprint
        fingerprint = parse_fingerprint(document["fingerprint"], document.value_locations["fingerprint"])
    return Spec(name=name, inputs=tuple(inputs), layers=tuple(layers), loss=loss, wrt=tuple(wrt),
                file=file, text=text, extras=tuple(sorted(set(extras))), blocks=blocks, outputs=outputs, eval=eval_name,
                fingerprint=fingerprint)


def _loss(document: Mapping, known: dict[str, Location], previous: str) -> LossSpec:
    loss_map = _typed(document, "loss", Mapping, "a mapping like {op: half_sq_error, target: y}")
    if "op" not in loss_map:
        raise SpecError("loss has no 'op'", loss_map.location, "add `op: half_sq_error`")
    loss_op = _string(loss_map, "op")
    source = _reference(loss_map, "in", known) if "in" in loss_map else (previous, loss_map.location)
    if "target" not in loss_map:
        raise SpecError("loss has no 'target'", loss_map.location, "add `target: NAME` naming the target tensor")
    target = _reference(loss_map, "target", known)
    reduction = _string(loss_map, "reduction") if "reduction" in loss_map else None
    reduction_location = loss_map.value_locations.get("reduction", loss_map.location)
    loss_arguments = tuple(Argument(key, value, loss_map.value_locations[key])
                           for key, value in loss_map.items() if key not in LOSS_STRUCTURE_KEYS)
    for argument in loss_arguments:
        _check_value(argument.value, argument.location, f"argument '{argument.name}'")
    return LossSpec(loss_op, source, target, reduction, loss_map.location, reduction_location, loss_arguments)


def _wrt(document: Mapping, inputs_map: Mapping) -> list:
    wrt_value = document["wrt"]
    wrt_location = document.value_locations["wrt"]
    if isinstance(wrt_value, str):
        wrt_value, item_locations = [wrt_value], [wrt_location]
    elif isinstance(wrt_value, Sequence):
        item_locations = wrt_value.item_locations
    else:
        raise SpecError("'wrt' must be a list of input names", wrt_location, "write e.g. `wrt: [x, w1]`")
    if not wrt_value:
        raise SpecError("'wrt' is empty", wrt_location, "name at least one input to differentiate by")
    wrt = []
    for item, location in zip(wrt_value, item_locations):
        if not isinstance(item, str):
            raise SpecError(f"'wrt' entry {item!r} is not a name", location, "write input names, e.g. `wrt: [x, w1]`")
        if item not in inputs_map:
            raise SpecError(f"'wrt' names '{item}', which is not an input" + _did_you_mean(item, inputs_map),
                            location, "wrt may only name tensors declared under 'inputs'")
        if inputs_map[item].get("dtype") == "int64":
            raise SpecError(f"'wrt' names '{item}', an int64 tensor of class indices, which has no gradient", location,
                            f"remove '{item}' from wrt")
        if item in (name for name, _ in wrt):
            raise SpecError(f"'wrt' names '{item}' twice", location, "remove the repeat")
        wrt.append((item, location))
    return wrt


def _extras(document: Mapping) -> list:
    extras = []
    if "extras" in document:
        value = document["extras"]
        location = document.value_locations["extras"]
        if not isinstance(value, Sequence):
            raise SpecError("'extras' must be a list", location, f"write e.g. `extras: [{EXTRAS[0]}]`")
        for item, item_location in zip(value, value.item_locations):
            if item not in EXTRAS:
                raise SpecError(f"unknown extra {cut(repr(item))}" + (_did_you_mean(item, EXTRAS) if isinstance(item, str) else ""),
                                item_location, f"extras may be: {', '.join(EXTRAS)}")
            extras.append(item)
    return extras


def _layer(layer: Mapping, index: int, previous: str, known: dict[str, Location]) -> LayerSpec:
    if "op" not in layer:
        raise SpecError(f"layer {index + 1} has no 'op'", layer.location,
                        "add `op: NAME` with a torch.nn.functional name, e.g. conv2d; `symgrad ops` lists them")
    op = _string(layer, "op")
    if "in" in layer:
        value = layer["in"]
        if isinstance(value, Sequence):
            if not value:
                raise SpecError("'in' is an empty list", layer.value_locations["in"], "name the input node(s)")
            sources = []
            for item, location in zip(value, value.item_locations):
                if not isinstance(item, str):
                    raise SpecError(f"'in' entry {item!r} is not a node name", location, "name a declared tensor or layer output")
                sources.append((_known(item, location, known), location))
            sources = tuple(sources)
        else:
            sources = (_reference(layer, "in", known),)
    else:
        sources = ((previous, layer.location),)
    if "out" in layer:
        out = _identifier(layer, "out", kind="output name")
        out_location = layer.value_locations["out"]
    else:
        out, out_location = f"{op}_{index + 1}" if IDENTIFIER.match(f"{op}_{index + 1}") else f"layer_{index + 1}", layer.location
    if out in known:
        raise SpecError(f"layer output name '{out}' is already used (line {known[out].line})", out_location,
                        "give this layer a unique `out:` name")
    arguments = tuple(Argument(key, _likes(value, layer.value_locations[key], key, known), layer.value_locations[key])
                      for key, value in layer.items() if key not in LAYER_STRUCTURE_KEYS)
    for argument in arguments:
        _check_value(argument.value, argument.location, f"argument '{argument.name}'")
    return LayerSpec(index=index, op=op, sources=sources, arguments=arguments, out=out, location=layer.location,
                     op_location=layer.value_locations["op"], out_location=out_location, implicit_in="in" not in layer)


def _likes(value: Any, location: Location, key: str, known: dict[str, Location]) -> Any:
    """An argument with ``{like: NODE}`` read as :class:`Like`, itself or as the items of a list."""
    if isinstance(value, Mapping):
        return _like(value, location, key, known)
    if isinstance(value, Sequence) and any(isinstance(item, Mapping) for item in value):
        return [_like(item, item_location, key, known) if isinstance(item, Mapping) else item
                for item, item_location in zip(value, value.item_locations)]
    return value


def _like(value: Mapping, location: Location, key: str, known: dict[str, Location]) -> Like:
    """``{like: NODE}``, a size read from an earlier node at run time."""
    _reject_unknown_keys(value, LIKE_KEYS, f"argument '{key}'")
    if "like" not in value:
        raise SpecError(f"argument '{key}' is a mapping without 'like'", location,
                        f"write `{key}: {{like: NODE}}` to read the size of node NODE at run time, or give numbers")
    name = _string(value, "like")
    dims = value.get("dims")
    if dims is not None and (not isinstance(dims, list) or not dims
                             or any(isinstance(dim, bool) or not isinstance(dim, int) for dim in dims)):
        raise SpecError(f"argument '{key}': dims of {{like: {name}}} must be a list of ints, not {str(dims)[:40]!r}",
                        value.value_locations.get("dims", location), "write e.g. `{like: x, dims: [2, 3]}`")
    size = value.get("size")
    if size is not None and dims is not None:
        raise SpecError(f"argument '{key}': {{like: {name}}} gives both dims and size", location,
                        "give one: dims for a product of sizes, size for any other expression of them")
    if size is not None:
        try:
            size_expression(size, lambda dim: sympy.Integer(1))
        except ValueError as error:
            raise SpecError(f"argument '{key}': size of {{like: {name}}} is {str(size)[:60]!r}: {error}",
                            value.value_locations.get("size", location),
                            "write e.g. `{like: x, size: 'shape[2] // 2 * (shape[3] // 2)'}`") from None
    return Like(_known(name, value.value_locations["like"], known), value.value_locations["like"],
                dims=tuple(dims) if dims is not None else None, size=size)


def _check_value(value: Any, location: Location, what: str, depth: int = 0) -> None:
    """Only plain scalars, size references and flat lists of them may be op arguments."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, float, str, Like)):
        return
    if isinstance(value, list) and depth == 0:
        for item in value:
            _check_value(item, location, what, depth + 1)
        return
    raise SpecError(f"{what} has an unsupported value {str(value)[:40]!r}", location,
                    "use a number, a name, or a flat list of numbers")


def _did_you_mean(word: str, candidates) -> str:
    matches = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean '{matches[0]}'?" if matches else ""


def _reject_unknown_keys(mapping: Mapping, allowed, where: str) -> None:
    for key in mapping:
        if key not in allowed:
            raise SpecError(f"unknown key '{key}' at {where}" + _did_you_mean(key, allowed),
                            mapping.key_locations[key], f"allowed keys here: {', '.join(allowed)}")


def _typed(mapping: Mapping, key: str, kind: type, described: str):
    value = mapping[key]
    if not isinstance(value, kind):
        raise SpecError(f"'{key}' must be {described}, not {_kind(value)}", mapping.value_locations[key],
                        f"write '{key}' as {described}")
    return value


def _kind(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, Sequence):
        return "a list"
    if value is None:
        return "empty"
    return f"{type(value).__name__} {str(value)[:40]!r}"


def _string(mapping: Mapping, key: str) -> str:
    value = mapping[key]
    if not isinstance(value, str):
        raise SpecError(f"'{key}' must be a name, not {_kind(value)}", mapping.value_locations[key],
                        f"write '{key}' as a plain name")
    if len(value) > MAX_NAME:  # no op, reduction or tensor has a longer name: echoed cut
        raise SpecError(f"'{key}' is {cut(value)!r}, longer than any name ({len(value)} characters)",
                        mapping.value_locations[key], f"write '{key}' as a name of at most {MAX_NAME} characters"
                        + ("; `symgrad ops` lists the ops" if key == "op" else ""))
    return value


def _identifier(mapping: Mapping, key: str, kind: str) -> str:
    value = _string(mapping, key)
    _check_name(value, mapping.value_locations[key], kind)
    return value


def check_identifier(name: str) -> str | None:
    """Why ``name`` may not appear in generated code, or None if it may."""
    if not IDENTIFIER.match(name):
        return ("must be an ASCII identifier: a letter, then letters, digits or '_' (at most 64 characters)")
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        return "is a Python keyword"
    if name in RESERVED_NAMES:
        return "is a name the generated module uses itself"
    if name.startswith(RESERVED_PREFIXES):
        return f"starts with a prefix the generated code reserves ({', '.join(RESERVED_PREFIXES)})"
    return None


def _check_name(name: Any, location: Location, kind: str) -> None:
    if not isinstance(name, str):
        raise SpecError(f"{kind} {name!r} is not a string", location, "use an identifier such as x or w1")
    problem = check_identifier(name)
    if problem:
        shown = cut(name)
        raise SpecError(f"{kind} {shown!r} {problem}", location, "rename it, e.g. x, w1 or conv_out")


def _known(name: str, location: Location, known: dict[str, Location]) -> str:
    if name not in known:
        raise SpecError(f"'{name}' is not defined before this point" + _did_you_mean(name, known), location,
                        "name a declared input or the `out:` of an earlier layer")
    return name


def _reference(mapping: Mapping, key: str, known: dict[str, Location]) -> tuple[str, Location]:
    value = _string(mapping, key)
    location = mapping.value_locations[key]
    return _known(value, location, known), location


def _shape(declaration: Mapping, name: str) -> tuple[int, ...]:
    value = declaration["shape"]
    location = declaration.value_locations["shape"]
    if not isinstance(value, Sequence):
        raise SpecError(f"shape of '{name}' must be a list of positive integers, not {_kind(value)}", location,
                        "write e.g. `shape: [8, 3, 32, 32]`")
    if not 1 <= len(value) <= MAX_RANK:
        raise SpecError(f"shape of '{name}' has {len(value)} dimensions; symgrad supports 1 to {MAX_RANK}", location,
                        "give the tensor's full example shape")
    for size, item_location in zip(value, value.item_locations):
        if isinstance(size, bool) or not isinstance(size, int):
            raise SpecError(f"shape of '{name}' has a non-integer size {size!r}", item_location,
                            "sizes are whole numbers such as 8 or 128")
        if not 1 <= size <= MAX_DIM:
            raise SpecError(f"shape of '{name}' has size {size}; sizes must be between 1 and {MAX_DIM}", item_location,
                            "use a positive size")
    return tuple(value)
