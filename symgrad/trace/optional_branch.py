"""Instances of one class with and without an optional submodule are one block (``trace.grouping``).

torchvision's ``BasicBlock`` and ``Bottleneck`` hold a ``downsample`` that is None in most instances; their
forward then adds ``x`` where the others add ``self.downsample(x)``. Such instances trace to two keys:
the ones with the submodule run its layers besides the others' (and may differ in hypers, the stride).
Where taking the submodule's layers out of an instance with it (and reading, where its last layer's
output was read, what the instances without it read there) gives the others' ops, arguments,
parameters, ranks and size-1 axes, both are one block with a bool hyper named after the submodule
(``downsample``) that switches the branch (``blocks.BlockSpec.optional``). Only a whole submodule whose
layers nothing else reads but through its output: anything else stays two blocks.
"""

from __future__ import annotations

from .rate_zero import replaced


def _reads(layer: dict) -> list:
    return [value for key, value in layer.items() if key not in ("op", "out")]


def with_branch(small: dict, big: dict, int_arguments) -> dict | None:
    """How ``small`` (an instance without the submodule) is an instance of ``big``'s block with its
    branch off: ``{"hyper": NAME, "nodes": [...], "absent": NAME, "positions": {small index: big index}}``,
    or None where ``big``'s layers less one submodule's are not ``small``'s."""
    if small["class"] != big["class"] or small["offset"] is not None or big["offset"] is not None:
        return None
    mine, theirs = small["block"]["layers"], big["block"]["layers"]
    params, their_params = small["block"]["params"], big["block"]["params"]
    extra = {key.split(".")[0] for key in their_params.values()} - {key.split(".")[0] for key in params.values()}
    if len(extra) != 1 or len(theirs) <= len(mine) or small["block"]["inputs"] != big["block"]["inputs"]:
        return None
    submodule = extra.pop()
    branch_params = {name for name, key in their_params.items() if key.split(".")[0] == submodule}
    if {name: key for name, key in their_params.items() if name not in branch_params} != params:
        return None
    nodes = [layer["out"] for layer in theirs if branch_params & set(_names(_reads(layer)))]
    if not nodes or any(name in small["names"] for name in nodes):
        return None
    # the branch: the layers reading its parameters, then those reading only the branch and outside values
    branch = set(nodes)
    for layer in theirs:
        if layer["out"] not in branch and set(_names(_reads(layer))) & branch and layer["out"] not in small["names"]:
            branch.add(layer["out"])
    nodes = [layer["out"] for layer in theirs if layer["out"] in branch]
    last = nodes[-1]
    rest = [layer for layer in theirs if layer["out"] not in branch]
    if len(rest) != len(mine) or [layer["out"] for layer in rest] != [layer["out"] for layer in mine]:
        return None
    if any(set(_names(_reads(layer))) & (branch - {last}) for layer in rest):
        return None  # something outside reads inside the branch: not a whole submodule's call
    if any(branch_params & set(_names(_reads(layer))) for layer in rest):
        return None
    absent = None
    for layer, other in zip(rest, mine):
        if last not in _names(_reads(layer)):
            continue
        for key, value in layer.items():
            if key in ("op", "out"):
                continue
            found = _absent_at(value, other.get(key), last)
            if found is False or (found and absent not in (None, found)):
                return None
            absent = found or absent
    first = min(index for index, layer in enumerate(theirs) if layer["out"] in branch)
    made_before = {layer["out"] for layer in theirs[:first]}
    if absent is None or (absent not in small["block"]["inputs"] and absent not in made_before):
        return None
    off = [
        {key: value if key in ("op", "out") else replaced(value, last, absent) for key, value in layer.items()}
        for layer in rest
    ]
    pattern, _, _ = int_arguments(off, small["shapes"])
    if repr(pattern) != small["pattern"]:
        return None
    if any(small["signatures"].get(name) != big["signatures"].get(name) for name in small["signatures"]):
        return None
    index_of = {layer["out"]: index for index, layer in enumerate(theirs)}
    return {
        "hyper": submodule,
        "nodes": nodes,
        "absent": absent,
        "positions": {index: index_of[layer["out"]] for index, layer in enumerate(mine)},
    }


def _names(values) -> list[str]:
    found = []
    for value in values:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list):
            found += _names(value)
        elif isinstance(value, dict) and "like" in value:
            found.append(value["like"])
    return found


def _absent_at(value, other, last):
    """What ``other`` (the argument without the branch) reads where ``value`` reads ``last``: a name,
    None where ``value`` does not read it, False where the two differ otherwise."""
    if value == last:
        return other if isinstance(other, str) else False
    if isinstance(value, list) and isinstance(other, list) and len(value) == len(other):
        found = [_absent_at(item, item_other, last) for item, item_other in zip(value, other)]
        if False in found or len({item for item in found if item}) > 1:
            return False
        return next((item for item in found if item), None)
    return False if last in _names([value]) else None


def merged_keys(candidates: list[dict], counts: dict, int_arguments) -> None:
    """Each key of candidates without a submodule that another key's candidates have, where the two
    are one block with that submodule's branch switched (:func:`with_branch`): those candidates take the
    other key, each marked with its ``branch`` (its values at the other's layer positions too)."""
    firsts: dict = {}
    for candidate in candidates:
        firsts.setdefault(candidate["key"], candidate)
    for key, small in firsts.items():
        for other_key, big in firsts.items():
            if other_key == key or counts.get(other_key, 0) < 1 or "branch" in big or "branch" in small:
                continue
            found = with_branch(small, big, int_arguments)
            if found is None:
                continue
            for candidate in candidates:
                if candidate["key"] == other_key:
                    candidate["branch"] = {**found, "on": True}
                elif candidate["key"] == key:
                    moved = {
                        (found["positions"][index], name): value for (index, name), value in candidate["ints"].items()
                    }
                    candidate.update(
                        key=other_key,
                        ints=moved,
                        sized={
                            (found["positions"][index], name): value
                            for (index, name), value in candidate["sized"].items()
                        },
                        branch={**found, "on": False},
                    )
            counts[other_key] = counts.get(other_key, 0) + counts.pop(key, 0)
            break


def varying_ints(group: list[dict], by_size: set) -> dict:
    """The int and float arguments in which ``group``'s instances differ, by (layer index, key) of the
    first: each instance's value, None where it leaves out the optional branch the layer is in, or that
    of another layer's same argument where it agrees with it wherever both are run (the branch's
    convolution takes the block's ``stride``)."""
    columns = {
        position: tuple(candidate["ints"].get(position) for candidate in group)
        for position in group[0]["ints"]
        if position not in by_size
    }
    for position, values in columns.items():
        if None not in values:
            continue
        for other, known in columns.items():
            if (
                other[1] == position[1]
                and None not in known
                and all(v is None or v == k for v, k in zip(values, known))
            ):
                columns[position] = known
                break
    return {position: values for position, values in columns.items() if len(set(values) - {None}) > 1}


def with_switch(block: dict, given: list[dict], group: list[dict]) -> tuple[dict, list[dict]]:
    """``block`` and its instances' hypers (``given``) with the bool that switches the optional branch
    where ``group`` holds instances with and without it (:func:`merged_keys`), true where it runs."""
    branch = next((candidate["branch"] for candidate in group if "branch" in candidate), None)
    if branch is None:
        return block, given
    name = branch["hyper"]
    while name in group[0]["names"] or name in block.get("hyper", {}) or name in ("p", "save", "saved"):
        name = f"with_{name}"
    switched = {
        "inputs": block["inputs"],
        "params": block["params"],
        "hyper": {**block.get("hyper", {}), name: False},
        "optional": {name: {"nodes": list(branch["nodes"]), "absent": branch["absent"]}},
        "layers": block["layers"],
        "output": block["output"],
    }
    return switched, [
        {**values, name: True} if candidate["branch"]["on"] else values for values, candidate in zip(given, group)
    ]
