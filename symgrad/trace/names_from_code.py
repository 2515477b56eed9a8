"""Layer names from the model's own code: ``q, k, v = qkv.unbind(0)`` names its three pieces ``q``, ``k``
and ``v`` (``blocks_0_attn_q`` inside ``blocks.0.attn``), ``attn = q @ k.transpose(-2, -1)`` names the
matmul ``attn``, where the op's name alone (``attn_squeeze_2``, ``matmul``) says less.

The recorder asks :func:`code_targets` at each torch call: the innermost frame of the user's code, the
instruction it is running (``co_positions``: the line and columns of the expression called) and the
statement of the file's syntax tree (``linecache`` + ``ast``, never a regex) whose value that expression
is. A name is taken from

* ``name = EXPR`` (or ``name: T = EXPR``) where ``EXPR`` does not read ``name`` and ``name`` is not an
  argument of the function: a value the code gives a name of its own. ``x = self.proj(x)``, ``x = x + y``
  or ``x = F.scaled_dot_product_attention(q, k, v)`` in ``forward(self, x)`` rebind a running name, which
  says less than the op (those keep the op's name);
* ``a, b, c = EXPR`` where ``EXPR`` returns a tuple (``unbind``, ``chunk``, ``split``): one name per piece;
* ``a, b = E1, E2``: ``E1`` names ``a``, ``E2`` names ``b``.

No name comes from code without a source file (``exec``, ``<stdin>``), from a lambda, or from a call that
runs inside an ``nn.Module`` called from that statement (a leaf module's op is named by the module's path,
a library's module by its own paths). Names depend on the model's source alone, so a spec's text is the
same in every process. The builder validates each (``spec.check_identifier``) and makes it unique as it
does the op names; one it refuses falls back to the op's name.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import linecache
import os
from types import CodeType, FrameType

import torch

MODULE_CALLS = frozenset({torch.nn.Module._call_impl.__code__, torch.nn.Module._wrapped_call_impl.__code__})
"""The frames of an ``nn.Module`` being called: a call below one belongs to that module, not to the statement."""


def code_targets(frame: FrameType | None, is_users) -> tuple[FrameType | None, tuple[str | None, ...]]:
    """The frame whose statement names the call's result and those names (one per piece of a tuple
    result), or ``(None, ())``. From ``frame`` outwards: torch's and the standard library's frames (and
    einops', a library of layout functions: its calls are its caller's) are passed; a ``return`` of the
    very expression running passes the name to the caller's statement; the tracer's own frames, code
    without a source and an ``nn.Module`` being called end the search with no name. Python 3.10 has no
    instruction positions (``co_positions``): no names there, the op's names as before."""
    while frame is not None and POSITIONS:
        code = frame.f_code
        if code in MODULE_CALLS or code.co_filename.startswith("<") or code.co_filename.startswith(TRACER):
            return None, ()
        if is_users(code.co_filename) and not code.co_filename.startswith(PASSED):
            if frame.f_lasti < 0:
                return None, ()
            found = _targets_at(code, frame.f_lasti)
            if found != RETURNED:
                return (frame, found) if found else (None, ())
        frame = frame.f_back
    return None, ()


POSITIONS = hasattr(CodeType, "co_positions")
"""Whether this Python says which columns an instruction runs (3.11 on)."""

RETURNED = ("",)
"""The table's mark for ``return EXPR``: the value is the function's, named (or not) by its caller."""

TRACER = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "")
"""symgrad's own folder: a frame of it above a call is the tracer running code that has no source."""

PASSED = tuple(
    os.path.join(os.path.dirname(os.path.realpath(found.origin)), "")
    for found in (importlib.util.find_spec("einops"),)
    if found is not None and found.origin
)
"""The libraries whose torch calls are their caller's expression (``tokens = rearrange(x, ...)``)."""


@functools.lru_cache(maxsize=8192)
def _targets_at(code: CodeType, lasti: int) -> tuple[str | None, ...]:
    positions = _positions(code)
    index = lasti // 2
    if index >= len(positions) or None in positions[index]:
        return ()
    return _assigned(code.co_filename).get(positions[index], ())


@functools.lru_cache(maxsize=1024)
def _positions(code: CodeType) -> tuple:
    return tuple(code.co_positions())


_TREES: dict[str, tuple[list[str], dict]] = {}
"""filename -> (the lines ``linecache`` gave, the table :func:`_table` made of them)."""


def _assigned(filename: str) -> dict:
    """``(line, end line, column, end column)`` of each named value in ``filename`` -> its names."""
    linecache.checkcache(filename)
    lines = linecache.getlines(filename)
    cached = _TREES.get(filename)
    if cached is not None and cached[0] is lines:
        return cached[1]
    table = _table("".join(lines)) if lines else {}
    _TREES[filename] = (lines, table)
    return table


def _table(source: str) -> dict:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    table: dict[tuple, tuple[str | None, ...]] = {}
    _walk(tree, frozenset(), table)
    return table


def _walk(node: ast.AST, arguments: frozenset[str], table: dict) -> None:
    """Each assignment under ``node``; ``arguments``: those of the function it is in."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            every = (*child.args.posonlyargs, *child.args.args, *child.args.kwonlyargs)
            every += tuple(extra for extra in (child.args.vararg, child.args.kwarg) if extra is not None)
            _walk(child, frozenset(argument.arg for argument in every), table)
            continue
        if isinstance(child, ast.Return) and child.value is not None:
            table[_key(child.value)] = RETURNED
        elif isinstance(child, ast.Assign) and len(child.targets) == 1:
            _assignment(child.targets[0], child.value, arguments, table)
        elif isinstance(child, ast.AnnAssign) and child.value is not None and child.simple:
            _assignment(child.target, child.value, arguments, table)
        _walk(child, arguments, table)


def _assignment(target: ast.expr, value: ast.expr, arguments: frozenset[str], table: dict) -> None:
    taken = arguments | {name.id for name in ast.walk(value) if isinstance(name, ast.Name)}
    if isinstance(target, ast.Name):
        _put(table, value, (_fresh(target, taken),))
    elif isinstance(target, (ast.Tuple, ast.List)) and not any(
        isinstance(element, ast.Starred) for element in target.elts
    ):
        names = tuple(_fresh(element, taken) for element in target.elts)
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(names):
            for element, name in zip(value.elts, names):
                _put(table, element, (name,))
        else:
            _put(table, value, names)


def _fresh(target: ast.expr, taken: frozenset[str]) -> str | None:
    """The target's name, where it is a plain name that neither the value reads nor the function takes."""
    return target.id if isinstance(target, ast.Name) and target.id not in taken else None


def _put(table: dict, value: ast.expr, names: tuple[str | None, ...]) -> None:
    if any(names) and not isinstance(value, ast.Lambda):
        table[_key(value)] = names
    else:
        table[_key(value)] = ()  # x = f(x): named by no statement further out either


def _key(value: ast.expr) -> tuple[int, int, int, int]:
    return (value.lineno, value.end_lineno, value.col_offset, value.end_col_offset)


def name_last_part(builder, call, source, found: str) -> str:
    """The node ``call``'s result is: ``found``, or where the code names the result (``q = output[0]``,
    a narrow and a squeeze) and the last layer the walk made computes it and has no name from the code
    yet, that layer renamed for the code's name (nothing reads it yet: it is the last)."""
    named = builder.code_names.get(id(call.result))
    if named is None or call.leaf or not builder.layers or builder.layers[-1]["out"] != found:
        return found
    last = builder.layer_calls[-1]
    if last.result is not source or id(source) in builder.code_names or builder.made[1] != found:
        return found
    base, _, count = builder.made
    if builder.taken[base] == count:
        builder.taken[base] -= 1  # the op's name is free again: the next squeeze is squeeze_2, not squeeze_3
    builder.code_names[id(source)] = named
    name = builder.out_name(builder.layers[-1].get("op", ""), last)
    builder.layers[-1]["out"] = name
    for key, value in list(builder.names.items()):
        if value == found:
            builder.names[key] = name
    return name
