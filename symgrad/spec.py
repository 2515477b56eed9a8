"""The YAML spec: the document and the validated spec objects it becomes.

Everything a spec says that later becomes Python source passes through here first: names must be
strict ASCII identifiers that cannot shadow what the generated module uses, and values must be
plain YAML scalars (int, float, bool, string) or lists of them. Op-specific arguments are checked
against the op's rule when the graph is built (``graph.py``), still with the spec's line numbers.

By what it parses: ``spec_yaml.py`` reads the YAML with line numbers, ``spec_values.py`` checks names
and typed values (``{like: NODE}`` sizes included), ``spec_layer.py`` one layer entry, ``blocks.py`` the
``blocks:`` section and block instances, and this file the document: inputs, layers, loss or outputs,
wrt, extras, eval and fingerprint.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from .errors import Location, SpecError, cut
from .spec_layer import Argument, LayerSpec, parse_layer
from .spec_values import (
    MAX_DIM,
    MAX_RANK,
    RESERVED_MODULES,
    RESERVED_NAMES,
    RESERVED_PREFIXES,
    RESERVED_SUFFIXES,
    SOURCE,
    Like,
    check_identifier,
    check_name,
    check_value,
    defined,
    did_you_mean,
    identifier_at,
    input_shape,
    kind_of,
    reference_at,
    reject_unknown_keys,
    size_expression,
    string_at,
    typed_at,
)
from .spec_yaml import MAX_NAME, MAX_SPEC_BYTES, Mapping, Sequence, load_yaml

TOP_LEVEL_KEYS = (
    "name",
    "inputs",
    "blocks",
    "layers",
    "loss",
    "outputs",
    "wrt",
    "extras",
    "eval",
    "fingerprint",
    "guards",
    "checked_functions",
)
REQUIRED_KEYS = ("name", "inputs", "layers", "wrt")
"""And one of ``loss`` or ``outputs``."""
EXTRAS = ("hvp", "per_sample")
"""Optional functions a spec may ask for besides forward and gradients."""
INPUT_KEYS = ("shape", "dtype", "source")
DTYPES = ("float", "int64")
"""``int64`` inputs are class indices (the target of cross_entropy / nll_loss): never differentiated."""
LOSS_STRUCTURE_KEYS = ("op", "in", "target", "reduction")


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]
    location: Location
    dtype: str = "float"
    source: str | None = None
    """The model's ``state_dict()`` key this tensor was traced from (``symgrad.bind`` reads it)."""


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
    guards: dict | None = None
    """What else the traced forward read (``symgrad.guards``: the code it called, values, arguments)."""
    outputs: "OutputsSpec | None" = None
    """A spec that ends in outputs (``outputs:``) instead of a loss; ``loss`` is then None."""
    eval: str | None = None
    """``eval: NAME``: the spec (module) traced from the same model in eval mode, where it differs."""
    checked_functions: tuple = ()
    """The custom ``autograd.Function``s traced through (``symgrad.spec_functions.CheckedFunction``)."""


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
        return OutputsSpec("tensor", (("0", defined(value, location, known), location),), location)
    if isinstance(value, Sequence) and value:
        entries = []
        for index, (item, item_location) in enumerate(zip(value, value.item_locations)):
            if not isinstance(item, str):
                raise SpecError(
                    f"'outputs' entry {cut(repr(item))} is not a node name",
                    item_location,
                    "name a layer's `out:`, e.g. `outputs: [logits, aux]`",
                )
            entries.append((str(index), defined(item, item_location, known), item_location))
        return OutputsSpec("tuple", tuple(entries), location)
    if isinstance(value, Mapping) and value:
        entries = []
        for key, item in value.items():
            if not OUTPUT_KEY.match(key):
                raise SpecError(
                    f"'outputs' key {cut(key)!r} is not an identifier",
                    value.key_locations[key],
                    "name each output with letters, digits and '_'",
                )
            if not isinstance(item, str):
                raise SpecError(
                    f"'outputs' entry {key} is {kind_of(item)}, not a node name",
                    value.value_locations[key],
                    f"write `{key}: NODE` with a layer's `out:`",
                )
            entries.append((key, defined(item, value.value_locations[key], known), value.value_locations[key]))
        return OutputsSpec("dict", tuple(entries), location)
    raise SpecError(
        f"'outputs' must be a node name, a list or a mapping of them, not {kind_of(value)}",
        location,
        "write e.g. `outputs: logits`, `outputs: [logits, aux]` or `outputs: {logits: fc, aux: head}`",
    )


def read_spec(path: str | Path) -> Spec:
    """Read and validate the spec file at ``path``."""
    path = Path(path)
    try:
        data = _read_bounded(path)
        text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # as read_text's newlines
    except FileNotFoundError:
        raise SpecError(f"no spec file at {path}", None, "check the path") from None
    except UnicodeDecodeError as error:
        raise SpecError(
            f"spec is not UTF-8 text ({error.reason} at byte {error.start})",
            Location(str(path), 1, 1),
            "save the file as UTF-8",
        ) from None
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
            kind = (
                "a folder"
                if stat.S_ISDIR(mode)
                else "a named pipe (FIFO)"
                if stat.S_ISFIFO(mode)
                else "a device"
                if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket"
                if stat.S_ISSOCK(mode)
                else "not a regular file"
            )
            raise SpecError(
                f"{path} is {kind}, not a spec file",
                None,
                "pass a .yaml spec file, or on the command line a folder of them",
            )
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
        raise SpecError(
            f"spec is larger than the {MAX_SPEC_BYTES} byte limit",
            Location(str(path), 1, 1),
            "split it or remove what it does not need",
        )
    return b"".join(chunks)


def parse_spec(text: str, file: str = "<spec>") -> Spec:
    """Validate spec ``text``; ``file`` is only used in error messages."""
    document = load_yaml(text, file)
    reject_unknown_keys(document, TOP_LEVEL_KEYS, "top level")
    for key in REQUIRED_KEYS:
        if key not in document:
            raise SpecError(
                f"missing required key '{key}'", document.location, f"add a '{key}:' entry (see `symgrad spec-help`)"
            )

    name = identifier_at(document, "name", kind="module name", prefixes=False)  # a file's name, not a variable
    if name in RESERVED_MODULES or name.startswith("test_"):
        raise SpecError(
            f"module name '{name}' would shadow a Python module or be collected as a test",
            document.value_locations["name"],
            "choose a more specific name, e.g. 'my_model_grad'",
        )

    inputs_map = typed_at(document, "inputs", Mapping, "a mapping of tensor names to {shape: [...]}")
    if not inputs_map:
        raise SpecError("'inputs' is empty", document.value_locations["inputs"], "declare at least one tensor")
    inputs = []
    for input_name, declaration in inputs_map.items():
        location = inputs_map.key_locations[input_name]
        check_name(input_name, location, "tensor name")
        if not isinstance(declaration, Mapping):
            raise SpecError(
                f"input '{input_name}' must be a mapping like {{shape: [8, 3, 32, 32]}}",
                inputs_map.value_locations[input_name],
                "write `NAME: {shape: [...]}`",
            )
        reject_unknown_keys(declaration, INPUT_KEYS, f"input '{input_name}'")
        if "shape" not in declaration:
            raise SpecError(
                f"input '{input_name}' has no shape", declaration.location, "add `shape: [...]` with the example shape"
            )
        dtype = declaration.get("dtype", "float")
        if dtype not in DTYPES:
            raise SpecError(
                f"input '{input_name}' has dtype {cut(repr(dtype))}" + did_you_mean(str(dtype), DTYPES),
                declaration.value_locations["dtype"],
                f"use one of: {', '.join(DTYPES)}",
            )
        source = declaration.get("source")
        if source is not None and not (isinstance(source, str) and SOURCE.match(source)):
            shown = repr(source[:80]) if isinstance(source, str) else kind_of(source)
            raise SpecError(
                f"input '{input_name}' has source {shown}, not a state_dict key",
                declaration.value_locations["source"],
                "write the parameter's or buffer's dotted path, e.g. `source: layer1.0.conv1.weight`",
            )
        inputs.append(InputSpec(input_name, input_shape(declaration, input_name), location, dtype, source))

    from .blocks import check_instance_names, parse_blocks, parse_instance
    from .rules import LAYER_RULES, LOSS_RULES

    blocks = parse_blocks(document, set(LAYER_RULES) | set(LOSS_RULES) | set(inputs_map))
    layers_seq = typed_at(document, "layers", Sequence, "a list of layers, each `- {op: ..., ...}`")
    known = {item.name: item.location for item in inputs}
    previous = inputs[0].name
    layers = []
    for index, layer in enumerate(layers_seq):
        location = layers_seq.item_locations[index]
        if not isinstance(layer, Mapping):
            raise SpecError(
                f"layer {index + 1} must be a mapping like {{op: conv2d, weight: w}}",
                location,
                "write each layer as `- {op: NAME, ...}`",
            )
        if "block" in layer:
            layers.append(parse_instance(layer, index, previous, known, blocks, inputs))
        else:
            layers.append(parse_layer(layer, index, previous, known))
        previous = layers[-1].out
        known[previous] = layers[-1].out_location
    check_instance_names(blocks, layers, known)
    for known_name, location in known.items():  # x_layout beside x: the generated code names x's layout so
        for suffix in RESERVED_SUFFIXES:
            if known_name.endswith(suffix) and known_name[: -len(suffix)] in inputs_map:
                raise SpecError(
                    f"name '{known_name}' is what the generated code calls the {suffix[1:]} of input "
                    f"'{known_name[: -len(suffix)]}'",
                    location,
                    f"rename it, e.g. '{known_name}_in'",
                )

    if ("loss" in document) == ("outputs" in document):
        raise SpecError(
            "the spec needs either 'loss' or 'outputs'"
            if "loss" not in document
            else "the spec has both 'loss' and 'outputs'",
            document.location,
            "end it in `loss: {op: ..., target: ...}` or in `outputs: [NODE, ...]`, not both",
        )
    outputs = loss = None
    if "outputs" in document:
        outputs = _outputs(document, known)
    else:
        loss = _loss(document, known, previous)
    eval_name = None
    if "eval" in document:
        if outputs is None:
            raise SpecError(
                "'eval' is for a spec that ends in outputs",
                document.value_locations["eval"],
                "remove it: a loss-ending spec trains in one mode",
            )
        eval_name = identifier_at(document, "eval", kind="eval module name", prefixes=False)
    wrt = _wrt(document, inputs_map)
    extras = _extras(document)
    fingerprint = None
    if "fingerprint" in document:
        from .fingerprint import parse_fingerprint

        fingerprint = parse_fingerprint(document["fingerprint"], document.value_locations["fingerprint"])
    guards = None
    if "guards" in document:
        from .guards import parse_guards

        guards = parse_guards(document["guards"], document.value_locations["guards"])
    checked = ()
    if "checked_functions" in document:
        from .spec_functions import parse_checked_functions

        checked = parse_checked_functions(document["checked_functions"], document.value_locations["checked_functions"])
    return Spec(
        checked_functions=checked,
        name=name,
        inputs=tuple(inputs),
        layers=tuple(layers),
        loss=loss,
        wrt=tuple(wrt),
        file=file,
        text=text,
        extras=tuple(sorted(set(extras))),
        blocks=blocks,
        outputs=outputs,
        eval=eval_name,
        fingerprint=fingerprint,
        guards=guards,
    )


def _loss(document: Mapping, known: dict[str, Location], previous: str) -> LossSpec:
    loss_map = typed_at(document, "loss", Mapping, "a mapping like {op: half_sq_error, target: y}")
    if "op" not in loss_map:
        raise SpecError("loss has no 'op'", loss_map.location, "add `op: half_sq_error`")
    loss_op = string_at(loss_map, "op")
    source = reference_at(loss_map, "in", known) if "in" in loss_map else (previous, loss_map.location)
    if "target" not in loss_map:
        raise SpecError("loss has no 'target'", loss_map.location, "add `target: NAME` naming the target tensor")
    target = reference_at(loss_map, "target", known)
    reduction = string_at(loss_map, "reduction") if "reduction" in loss_map else None
    reduction_location = loss_map.value_locations.get("reduction", loss_map.location)
    loss_arguments = tuple(
        Argument(key, value, loss_map.value_locations[key])
        for key, value in loss_map.items()
        if key not in LOSS_STRUCTURE_KEYS
    )
    for argument in loss_arguments:
        check_value(argument.value, argument.location, f"argument '{argument.name}'")
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
            raise SpecError(
                f"'wrt' names '{item}', which is not an input" + did_you_mean(item, inputs_map),
                location,
                "wrt may only name tensors declared under 'inputs'",
            )
        if inputs_map[item].get("dtype") == "int64":
            raise SpecError(
                f"'wrt' names '{item}', an int64 tensor of class indices, which has no gradient",
                location,
                f"remove '{item}' from wrt",
            )
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
                raise SpecError(
                    f"unknown extra {cut(repr(item))}" + (did_you_mean(item, EXTRAS) if isinstance(item, str) else ""),
                    item_location,
                    f"extras may be: {', '.join(EXTRAS)}",
                )
            extras.append(item)
    return extras


__all__ = [  # the format's public names, wherever they are defined: ``from symgrad.spec import Like`` stays
    "DTYPES",
    "EXTRAS",
    "MAX_DIM",
    "MAX_NAME",
    "MAX_RANK",
    "MAX_SPEC_BYTES",
    "RESERVED_NAMES",
    "RESERVED_PREFIXES",
    "Argument",
    "InputSpec",
    "LayerSpec",
    "Like",
    "LossSpec",
    "OutputsSpec",
    "Spec",
    "check_identifier",
    "parse_spec",
    "read_spec",
    "size_expression",
]
