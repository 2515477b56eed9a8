"""Blocks from the model's own structure: the instances of one module class that run the same ops.

``symgrad trace`` groups the traced layers by the ``nn.Module`` they ran in. A submodule (not a plain
``Sequential``, ``ModuleList`` or ``ModuleDict``, which hold no ops of their own; a class derived
from one is its author's block) whose layers are contiguous, read the rest of the network through a
few tensors and hand back one, is a candidate instance; candidates with the same class, the same ops and arguments, the same parameter
keys and the same operand ranks and size-1 axes (what a derivation may depend on besides sizes) are
instances of one block, written once under ``blocks:`` and used with ``prefix:`` (its module path),
as the model's author wrote the class once. Channel counts differ freely between instances: they
are the parameters' sizes, read at run time. A candidate without a twin stays inline.
"""

from __future__ import annotations

import re

import torch

CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


def _references(value, known: set[str]) -> list[str]:
    if isinstance(value, str):
        return [value] if value in known else []
    if isinstance(value, dict) and "like" in value:
        return [value["like"]] if value["like"] in known else []
    if isinstance(value, list):
        return [name for item in value for name in _references(item, known)]
    return []


def _renamed(value, names: dict[str, str]):
    if isinstance(value, str):
        return names.get(value, value)
    if isinstance(value, dict) and "like" in value:
        return {**value, "like": names.get(value["like"], value["like"])}
    if isinstance(value, list):
        return [_renamed(item, names) for item in value]
    return value


def _snake(name: str) -> str:
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
    text = re.sub(r"[^a-z0-9_]", "_", text).strip("_")
    return text if text and text[0].isalpha() else f"block_{text}"


def group_blocks(spec: dict, modules_of_layers: list[str], modules: dict[str, torch.nn.Module],
                 shapes: dict[str, tuple], reserved: set[str]) -> dict:
    """``spec`` (the traced document) with repeated submodules turned into blocks; unchanged when
    there are none. ``modules_of_layers``: each layer's innermost module path; ``shapes``: every
    node's shape at the traced size; ``reserved``: names a block may not take (ops, tensors)."""
    layers = spec["layers"]
    sources = {name: entry.get("source") for name, entry in spec["inputs"].items()}
    known = set(spec["inputs"]) | {layer["out"] for layer in layers}
    readers_after = _last_readers(spec)
    candidates = []
    for path in sorted({prefix for module in modules_of_layers for prefix in _prefixes(module)}, key=_depth):
        module = modules.get(path)
        if module is None or type(module) in CONTAINERS or next(iter(module.children()), None) is None:
            continue
        inside = [index for index, module_path in enumerate(modules_of_layers)
                  if module_path == path or module_path.startswith(path + ".")]
        if len(inside) < 2 or inside != list(range(inside[0], inside[-1] + 1)):
            continue
        candidate = _candidate(path, type(module).__name__, inside, layers, sources, known, readers_after, shapes)
        if candidate is not None:
            candidates.append(candidate)
    counts: dict = {}
    for candidate in candidates:
        counts[candidate["key"]] = counts.get(candidate["key"], 0) + 1
    chosen, covered = [], set()
    for candidate in candidates:  # outermost first: a repeated module's own repeated parts stay inside it
        span = set(candidate["indices"])
        if counts[candidate["key"]] >= 2 and not span & covered:
            chosen.append(candidate)
            covered |= span
    chosen = [candidate for candidate in chosen if sum(other["key"] == candidate["key"] for other in chosen) >= 2]
    if not chosen:
        return spec
    blocks, names = {}, {}
    taken = set(reserved) | known
    for candidate in sorted(chosen, key=lambda item: item["indices"][0]):
        if candidate["key"] not in names:
            base = _snake(candidate["class"])
            name, number = base, 2
            while name in taken:
                name, number = f"{base}_{number}", number + 1
            taken.add(name)
            names[candidate["key"]] = name
            blocks[name] = candidate["block"]
    start_of = {candidate["indices"][0]: candidate for candidate in chosen}
    covered = {index for candidate in chosen for index in candidate["indices"]}
    renamed: dict[str, str] = {}  # an instance's output is called as its module is (layer1_0)
    for candidate in chosen:
        plain = re.sub(r"[^A-Za-z0-9_]", "_", candidate["path"])
        if plain[0].isalpha() and plain not in taken:
            renamed[candidate["output"]] = plain
            taken.add(plain)
    new_layers = []
    for index, layer in enumerate(layers):
        if index in start_of:
            candidate = start_of[index]
            external = [renamed.get(name, name) for name in candidate["external"]]
            new_layers.append({"block": names[candidate["key"]],
                               "in": external if len(external) > 1 else external[0],
                               "prefix": candidate["path"], "out": renamed.get(candidate["output"], candidate["output"])})
        elif index not in covered:
            new_layers.append({key: value if key in ("op", "out") else _renamed(value, renamed)
                               for key, value in layer.items()})
    loss = {key: value if key == "op" else _renamed(value, renamed) for key, value in spec["loss"].items()}
    return {**spec, "blocks": blocks, "layers": new_layers, "loss": loss}


def _prefixes(path: str) -> list[str]:
    parts = path.split(".") if path else []
    return [".".join(parts[:end]) for end in range(1, len(parts) + 1)]


def _depth(path: str) -> tuple:
    return (path.count("."), path)


def _last_readers(spec: dict) -> dict[str, int]:
    """Each node's last reading layer (the loss counts as one past the end)."""
    known = set(spec["inputs"]) | {layer["out"] for layer in spec["layers"]}
    last = {}
    for index, layer in enumerate(spec["layers"]):
        for key, value in layer.items():
            if key not in ("op", "out"):
                for name in _references(value, known):
                    last[name] = index
    for key in ("in", "target"):
        value = spec["loss"].get(key)
        if value in known:
            last[value] = len(spec["layers"])
    if "in" not in spec["loss"] and spec["layers"]:
        last[spec["layers"][-1]["out"]] = len(spec["layers"])
    return last


def _local_name(name: str) -> str:
    """``name`` as a block-local name the spec accepts (``0_weight``, a Sequential child's: ``m0_weight``)."""
    from ..spec import check_identifier

    if name and check_identifier(name) is None:
        return name
    name = f"m{name}" if name and name[0].isdigit() else f"v_{name}"
    return name if check_identifier(name) is None else ""  # "": no such name; the candidate is not a block


def _signature(shape: tuple) -> tuple:
    return (len(shape), tuple(axis for axis, size in enumerate(shape) if size == 1))


def _candidate(path, class_name, indices, layers, sources, known, last_reader, shapes):
    """The block a run of layers would be, with the key its twins share; None if it is not one."""
    prefix = path + "."
    plain = re.sub(r"[^A-Za-z0-9_]", "_", path) + "_"
    made = {layers[index]["out"] for index in indices}
    outputs = [name for name in made if last_reader.get(name, -1) > indices[-1]]
    if len(outputs) != 1:
        return None
    external, params, local = [], [], {}
    for index in indices:
        layer = layers[index]
        for key, value in layer.items():
            if key in ("op", "out"):
                continue
            for name in _references(value, known):
                if name in made or name in local:
                    continue
                source = sources.get(name)
                if source and source.startswith(prefix):
                    key_name = source[len(prefix):]
                    local[name] = _local_name(re.sub(r"[^A-Za-z0-9_]", "_", key_name))
                    params.append((local[name], key_name))
                else:
                    if sources.get(name):  # another module's parameter: not this block's own
                        return None
                    local[name] = "x" if not external else f"x{len(external) + 1}"
                    external.append(name)
        out = layer["out"]
        local[out] = _local_name(out[len(plain):] if out.startswith(plain) else out)
    own = [local[name] for name in local if name not in external]  # the block's names for params and nodes
    if (len(set(local.values())) != len(local) or "" in own
            or any(value in ("p", "save", "saved", "grad_output") or re.fullmatch(r"x\d*", value) for value in own)):
        return None
    block_layers = []
    for index in indices:
        layer = layers[index]
        block_layers.append({key: (_renamed(value, local) if key != "op" else value) for key, value in layer.items()})
    canonical = repr(block_layers)
    # every tensor's rank and size-1 axes, the block's own nodes' too: a rule may derive otherwise where
    # a size is 1 (an SE gate's expand_as at 1 x 1), so instances that differ there are other blocks
    operand_shapes = tuple(_signature(shapes[name]) for name in local)
    key = (class_name, canonical, tuple(params), operand_shapes)
    block = {"inputs": [local[name] for name in external], "params": {name: key_name for name, key_name in params},
             "layers": block_layers, "output": local[outputs[0]]}
    return {"key": key, "class": class_name, "path": path, "indices": indices, "external": external,
            "output": outputs[0], "block": block}
