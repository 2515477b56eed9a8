"""Spec names against the names the generated code uses itself: refused at the spec's line, never a
module that crashes (``UnboundLocalError``) or silently reads the wrong value.

Three nets, from the earliest to the last word:

* ``spec.check_identifier`` refuses the names the template uses and the prefixes of the values the
  derivation names. The prefixes are computed here from the source that makes those names
  (:func:`generated_names`), so a rule with a new kind of local reserves it without a list to edit.
* :func:`check_statement_targets`, after derivation: no statement may assign a spec tensor's name,
  except the one statement that computes that layer.
* :func:`check_module_source`, after rendering: the generated module is parsed, and no spec name may
  be a name the module defines or reads from outside a function, nor be assigned in a function where
  it is an argument (beyond moving it to another layout), nor twice where it is not.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from .errors import GeneratorError, Location, SpecError
from .module_names import MODULE, SUFFIXES, WRITTEN, TemplateNames

FIX = "rename it in the spec, e.g. append _in or _t"


PACKAGE = Path(__file__).resolve().parent
DERIVATION_MODULES = ("reverse.py", "tangent.py", "emit.py")
"""The modules besides the rules that name derived values (``grad_x``, ``shared_0``, ``tangent_x``)."""


def _string(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


@functools.cache
def generated_names() -> tuple[frozenset[str], frozenset[str]]:
    """(prefixes, whole names) of the values the derivation names, read from the source that names
    them, so a new kind of local reserves itself without a list to edit:

    * each kind a rule passes to ``NodeSymbols.local`` (``mask`` makes ``mask_relu1``; with
      ``plain=True`` the kind is the whole name, as ``residual``), and each ``local_kind`` a rule declares;
    * the literal start of each f-string given to ``tensor(...)`` (``grad_``, ``tangent_``,
      ``per_sample_grad_``) and each ``numbered_symbols`` prefix (``shared_``).
    """
    rules = [path for path in sorted((PACKAGE / "rules").glob("*.py")) if path.name != "call.py"]  # a block's: below
    return _names_made_in(tuple(rules + [PACKAGE / name for name in DERIVATION_MODULES]))


@functools.cache
def instance_prefixes() -> tuple[str, ...]:
    """The prefixes of the values the structured module names after a block instance (``saved_a``,
    ``grads_a``, ``call_a`` for the instance whose ``out`` is ``a``), read off the call rule
    (``rules/call.py``) as :func:`generated_names` reads the other rules."""
    prefixes, _ = _names_made_in((PACKAGE / "rules" / "call.py",))
    return tuple(sorted(prefix for prefix in prefixes if re.fullmatch(r"[A-Za-z]\w*_", prefix)))  # not `p["`


def _names_made_in(files) -> tuple[frozenset[str], frozenset[str]]:
    prefixes, whole = set(), set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                function = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                first = node.args[0] if node.args else None
                if function == "local" and _string(first):
                    plain = any(
                        keyword.arg == "plain" and getattr(keyword.value, "value", False) for keyword in node.keywords
                    )
                    (whole.add(_string(first)) if plain else prefixes.add(_string(first) + "_"))
                elif (
                    function == "tensor"
                    and isinstance(first, ast.JoinedStr)
                    and first.values
                    and _string(first.values[0])
                ):
                    prefixes.add(_string(first.values[0]))
                elif function == "numbered_symbols" and _string(first):
                    prefixes.add(_string(first))
            elif isinstance(node, ast.keyword) and node.arg == "local_kind" and _string(node.value):
                prefixes.add(_string(node.value) + "_")
            elif (
                isinstance(node, ast.AnnAssign)
                and getattr(node.target, "id", "") == "local_kind"
                and _string(node.value)
            ):
                prefixes.add(_string(node.value) + "_")
    return frozenset(prefixes), frozenset(whole)


def template_names() -> tuple[frozenset[str], frozenset[str]]:
    """(names, suffixes) the module template writes itself, as :mod:`symgrad.module_names` declares them:
    what it imports, the functions and classes it defines, the arguments of each function that also takes
    the spec's tensors, the names it assigns (``grads``, ``saved``), and the suffixes it puts after a spec
    name (``x_layout``)."""
    return WRITTEN, SUFFIXES


def scan_template(template: str) -> TemplateNames:
    """:class:`~symgrad.module_names.TemplateNames` of the module template (``module.py.jinja``), as
    :mod:`symgrad.module_names` declares them (``tests/pipeline/test_template_names.py`` reads the
    templates and checks the declaration holds every name they write)."""
    if template != "module.py.jinja":
        raise ValueError(f"no names are declared for {template}")
    return MODULE


def _spec_names(spec, blocks: bool = False) -> dict[str, Location]:
    names = {item.name: item.location for item in spec.inputs}
    for layer in spec.layers:
        names.setdefault(layer.out, layer.out_location)
    for block in spec.blocks.values() if blocks else ():  # the names its functions take and make
        for name in (*block.operands, *(name for name, _ in block.hyper)):
            names.setdefault(name, block.location)
        for layer in block.layers:
            names.setdefault(layer.out, layer.out_location)
    return names


def _checks_itself(statement) -> bool:
    """``x = size_check(x, ...)``: a size check of the input whose name it keeps (``Rule.keeps_input_name``)."""
    value = getattr(statement, "value", None)
    primitive = getattr(value, "primitive", None)  # a TensorOp's (symgrad.algebra)
    return getattr(primitive, "name", None) == "size_check" and statement.target in value.free_symbols


def check_statement_targets(spec, *statement_lists) -> None:
    """No derived statement assigns a spec tensor's name, but the one that computes that layer."""
    names = _spec_names(spec)
    layer_outputs = {layer.out for layer in spec.layers}
    for statements in statement_lists:
        for statement in statements:
            name = statement.target.name
            if name in names and not (name in layer_outputs and statement.node == name):
                if name not in layer_outputs and _checks_itself(statement):
                    continue  # `x = _size_check(x, ...)`: the input checked is still x (reverse._input_names_kept)
                raise SpecError(
                    f"'{name}' is also a name the generated code gives a value of its own "
                    f"({statement.comment or 'a derived value'})",
                    names[name],
                    FIX,
                )


class _Scope(ast.NodeVisitor):
    """The names one function binds, reads and calls, with what each assignment's value reads; one
    pass over its body (a 10,000-layer module is megabytes of source)."""

    def __init__(self, function: ast.FunctionDef):
        arguments = function.args
        self.parameters = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
        self.parameters += [a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None]
        self.stores: list[tuple[str, set[str]]] = []  # (name, names the assigned value reads)
        self.loads: set[str] = set()
        self.calls: set[str] = set()
        self.bound: set[str] = set(self.parameters)
        self.reads: set[str] | None = None
        for statement in function.body:
            self.visit(statement)

    def visit_FunctionDef(self, node):  # a nested function is its own scope
        self.bound.add(node.name)

    def visit_Assign(self, node):
        outer, self.reads = self.reads, set()
        self.visit(node.value)
        reads, self.reads = self.reads, outer
        for target in node.targets:
            for name in _target_names(target):
                self.stores.append((name, reads))
                self.bound.add(name)

    def visit_If(self, node):  # a block's optional branch (plan_branches): a name stored on both sides is one
        self.visit(node.test)
        outer, sides = self.stores, []
        for body in (node.body, node.orelse):
            self.stores = []
            for statement in body:
                self.visit(statement)
            sides.append(self.stores)
        # a name stored before the `if` and again on one side is one value too: a saved entry only one side
        # keeps (``rc if down else None``) that the other side's backward makes again (``rc = F.relu(c)``)
        before = {name for name, _ in outer}
        first = {name for name, _ in sides[0]} | before
        self.stores = outer + [store for store in sides[0] if store[0] not in before]
        self.stores += [store for store in sides[1] if store[0] not in first]

    def visit_Constant(self, node):  # a leaf: NodeVisitor's own looks for the old visit_Num and kin
        pass

    def visit_Call(self, node):
        if isinstance(node.func, ast.Name):
            self.calls.add(node.func.id)
        self.generic_visit(node)

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load):
            self.loads.add(node.id)
            if self.reads is not None:
                self.reads.add(node.id)
        else:
            self.bound.add(node.id)


def _target_names(target: ast.expr):
    """The names an assignment target binds (``x``, ``a, *rest``); none for ``ctx.recompute``."""
    if isinstance(target, ast.Starred):
        target = target.value
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for item in target.elts:
            yield from _target_names(item)


def _functions(tree: ast.Module, skip=()):
    """The module's functions and its classes' methods (the generated code nests no deeper), but
    those in ``skip`` (by their or their class's name)."""
    for node in tree.body:
        if getattr(node, "name", None) in skip:
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from (item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)))


def _module_bindings(tree: ast.Module):
    """Each (name, statement, imported) a module's top level binds: its functions, classes, imports
    (``import torch.nn.functional as F`` binds F) and assignments."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name, node, False
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            yield from (((alias.asname or alias.name).split(".")[0], node, True) for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            yield from ((name, node, False) for target in targets for name in _bound_names(target))


def _module_level_names(tree: ast.Module) -> set[str]:
    return {name for name, _, _ in _module_bindings(tree)}


def _refuse_names_defined_twice(tree: ast.Module) -> None:
    """A module-level name bound twice (a chain's table after a submodule named ``blocks`` once
    replaced the ``BLOCKS`` dictionary) makes a module that imports and then fails, or computes
    something else: symgrad's own bug, refused before anything is written. Imports may repeat a
    name (``import torch``, then ``import torch.nn.functional as F``); they come first."""
    seen: set[str] = set()
    for name, node, imported in _module_bindings(tree):
        if name in seen and not imported:
            raise GeneratorError(
                f"error: symgrad wrote the module-level name {name!r} twice (line {node.lineno}); "
                "nothing was written (fix: this is a bug in symgrad: please report it with the spec)"
            )
        seen.add(name)


def _bound_names(target: ast.expr) -> list[str]:
    """The names an assignment target binds: ``a``, ``a, b``, ``*a``; not ``a[key]`` or ``a.b``, which bind none."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _bound_names(element)]
    return _bound_names(target.value) if isinstance(target, ast.Starred) else []


_ASSIGNMENT = re.compile(r"^([ \t]+)(?:([A-Za-z_]\w*) = |del )[^\n]*(?:\n\1[ \t]+[^\n]*)*(?:\n\1[)\]][^\n]*)?$", re.M)
"""A one-name assignment or a ``del``, with the lines it wraps onto (indented deeper, then the
closing bracket at its own indent: after a whole simple statement no line is indented deeper)."""


def _stand_in(derived):
    """A derived statement's line as ``target = None`` (``target = target`` where it keeps autocast's
    copy of itself, ``target = _saved_as_autocast_casts(target)``), and
    a ``del`` line as ``pass``: what the check reads of them (the name bound), parsed in a fraction of
    the time."""

    def replace(match: re.Match) -> str:
        indent, target = match.group(1), match.group(2)
        if target is None:
            return f"{indent}pass"
        if target not in derived:
            return match.group(0)
        # a value kept as autocast's copy of itself, or an input checked (`x = _size_check(x, ...)`,
        # reverse._input_names_kept), is still the one value, not a second store
        text = re.sub(r"\s", "", match.group(0))
        kept = re.fullmatch(rf"{target}=_saved_as_autocast_casts\({target},?\)", text) or re.match(
            rf"{target}=_size_check\({target},", text
        )
        return f"{indent}{target} = {target if kept else None}"

    return replace


def check_module_source(spec, source: str, derived: frozenset[str] | set[str] = frozenset()) -> None:
    """Refuse, at the clashing name's line in the spec, a generated module in which a spec name
    stands for two things. ``source`` is the module's text; ``derived`` the targets of the derived
    statements (checked by :func:`check_statement_targets`, and reading only derived names): their
    one-line values are not parsed, which keeps the check a small part of generating a deep net.
    A block's own names are checked too; the template's functions written out verbatim, which never
    see a spec name, are not read as scopes."""
    names = _spec_names(spec, blocks=True)
    stood_in = _ASSIGNMENT.sub(_stand_in(derived), source) if derived else source
    try:
        tree = ast.parse(stood_in)  # duplicate arguments parse; compiling them would fail (checked below)
    except SyntaxError:  # a stand-in that does not parse: the module itself, read whole (never skipped)
        tree = ast.parse(source)
    module_names = _module_level_names(tree)
    _refuse_names_defined_twice(tree)
    scopes = [_Scope(function) for function in _functions(tree, scan_template("module.py.jinja").verbatim)]
    free = {name for scope in scopes for name in scope.loads - scope.bound}  # globals and builtins the code reads
    called = {name for scope in scopes for name in scope.calls}
    for name, location in names.items():
        if name in module_names or name in free or name in called:  # a tensor is never called: a function is meant
            raise SpecError(f"'{name}' is a name the generated module uses itself", location, FIX)
    for scope in scopes:
        seen: set[str] = set()
        for name in scope.parameters:  # `def forward(ctx, recompute, ctx)`
            if name in seen and name in names:
                raise SpecError(
                    f"'{name}' is also the name of an argument the generated code takes itself", names[name], FIX
                )
            seen.add(name)
        counts: dict[str, int] = {}
        for name, reads in scope.stores:
            if name in names and name not in reads:  # `w = w.contiguous(...)` moves w; it is still w
                counts[name] = counts.get(name, 0) + 1
        parameters = set(scope.parameters)
        for name, count in counts.items():
            if count > (0 if name in parameters else 1):
                raise SpecError(
                    f"'{name}' is also a name the generated code gives a value of its own", names[name], FIX
                )
