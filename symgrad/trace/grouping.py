"""Blocks from the model's own structure: the instances of one module class that run the same ops.

``symgrad trace`` groups the traced layers by the ``nn.Module`` they ran in. A submodule (not a plain
``Sequential``, ``ModuleList`` or ``ModuleDict``, which hold no ops of their own, but for a plain
``Sequential`` of leaf modules, named by their classes; a class derived from one is its author's
block) whose layers are contiguous, read the rest of the network through a
few tensors and hand back one, is a candidate instance; candidates with the same class, the same ops and arguments, the same parameter
keys and the same operand ranks and size-1 axes (what a derivation may depend on besides sizes) are
instances of one block, written once under ``blocks:`` and used with ``prefix:`` (its module path),
as the model's author wrote the class once. Channel counts differ freely between instances: they
are the parameters' sizes, read at run time, and so are the arguments that equal a size in every
instance (``Rule.sizes_read``: a depthwise conv's ``groups``, a layer_norm's ``normalized_shape``). A
candidate without a twin stays inline.
"""

from __future__ import annotations

import re
from collections import Counter

import torch

from ..spec_values import check_identifier
from .dataflow import fitted, numbered
from .optional_branch import merged_keys, varying_ints, with_switch
from .rate_zero import at_rate_zero

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
    """A class name as a function's: ``BasicBlock`` as ``basic_block``, ``ConvBNReLU`` as ``conv_bn_relu``."""
    for word in ("ReLU", "GELU", "SiLU", "PReLU", "ELU"):
        name = name.replace(word, word.capitalize())
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()
    text = re.sub(r"[^a-z0-9_]", "_", text).strip("_")
    return text if text and text[0].isalpha() else f"block_{text}"


def group_blocks(
    spec: dict,
    modules_of_layers: list[str],
    modules: dict[str, torch.nn.Module],
    shapes: dict[str, tuple],
    reserved: set[str],
    strict: bool = False,
) -> tuple[dict, bool]:
    """``spec`` (the traced document) with repeated submodules turned into blocks, unchanged when
    there are none; and whether some block's instances differ in their hypers or their parameters'
    size-1 axes (a block ``symgrad.plan`` may yet refuse, where its code would differ).
    ``strict``: instances may not differ so. ``modules_of_layers``: each layer's innermost module
    path; ``shapes``: every node's shape at the traced size; ``reserved``: names a block may not take."""
    layers = spec["layers"]
    sources = {name: entry.get("source") for name, entry in spec["inputs"].items()}
    known = set(spec["inputs"]) | {layer["out"] for layer in layers}
    readers_after = _last_readers(spec)
    candidates = []
    for path in sorted({prefix for module in modules_of_layers for prefix in _prefixes(module)}, key=_depth):
        module = modules.get(path)
        if module is None or next(iter(module.children()), None) is None:
            continue
        class_name = type(module).__name__
        if type(module) in CONTAINERS:
            leaves = _leaf_classes(module)
            if leaves is None:
                continue
            class_name = leaves
        inside = [
            index
            for index, module_path in enumerate(modules_of_layers)
            if module_path == path or module_path.startswith(path + ".")
        ]
        if len(inside) < 2 or inside != list(range(inside[0], inside[-1] + 1)):
            continue
        candidate = _candidate(path, class_name, inside, layers, sources, known, readers_after, shapes)
        if candidate is not None:
            candidates.append(candidate)
    for path, module in modules.items():  # a Sequential of leaf modules built in a loop: VGG's features
        for run in _runs(path, module, modules_of_layers):
            candidate = _candidate(
                path,
                run["class"],
                run["indices"],
                layers,
                sources,
                known,
                readers_after,
                shapes,
                offset=run["offset"],
                children=run["children"],
            )
            if candidate is not None:
                candidates.append(candidate)
    candidates.sort(key=lambda candidate: _depth(candidate["path"]))
    for candidate in candidates:
        if strict:
            candidate["key"] = candidate["strict_key"]
    counts: dict = {}
    for candidate in candidates:
        counts[candidate["key"]] = counts.get(candidate["key"], 0) + 1
    if not strict:  # the first block of rising drop-path rates, at 0 where the model skips the op
        twins = {candidate["key"]: candidate for candidate in candidates if counts[candidate["key"]] >= 2}
        for position, candidate in enumerate(candidates):
            widened = counts[candidate["key"]] == 1 and next(
                filter(None, (at_rate_zero(candidate, twin, _int_arguments) for twin in twins.values())), None
            )
            if widened:
                counts[candidate["key"]] -= 1
                counts[widened["key"]] += 1
                candidates[position] = widened
    if not strict:  # instances with and without an optional submodule (a ResNet's downsample): one block
        merged_keys(candidates, counts, _int_arguments)
    chosen, covered = [], set()
    for candidate in candidates:  # outermost first: a repeated module's own repeated parts stay inside it
        span = set(candidate["indices"])
        if (
            counts[candidate["key"]] >= 2
            and not span & covered
            and not _made_of_shared_blocks(candidate, candidates, counts)
        ):
            chosen.append(candidate)
            covered |= span
    chosen = [candidate for candidate in chosen if sum(other["key"] == candidate["key"] for other in chosen) >= 2]
    if not chosen:
        return spec, False
    relaxed = any(
        other["key"] == candidate["key"] and other["strict_key"] != candidate["strict_key"]
        for candidate in chosen
        for other in chosen
    )
    blocks, names, hyper = {}, {}, {}
    taken = set(reserved) | known
    chosen.sort(key=lambda item: item["indices"][0])
    firsts = [
        candidate
        for position, candidate in enumerate(chosen)
        if all(other["key"] != candidate["key"] for other in chosen[:position])
    ]
    for candidate in firsts:
        base = _snake(candidate["class"])
        own = _submodules(candidate)
        # one class, several blocks: each after the submodules it has beyond the class's fewest
        # (ResNet's bottleneck and bottleneck_downsample), else numbered
        fewest = set.intersection(*(_submodules(other) for other in firsts if other["class"] == candidate["class"]))
        extra = sorted(own - fewest)
        if extra and len(extra) <= 2:
            base = f"{base}_{'_'.join(re.sub(r'[^A-Za-z0-9]', '_', part) for part in extra)}".lower()
        base = fitted(base)
        if check_identifier(base) is not None:  # a name the generated module uses itself (ConvMixer's `residual`)
            base = fitted(f"block_{base}")
        name, number = base, 2
        while name in taken or check_identifier(name) is not None:
            name, number = numbered(base, number), number + 1
        taken.add(name)
        names[candidate["key"]] = name
        group = [other for other in chosen if other["key"] == candidate["key"]]
        group.sort(key=lambda other: not other.get("branch", {}).get("on", True))  # one with the branch first
        blocks[name], given = with_switch(*_with_hypers(group), group)
        hyper.update({other["path"]: values for other, values in zip(group, given)})
    start_of = {candidate["indices"][0]: candidate for candidate in chosen}
    covered = {index for candidate in chosen for index in candidate["indices"]}
    renamed: dict[str, str] = {}  # an instance's output is called as its module is (layer1_0)
    for candidate in chosen:
        if candidate["offset"] is not None:  # a run of children: no module of its own to be named after
            continue
        plain = re.sub(r"[^A-Za-z0-9_]", "_", candidate["path"])
        if plain[0].isalpha() and plain not in taken and check_identifier(plain) is None:
            renamed[candidate["output"]] = plain
            taken.add(plain)
    new_layers = []
    for index, layer in enumerate(layers):
        if index in start_of:
            candidate = start_of[index]
            external = [renamed.get(name, name) for name in candidate["external"]]
            new_layers.append(
                {
                    "block": names[candidate["key"]],
                    "in": external if len(external) > 1 else external[0],
                    "prefix": candidate["prefix"],
                    **({"offset": candidate["offset"]} if candidate["offset"] else {}),
                    **({"hyper": hyper[candidate["path"]]} if hyper[candidate["path"]] else {}),
                    "out": renamed.get(candidate["output"], candidate["output"]),
                }
            )
        elif index not in covered:
            new_layers.append(
                {key: value if key in ("op", "out") else _renamed(value, renamed) for key, value in layer.items()}
            )
    if "outputs" in spec:  # a spec that ends in outputs: each output node under its new name
        outputs = spec["outputs"]
        outputs = (
            {key: renamed.get(node, node) for key, node in outputs.items()}
            if isinstance(outputs, dict)
            else _renamed(outputs, renamed)
        )
        return {**spec, "blocks": blocks, "layers": new_layers, "outputs": outputs}, relaxed
    loss = {key: value if key == "op" else _renamed(value, renamed) for key, value in spec["loss"].items()}
    return {**spec, "blocks": blocks, "layers": new_layers, "loss": loss}, relaxed


def _made_of_shared_blocks(outer: dict, candidates: list[dict], counts: dict) -> bool:
    """Whether ``outer``'s class is better written as the blocks inside it (timm's ConvNeXt: stages 1 and 3 are
    a downsample and three ``ConvNeXtBlock``s, and stages 0 and 2 run the same blocks: one block function for
    all 18; 1,280 -> 761 lines). In layers written: ``outer``'s function and calls, against a call per inner
    block and the rest inline per instance, plus each inner block's body written nowhere else (fewer than two
    instances outside); True where that halves them, so a unit its reader knows stays (an inverted residual
    whose SiLU also runs in the stem, a U-Net's ``Up``)."""
    own = set().union(*(set(other["indices"]) for other in candidates if other["key"] == outer["key"]))
    outside = Counter(other["key"] for other in candidates if not own & set(other["indices"]))
    span, shared, calls, bodies = set(outer["indices"]), set(), 0, {}
    for inner in candidates:  # outermost first, as the choice itself
        inside = set(inner["indices"])
        if inner["key"] in outside and inside < span and not inside & shared:
            shared, calls = shared | inside, calls + 1
            if outside[inner["key"]] < 2:  # written only if ``outer`` is not
                bodies[inner["key"]] = len(inside)
    instances = counts[outer["key"]]
    return 2 * (instances * (len(span - shared) + calls) + sum(bodies.values())) < len(span) + instances


def _leaf_classes(module: torch.nn.Module) -> str | None:
    """A plain ``Sequential`` of 2 or more leaf modules (a ConvNeXt's downsample layer, its norm then its
    conv) as a block class named by its children's (``layer_norm2d_conv2d``); None for any other
    container (a stage of blocks, whose blocks are the repeated unit)."""
    children = list(module.children())
    if type(module) is not torch.nn.Sequential or len(children) < 2:
        return None
    if any(next(iter(child.children()), None) is not None for child in children):
        return None
    return "_".join(_snake(type(child).__name__) for child in children)


def _submodules(candidate: dict) -> set[str]:
    """The submodules a candidate's parameters belong to, by their first name (``conv1``, ``downsample``)."""
    return {key.split(".")[0] for key in candidate["block"]["params"].values() if "." in key}


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
    if "outputs" in spec:  # the outputs count as read one past the end, as the loss does
        outputs = spec["outputs"]
        for name in (
            outputs.values() if isinstance(outputs, dict) else [outputs] if isinstance(outputs, str) else outputs
        ):
            last[name] = len(spec["layers"])
        return last
    for key in ("in", "target"):
        value = spec["loss"].get(key)
        if value in known:
            last[value] = len(spec["layers"])
    if "in" not in spec["loss"] and spec["layers"]:
        last[spec["layers"][-1]["out"]] = len(spec["layers"])
    return last


def _block_argument(name: str) -> bool:
    """Whether ``name`` is one of a block function's own names (its input ``x``, ``x2``, ..., its
    parameters ``p``, ``save``, its backward's ``saved``, ``grad_output``): a node of the block must not
    take it (the model's code may: ``x1 = F.relu(...)``, ``p = self.proj(x)``)."""
    return name in ("p", "save", "saved", "grad_output") or re.fullmatch(r"x\d*", name) is not None


def _local_name(name: str) -> str:
    """``name`` as a block-local name the spec accepts (``0_weight``, a Sequential child's: ``m0_weight``)."""
    from ..spec_values import check_identifier

    if name and check_identifier(name) is None and not _block_argument(name):
        return name
    name = f"m{name}" if name and name[0].isdigit() else f"v_{name}"
    return name if check_identifier(name) is None else ""  # "": no such name; the candidate is not a block


def _signature(shape: tuple) -> tuple:
    return (len(shape), tuple(axis for axis, size in enumerate(shape) if size == 1))


def _runs(path: str, module: torch.nn.Module, modules_of_layers: list[str]) -> list[dict]:
    """The runs of ``module``'s children that repeat one sequence of classes, where its children are
    numbered leaf modules (``Conv2d, BatchNorm2d, ReLU`` thirteen times in VGG-16-BN's ``features``,
    with max-pools between): the sequence that covers the most children less its own length."""
    children = list(module.named_children())
    if len(children) < 4 or not all(
        name.isdigit() and next(iter(child.children()), None) is None for name, child in children
    ):
        return []
    prefix = path + "." if path else ""
    owned = {}  # child index -> its layers
    for index, module_path in enumerate(modules_of_layers):
        if module_path.startswith(prefix) and module_path[len(prefix) :].isdigit():
            owned.setdefault(int(module_path[len(prefix) :]), []).append(index)
    order = sorted(owned)
    numbered = {int(name): child for name, child in children}  # a ModuleDict's keys are text: "0", not 0
    classes = [type(numbered[index]).__name__ for index in order]
    best = ((0, False), [], 0)
    for length in range(2, min(8, len(order) // 2) + 1):
        for start in range(len(order) - length + 1):
            unit, starts, at = classes[start : start + length], [], 0
            while at + length <= len(order):
                if classes[at : at + length] == unit:
                    starts.append(at)
                    at += length
                else:
                    at += 1
            # the most children covered by the shortest unit (DnCNN's conv, norm, relu five times, not
            # eight children twice); of equals, one that starts at a module with parameters (conv, norm,
            # relu rather than relu, conv, norm)
            score = (len(starts) * length - length, next(iter(numbered[order[start]].parameters()), None) is not None)
            if len(starts) >= 2 and score > best[0]:
                best = (score, starts, length)
    runs = []
    for start in best[1]:
        children_of_run = order[start : start + best[2]]
        indices = sorted(index for child in children_of_run for index in owned[child])
        if indices != list(range(indices[0], indices[-1] + 1)):
            continue
        runs.append(
            {
                "class": "_".join(_snake(name) for name in classes[start : start + best[2]]),
                "indices": indices,
                "offset": children_of_run[0],
                "children": children_of_run,
            }
        )
    return runs


def _candidate(path, class_name, indices, layers, sources, known, last_reader, shapes, offset=None, children=()):
    """The block a run of layers would be, with the key its twins share; None if it is not one.
    ``offset``: the layers are those of ``path``'s children ``children``, the block's parameter keys
    counted from the first (``0.weight`` for ``features.3.weight``) and its nodes named by their ops."""
    prefix = path + "."
    plain = re.sub(r"[^A-Za-z0-9_]", "_", path) + "_"
    op_names = _op_names(layers, indices) if offset is not None else {}
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
                key_name = _own_key(source, prefix, offset, children)
                if key_name is not None:
                    local[name] = (
                        _local_name(re.sub(r"[^A-Za-z0-9_]", "_", key_name))
                        if offset is None
                        else f"{op_names[layer['out']]}_{key_name.partition('.')[2].replace('.', '_')}"
                    )
                    params.append((local[name], key_name))
                else:
                    if sources.get(name):  # another module's parameter: not this block's own
                        return None
                    local[name] = "x" if not external else f"x{len(external) + 1}"
                    external.append(name)
        out = layer["out"]
        local[out] = (
            op_names[out] if offset is not None else _local_name(out[len(plain) :] if out.startswith(plain) else out)
        )
    own = [local[name] for name in local if name not in external]  # the block's names for params and nodes
    if len(set(local.values())) != len(local) or "" in own or any(_block_argument(value) for value in own):
        return None
    block_layers = []
    for index in indices:
        layer = layers[index]
        block_layers.append({key: (_renamed(value, local) if key != "op" else value) for key, value in layer.items()})
    pattern, ints, sized = _int_arguments(block_layers, {local[name]: shapes[name] for name in local})
    # every tensor's rank and size-1 axes, the block's own nodes' too: a rule may derive otherwise where
    # a size is 1 (an SE gate's expand_as at 1 x 1), so instances that differ there are other blocks; a
    # parameter's rank only (a 1 x 1 and a 3 x 3 convolution derive alike: symgrad.plan checks it)
    signatures = {
        local[name]: (len(shapes[name]),) if sources.get(name) else _signature(shapes[name]) for name in local
    }
    key = (class_name, repr(pattern), tuple(params), tuple(signatures.values()))
    strict_key = (class_name, repr(block_layers), tuple(params), tuple(_signature(shapes[name]) for name in local))
    block = {
        "inputs": [local[name] for name in external],
        "params": {name: key_name for name, key_name in params},
        "layers": block_layers,
        "output": local[outputs[0]],
    }
    if offset is not None:
        path = f"{path}[{children[0]}:{children[-1] + 1}]"  # an id; the instance says prefix and offset
    return {
        "key": key,
        "strict_key": strict_key,
        "class": class_name,
        "path": path,
        "prefix": prefix[:-1],
        "offset": offset,
        "indices": indices,
        "external": external,
        "output": outputs[0],
        "block": block,
        "ints": ints,
        "sized": sized,
        "names": set(local.values()),
        "pattern": repr(pattern),
        "shapes": {local[name]: shapes[name] for name in local},
        "signatures": signatures,
    }


def _own_key(source, prefix: str, offset, children) -> str | None:
    """A parameter's key in the block (``conv1.weight``; in a run of children, ``0.weight``), or None
    where it is not one of the block's own."""
    if not source or not source.startswith(prefix):
        return None
    key = source[len(prefix) :]
    if offset is None:
        return key
    index, _, rest = key.partition(".")
    return f"{int(index) - offset}.{rest}" if index.isdigit() and int(index) in children and rest else None


def _op_names(layers, indices) -> dict[str, str]:
    """In a run of children, each layer's node named by its op (``conv2d``, ``batch_norm``, ``relu``)."""
    names: dict[str, str] = {}
    for index in indices:
        base, number = layers[index]["op"], 2
        name = base
        while name in names.values():
            name, number = f"{base}_{number}", number + 1
        names[layers[index]["out"]] = name
    return names


HYPER_KEYS = ("stride", "padding", "dilation", "groups")
"""Int arguments in which instances of one block may differ, each a hyper of the block: the
convolution and pooling rules derive the same code for every value (``symgrad.plan`` checks
it), as a ResNet's first block of a stage differs from its first stage's only in its stride and a
MobileNet's depthwise convolutions in their groups. Float arguments may differ where their rule
declares them ``Param(..., hyper=True)`` (dropout's ``p``: a ConvNeXt's per-block drop-path rates)
or ``Operand(..., hyper=True)`` (mul's and div's constant ``other``: a layer or residual scale)."""


def _int_arguments(block_layers: list[dict], shapes: dict[str, tuple]) -> tuple[list[dict], dict, dict]:
    """The layers with each :data:`HYPER_KEYS` int (the rule's default where the layer gives none)
    and each float of an argument its rule declares a hyper replaced by a placeholder, and those
    values by (layer index, key). A value for which the op is not there (``F.dropout`` at p = 0,
    timm's ``drop_path`` at rate 0, which the model skips) leaves other ops: ``rate_zero`` makes it
    the block at rate 0. Also each
    param its rule declares readable off a size (``Rule.sizes_read``) that equals that size here (by
    the block's names, ``shapes``), by (layer index, key): (its value, the ``{like: ...}`` that reads it),
    a placeholder in the pattern."""
    from ..rules import LAYER_RULES

    pattern, ints, sized = [], {}, {}
    for index, layer in enumerate(block_layers):
        rule = LAYER_RULES.get(layer["op"])
        shown = dict(layer)
        params = rule.params if rule is not None else {}
        for key, (operand, axis) in (rule.sizes_read if rule is not None else {}).items():
            read = _size_read(layer, rule, key, operand, axis, shapes)
            if read is not None:
                sized[(index, key)] = read
                shown[key] = "<size>"
        for key in (*HYPER_KEYS, *(key for key, param in params.items() if param.hyper)):
            if key not in params:
                continue
            value = layer.get(key, params[key].default)
            if key in HYPER_KEYS and isinstance(value, int) and not isinstance(value, bool):
                ints[(index, key)] = value
                shown[key] = "<int>"
            elif params[key].hyper and isinstance(value, float):
                ints[(index, key)] = value
                shown[key] = "<float>"
        for operand in rule.operands if rule is not None else ():  # a scale: mul's constant `other`
            value = layer.get(operand.name)
            if operand.hyper and isinstance(value, float):
                ints[(index, operand.name)] = value
                shown[operand.name] = "<float>"
        pattern.append(sorted(shown.items()))
    return pattern, ints, sized


def _size_read(layer: dict, rule, key: str, operand: str, axis: int | None, shapes: dict) -> tuple | None:
    """(``layer``'s value of ``key``, as a hashable, and the ``{like: ...}`` reading it) where the value
    is the size ``rule.sizes_read`` declares: ``operand``'s at ``axis``, or its trailing sizes (None)."""
    value = layer.get(key, rule.params[key].default)
    from_in = [item.name for item in rule.operands if item.from_in]
    if operand in from_in:
        given = layer.get("in")
        node = given[from_in.index(operand)] if isinstance(given, list) else given
    else:
        node = layer.get(operand)
    shape = shapes.get(node) if isinstance(node, str) else None
    if shape is None:
        return None
    if axis is not None:
        if isinstance(value, bool) or not isinstance(value, int) or not -len(shape) <= axis < len(shape):
            return None
        return (value, {"like": node, "dims": [axis]}) if shape[axis] == value else None
    values = value if isinstance(value, list) else [value]
    if not values or len(values) >= len(shape) or any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        return None
    if list(shape[len(shape) - len(values) :]) != values:
        return None
    return tuple(values), [{"like": node, "dims": [position - len(values)]} for position in range(len(values))]


def _with_hypers(group: list[dict]) -> tuple[dict, list[dict]]:
    """The block of a group of instances, the ints and floats they differ in as its ``hyper:`` (an int
    named by the argument, ``stride``, or ``conv2_stride`` where two arguments of that name differ
    otherwise; a float by its node, ``drop_path_p``; the default is the commonest value), and each
    instance's values that differ from the default."""
    first = group[0]
    block = {**first["block"], "layers": [dict(layer) for layer in first["block"]["layers"]]}
    # a value that differs between instances but is in each a size its rule may read (a depthwise
    # conv's groups, a layer_norm's normalized_shape: Rule.sizes_read): read at run time, no hyper
    by_size = {
        position
        for position in first["sized"]
        if all(position in candidate["sized"] for candidate in group)
        and len({candidate["sized"][position][0] for candidate in group}) > 1
    }
    for index, key in sorted(by_size):
        block["layers"][index][key] = first["sized"][(index, key)][1]
    varying = varying_ints(group, by_size)
    if not varying:
        return block, [{} for _ in group]
    by_key: dict[str, list] = {}
    for position, values in varying.items():
        by_key.setdefault(position[1], []).append(values)
    names, defaults = {}, {}
    for (index, key), values in varying.items():
        if isinstance(next(value for value in values if value is not None), float):  # a rate: drop_path_p
            name = f"{block['layers'][index]['out']}_{key}"
        elif len(set(by_key[key])) == 1:
            name = key
        else:
            name = f"{block['layers'][index]['out']}_{key}"
        while name in first["names"] or name in ("p", "save", "saved", "grad_output"):
            name = f"{name}_value"
        names[(index, key)] = name
        present = [value for value in values if value is not None]  # None: an instance without the branch
        defaults[name] = max(present, key=present.count)  # the commonest, the first of equals
        layer = block["layers"][index]
        block["layers"][index] = {
            **{item: value for item, value in layer.items() if item != "out"},
            key: name,
            "out": layer["out"],
        }
    block = {
        "inputs": block["inputs"],
        "params": block["params"],
        "hyper": {name: defaults[name] for name in dict.fromkeys(names.values())},
        "layers": block["layers"],
        "output": block["output"],
    }
    instances = []
    for number, _ in enumerate(group):
        given = {}
        for position, name in names.items():
            if varying[position][number] is not None and varying[position][number] != defaults[name]:
                given[name] = varying[position][number]
        instances.append(given)
    return block, instances
