"""``symgrad trace --explain NAME``: how a recorded call becomes a layer, read from the walk's own tables
(``layers.PRE_CHECKS``, ``layers.TABLE``, ``dispatch.OP_HOOKS``, the rules' ``calls``), so the text
cannot drift from what the walk does."""

from __future__ import annotations

import inspect
from pathlib import Path

from ..rules import LAYER_RULES, LOSS_RULES
from . import dispatch, loss_tail
from .layers import PRE_CHECKS, SpecBuilder
from .torch_names import FIXES, LOSSES, SIGNATURES

PREFIXES = ("torch.nn.functional.", "torch.Tensor.", "torch.", "nn.functional.", "F.", "Tensor.", "x.")
"""What a name may start with: ``F.conv2d``, ``torch.add``, ``x.add_``, ``torch.Tensor.view``."""


def recorded_name(name: str) -> str:
    """The name the recorder keeps for ``name`` (``F.conv2d`` -> ``conv2d``)."""
    for prefix in PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _first_line(function) -> str:
    text = (inspect.getdoc(function) or "").split("\n\n")[0].replace("\n", " ")
    return f": {text}" if text else ""


def _where(function) -> str:
    code = getattr(function, "__code__", None)
    path = Path(inspect.getsourcefile(function) or "?")
    line = code.co_firstlineno if code else inspect.getsourcelines(function)[1]
    return f"symgrad/{path.relative_to(Path(__file__).resolve().parents[1]).as_posix()}:{line}"


def _rule_file(rule) -> str:
    path = Path(inspect.getsourcefile(type(rule)))
    return f"symgrad/{path.relative_to(Path(__file__).resolve().parents[1]).as_posix()}"


def explain(name: str) -> str:
    """The pre-checks a call named ``name`` meets in order, the handler the table gives it, the layer op it
    becomes and the file of that op's rule."""
    recorded = recorded_name(name)
    lines = [
        f"{name}: recorded as '{recorded}'",
        "pre-checks, in order (the first that takes the call ends the walk of it):",
    ]
    lines += [f"  {number}. {label}: {_where(check)}" for number, (label, check) in enumerate(PRE_CHECKS, 1)]
    kind, op, handler = dispatch.route(recorded)
    if kind == "rule":
        rule = LAYER_RULES[op]
        positional = SIGNATURES[recorded][1]
        lines.append(
            f"table: the rule call ({_where(SpecBuilder.rule_call)}), arguments bound as ({', '.join(positional)})"
        )
        if handler is None:
            lines.append(f"hook: none; the general layer ({_where(SpecBuilder.layer)})")
        else:
            lines.append(f"hook: {handler.__module__}.{handler.__name__} ({_where(handler)}){_first_line(handler)}")
        lines.append(f"layer: op '{op}', rule {type(rule).__name__} in {_rule_file(rule)}")
    elif kind == "loss":
        rule = next(rule for rule in LOSS_RULES.values() if recorded in rule.calls)
        lines.append(
            f"table: the loss tail ({_where(loss_tail.loss_call)}), arguments bound as ({', '.join(LOSSES[recorded])})"
        )
        lines.append(f"layer: the spec's loss, op '{rule.op}', rule {type(rule).__name__} in {_rule_file(rule)}")
    elif kind == "call":
        lines.append(f"table: {handler.__module__}.{handler.__name__} ({_where(handler)}){_first_line(handler)}")
        lines.append(
            "layer: what the handler makes of it (views, pieces and reductions become rule ops: "
            "`symgrad ops` lists them)"
        )
    else:
        fix = FIXES.get(recorded, "write it with the ops `symgrad ops` lists")
        lines.append(
            f"table: no entry; refused as unknown ({_where(SpecBuilder.unknown)}) unless a pre-check "
            f"takes it (fix: {fix})"
        )
    return "\n".join(lines) + "\n"
