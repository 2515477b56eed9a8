"""An instance at a rate where the model skips its dropout is its block at rate 0 (``trace.grouping``).

timm's ``drop_path`` and ``F.dropout`` return their input at rate 0 and draw nothing, so the first block of
a ConvNeXt whose drop-path rates rise from 0 (``torch.linspace(0, rate, depth)``) runs one op fewer than
its twins. The dropout rule writes a block's rate as a hyper that draws nothing at 0 (its mask is ones:
``rules.dropout``), so that instance is the block at ``p = 0``: the same values, the same random draws,
as the model. A candidate without a twin becomes one where inserting one dropout layer of a twin block,
reading what its later layers read in its place, gives that block's ops, arguments, parameters, ranks and
size-1 axes."""

from __future__ import annotations


def replaced(value, old: str, new: str):
    """A layer argument's value with the node ``old`` read as ``new`` (in lists and ``{like: ...}`` too)."""
    if isinstance(value, str):
        return new if value == old else value
    if isinstance(value, list):
        return [replaced(item, old, new) for item in value]
    if isinstance(value, dict) and "like" in value:
        return {**value, "like": new if value["like"] == old else value["like"]}
    return value


def at_rate_zero(lone: dict, twin: dict, int_arguments) -> dict | None:
    """``lone`` (a candidate without a twin) as an instance of ``twin``'s block at rate 0, or None where
    no one dropout layer of ``twin``'s makes their ops the same. ``int_arguments``: the grouping's
    ``_int_arguments``, which makes the pattern the key compares."""
    mine, theirs = lone["block"]["layers"], twin["block"]["layers"]
    if (
        lone["class"] != twin["class"]
        or len(theirs) != len(mine) + 1
        or lone["block"]["params"] != twin["block"]["params"]
    ):
        return None
    for index, layer in enumerate(theirs):
        if layer["op"] != "dropout" or not isinstance(layer.get("in"), str) or layer["out"] in lone["names"]:
            continue
        source, out = layer["in"], layer["out"]
        if source not in lone["names"] and source not in lone["block"]["inputs"]:
            continue
        dropout = {**layer, "p": 0.0}
        layers = [dict(item) for item in mine[:index]] + [dropout]
        layers += [
            {key: value if key in ("op", "out") else replaced(value, source, out) for key, value in item.items()}
            for item in mine[index:]
        ]
        shapes = {**lone["shapes"], out: lone["shapes"].get(source)}
        if shapes[out] is None:
            continue
        pattern, ints, sized = int_arguments(layers, shapes)
        signatures = {**lone["signatures"], out: lone["signatures"][source]}
        if repr(pattern) != twin["pattern"] or signatures != twin["signatures"]:
            continue
        output = out if lone["block"]["output"] == source else lone["block"]["output"]
        return {
            **lone,
            "key": twin["key"],
            "strict_key": ("rate 0", lone["strict_key"]),
            "block": {**lone["block"], "layers": layers, "output": output},
            "ints": ints,
            "sized": sized,
            "names": lone["names"] | {out},
            "shapes": shapes,
            "signatures": signatures,
        }
    return None
