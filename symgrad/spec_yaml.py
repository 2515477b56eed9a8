"""A spec's YAML, read with the location of every node (``Mapping``, ``Sequence``), and the limits that
keep reading it bounded: size, nesting, node count, and the length of keys and names."""

from __future__ import annotations

import re
from typing import Any

import yaml

from .errors import Location, SpecError, cut

MAX_SPEC_BYTES = 1 << 20
MAX_NESTING = 32
MAX_YAML_NODES = 100_000
MAX_NAME = 64
"""The longest name (and so the longest op name or key) a spec may hold."""
MAX_PATH = 1000
"""The longest module path a spec's ``fingerprint:`` keys (``stages.3.blocks.2.token_mixer...``) may have."""


class SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's booleans: only true, True, TRUE, false, False, FALSE are bools, so a name
    written ``on``, ``off``, ``yes`` or ``no`` (a module's, an input's) stays a string."""


SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)

if getattr(yaml, "__with_libyaml__", False):

    class FastSpecLoader(yaml.cyaml.CParser, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
        """:class:`SpecLoader` on libyaml's parser (PyYAML's ``CSafeLoader`` with the spec's resolvers): the
        same nodes, tags and marks, 10-20x faster on a traced network's spec. Used where it parses; a text
        it refuses is parsed again by :class:`SpecLoader`, whose message and mark the error reports."""

        yaml_implicit_resolvers = SpecLoader.yaml_implicit_resolvers

        def __init__(self, stream):
            yaml.cyaml.CParser.__init__(self, stream)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)

    LOADERS: tuple[type, ...] = (FastSpecLoader, SpecLoader)
else:  # pragma: no cover - PyYAML built without libyaml
    LOADERS = (SpecLoader,)


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
    """Parse ``text`` with :class:`SpecLoader`, keeping the location of every node; a plain key is its text.

    Anchors and aliases are refused outright: a spec never needs them, and refusing them removes
    the "billion laughs" expansion attack. Size, nesting and node count are bounded too.
    """
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise SpecError(
            f"spec is larger than the {MAX_SPEC_BYTES} byte limit",
            Location(file, 1, 1),
            "split it or remove what it does not need",
        )
    for loader_class in LOADERS:
        try:
            value, root = _load(text, file, loader_class)
            break
        except yaml.YAMLError:
            if loader_class is not SpecLoader:
                continue  # the pure-Python loader parses again: its message and mark are the ones reported
            raise
    if not isinstance(value, Mapping):
        raise SpecError(
            "the spec must be a YAML mapping with keys name, inputs, layers, loss, wrt",
            _location(file, root.start_mark),
            "`symgrad spec-help` prints the format",
        )
    return value


def _load(text: str, file: str, loader_class: type) -> tuple[Any, yaml.Node]:
    """The converted document and its root node, read with ``loader_class``; PyYAML's errors as a
    SpecError when ``loader_class`` is the last one tried, else raised as they are."""
    try:
        depth = 0  # the event stream is parsed without recursion; PyYAML's composer recurses, so bound it first
        for event in yaml.parse(text, Loader=loader_class):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise SpecError(
                    "YAML anchors and aliases are not allowed in a spec",
                    _location(file, event.start_mark),
                    "write the value out in full",
                )
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                depth += 1
                if depth > MAX_NESTING + 1:
                    raise SpecError(
                        f"spec is nested deeper than {MAX_NESTING} levels",
                        _location(file, event.start_mark),
                        "flatten the structure; specs need at most 4 levels",
                    )
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                depth -= 1
        loader = loader_class(text)
        try:
            root = loader.get_single_node()
            if root is None:
                raise SpecError(
                    "the spec is empty", Location(file, 1, 1), "start from `symgrad init`, or read `symgrad spec-help`"
                )
            counter = [0]
            value = _convert(root, loader, file, 0, counter)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as error:
        if loader_class is not LOADERS[-1]:
            raise
        mark = error.problem_mark or error.context_mark
        problem = error.problem or error.context or "malformed YAML"
        raise SpecError(
            f"malformed YAML: {problem}",
            _location(file, mark),
            "check the indentation, colons and brackets on this line",
        ) from None
    except yaml.YAMLError as error:  # pragma: no cover - PyYAML raises marked errors for text input
        if loader_class is not LOADERS[-1]:
            raise
        raise SpecError(f"malformed YAML: {error}", Location(file, 1, 1), "fix the YAML syntax") from None
    return value, root


def _convert(node: yaml.Node, loader: SpecLoader, file: str, depth: int, counter: list[int]) -> Any:
    counter[0] += 1
    if counter[0] > MAX_YAML_NODES:
        raise SpecError(
            f"spec has more than {MAX_YAML_NODES} YAML nodes",
            _location(file, node.start_mark),
            "a layer chain never needs this many; remove the excess",
        )
    if depth > MAX_NESTING:
        raise SpecError(
            f"spec is nested deeper than {MAX_NESTING} levels",
            _location(file, node.start_mark),
            "flatten the structure; specs need at most 4 levels",
        )
    if isinstance(node, yaml.MappingNode):
        result = Mapping()
        result.location = _location(file, node.start_mark)
        result.key_locations, result.value_locations = {}, {}
        for key_node, value_node in node.value:
            key = _convert(key_node, loader, file, depth + 1, counter)
            if isinstance(key_node, yaml.ScalarNode) and not key_node.style:  # a spec's keys are names: a plain
                key = key_node.value  # key is its text, never null or a number (an input called `null`)
            key_location = _location(file, key_node.start_mark)
            if not isinstance(key, str):
                raise SpecError(
                    f"mapping key {cut(repr(key))} is not a string", key_location, "use a plain name as the key"
                )
            limit = MAX_PATH if "." in key else MAX_NAME  # a module path (fingerprint:) or a name
            if len(key) > limit:  # no key or name (an input's, a block's) of a spec is this long: echoed cut
                raise SpecError(
                    f"key {cut(key)!r} is {len(key)} characters, longer than any key or name a spec holds",
                    key_location,
                    f"shorten the name to at most {limit} characters (`symgrad spec-help` lists the keys)",
                )
            if key in result:
                first = result.key_locations[key]
                raise SpecError(
                    f"duplicate key '{key}' (first given on line {first.line})", key_location, "remove one of the two"
                )
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
        raise SpecError(
            f"the number {cut(node.value)} has {len(node.value)} characters, too long to read",
            _location(file, node.start_mark),
            "write a number that fits a 64-bit int or a float",
        ) from None
