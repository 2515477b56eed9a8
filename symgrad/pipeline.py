"""Spec to rendered files: the steps every command and the Python API share, in order: parse,
expand (a program of bodies: the top one and one per block), then for every body alike graph,
derive, plan, and render (and ``symgrad.write`` writes)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .body_graphs import block_variants, instance_sizes, top_graph
from .emit import Rendered
from .errors import GeneratorError
from .expand import Expanded, expand
from .graph import Graph, build_graph
from .names import check_module_source, check_statement_targets
from .plan import Structured, plan_block, plan_program
from .printing import to_code
from .reverse import Program, derive
from .shapes import small_shapes
from .spec import EXTRAS, Spec, parse_spec, read_spec
from .spec_functions import refuse_second_order
from .tangent import derive_extras


@dataclass
class Built:
    spec_label: str
    graph: Graph
    program: Program
    rendered: Rendered
    shapes: list[dict[str, tuple[int, ...]]]

    @property
    def forward_text(self) -> list[str]:
        return [f"{s.target} = {to_code(s.value)}" for s in self.program.forward]


KEEP = ("autograd", "all", "lean")
"""What the saving forward keeps (``symgrad generate --keep``): ``autograd``, every value the
backward reads, as autograd does (``--no-recompute``); ``all`` (the default), those values, but a
ReLU output only its pullback reads as a byte mask, a pool's input as its layout, a cheap activation
of a value kept anyway made again; ``lean``, less still: a batch norm's activation output made again
in the backward from the batch norm's input and statistics (:mod:`symgrad.rematerialize`)."""


def keep_policy(keep: str | None, recompute: bool = True) -> str:
    """``keep`` (one of :data:`KEEP`; None: ``all``, or ``autograd`` where ``recompute`` is
    False)."""
    if keep is None:
        return "all" if recompute else "autograd"
    if keep not in KEEP:
        raise ValueError(f"keep={keep!r}: one of {', '.join(KEEP)}")
    if not recompute and keep != "autograd":
        raise ValueError(f"recompute=False is keep='autograd', not keep={keep!r}: pass one of them")
    return keep


def _build(
    spec: Spec,
    label: str,
    extras: tuple[str, ...],
    flat: bool = False,
    fused: bool = True,
    recompute: bool = True,
    documents: bool = True,
    tests: bool = True,
    keep: str | None = None,
) -> Built:
    flat = flat or "flat" in extras  # as a header records them, so that `check` builds it again the same way
    keep = keep_policy(keep, recompute and "no_recompute" not in extras)
    keep = "lean" if "keep_lean" in extras else keep
    recompute, lean = keep != "autograd", keep == "lean"
    extras = tuple(extra for extra in extras if extra not in ("flat", "no_recompute", "keep_lean"))
    unknown = set(extras) - set(EXTRAS)
    if unknown:
        raise ValueError(f"unknown extras {sorted(unknown)}")
    if spec.outputs is not None and (set(spec.extras) | set(extras)):
        from .errors import SpecError

        where = spec.outputs.location
        raise SpecError(
            f"extras ({', '.join(sorted(set(spec.extras) | set(extras)))}) are for a spec that ends in a "
            "loss, and this one ends in outputs",
            where,
            "drop the extras, or end the spec in a loss",
        )
    wanted = tuple(sorted(set(spec.extras) | set(extras)))
    refuse_second_order(spec.checked_functions, wanted)
    expanded = expand(spec, flat, wanted, fused)  # the extras and fused=False: on the inlined program
    # in the headers, so that `check` redoes them: the extras the command line added, --flat, --no-recompute
    recorded = (
        tuple(sorted(set(extras) - set(spec.extras)))
        + (("flat",) if flat and expanded.written_out else ())
        + (() if recompute else ("no_recompute",))
        + (("keep_lean",) if lean else ())
    )
    return _build_program(expanded, label, wanted, recorded, fused, recompute, documents, tests, lean)


def _build_program(
    expanded: Expanded,
    label: str,
    extras: tuple[str, ...] = (),
    recorded: tuple[str, ...] = (),
    fused: bool = True,
    recompute: bool = True,
    documents: bool = True,
    tests: bool = True,
    lean: bool = False,
) -> Built:
    """Every body graphed, derived and planned (:func:`planned_program`), rendered
    (``symgrad.render``), and the checks on what was rendered. ``fused=False`` (an inlined program):
    ``gradients`` runs the readable derivation too, which ``symgrad certify`` proves that way;
    ``documents=False``: the module and its test file, without the derivation's pages; ``tests=False``:
    without the test file either (its small shapes and reference values are most of a network's build)."""
    from .render import render_files

    spec = expanded.spec
    structured = planned_program(expanded, extras, fused, recompute, tests, lean)
    rendered = render_files(structured, label, recorded, documents)
    try:  # a spec name the module also uses is refused at the spec's line (a duplicate argument included) ...
        check_module_source(spec, rendered.files[f"{spec.name}.py"], structured.top_names)
    except SyntaxError:
        pass  # ... and code that does not even parse is symgrad's own bug, said as such just below
    _check_compiles(rendered)
    # the flat graph: the same inputs and wrt, and every op has its reference for `verify`
    return Built(
        label,
        structured.flat_graph,
        structured.program,
        rendered,
        structured.test_data["small_shapes"] if tests else [],
    )


def planned_program(
    expanded: Expanded,
    extras: tuple[str, ...] = (),
    fused: bool = True,
    recompute: bool = True,
    tests: bool = True,
    lean: bool = False,
) -> Structured:
    """The one walk over a program's bodies, stage by stage. Graph: the flat graph (the checks, the
    instances' shapes, the tests' small shapes), each block's body (once per block, not per
    instance; once per distinct set of hyper values and size-1 axes: ``body_graphs.block_variants``), the
    top body, in which each instance is one call (``body_graphs.top_graph``; an inlined program's is the
    flat graph). Derive: every body, readable and fused; the top body's names checked against the
    spec's; the extras' statements. Plan: each block body (``plan.plan_block``), then the top body (``plan.plan_program``).
    ``extras``, ``fused``, ``recompute``, ``lean``: see :func:`_build_program`; ``tests=False``: no
    test data. What ``symgrad trace`` checks a grouping of instances into blocks with."""
    flat_graph = build_graph(expanded.flat)
    shapes = small_shapes(flat_graph) if tests else None
    variants = block_variants(expanded, flat_graph)
    graph, chains = top_graph(expanded, {name: found[0].body for name, found in variants.items()}, flat_graph)
    for body in (variant.body for found in variants.values() for variant in found):
        body.program, body.fast = derive(body.graph), derive(body.graph, fused=True)
    top = derive(graph), derive(graph, fused=fused)  # the readable derivation, and the one `gradients` runs
    check_statement_targets(expanded.spec, *(part for program in top for part in (program.forward, program.backward)))
    extra = derive_extras(top[0], extras)  # hvp's and per_sample's statements: the inlined program's (expand)
    derived = {
        name: plan_block(
            found,
            recompute,
            lean,
            _params_entries(expanded, flat_graph, name),
            instance_sizes(expanded, flat_graph, name),
        )
        for name, found in variants.items()
    }
    return plan_program(expanded, flat_graph, shapes, derived, graph, chains, top, extra, recompute, lean)


def _params_entries(expanded, flat_graph, block: str) -> frozenset[str]:
    """The block's parameters that are, in every instance, an entry of ``params`` (an input with a ``source``)
    read by that instance's one layer alone: their gradients come back in ``params`` as the block returns them,
    not summed with another's, so a weight's may stay in autocast's dtype until ``gradients`` (or autograd's
    engine) casts it after the backward (``kept.deferred_weight_casts``)."""
    sources = {item.name for item in expanded.spec.inputs if item.source}
    instances = [layer for layer in expanded.top.layers if layer.block == block]
    return frozenset(
        name
        for name in expanded.blocks[block].param_names
        if all(  # an instance that leaves an optional branch out binds none of the branch's parameters
            (bound := dict(layer.binding)[name]) in sources
            and bound in flat_graph.nodes
            and len(flat_graph.consumers(bound)) == 1
            for layer in instances
            if name in dict(layer.binding)
        )
    )


def check_plans(spec: Spec) -> None:
    """Raise the ``SpecError`` that planning ``spec`` meets, if any (no test data, nothing rendered): what
    ``symgrad trace`` checks a grouping of instances into blocks with (one derivation for instances that
    differ in hypers or kernel sizes, where it serves them all)."""
    planned_program(expand(spec), tests=False)


def _check_compiles(rendered: Rendered) -> None:
    """Compile every rendered Python file before anything is written, so that no command ever exits 0
    after writing a module Python cannot import (Python's own limits included)."""
    for file_name, text in rendered.files.items():
        if file_name.endswith(".py"):
            try:
                compile(text, file_name, "exec")
            except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
                where = f" at line {error.lineno}" if getattr(error, "lineno", None) else ""
                raise GeneratorError(
                    f"error: symgrad rendered {file_name} that Python cannot compile "
                    f"({type(error).__name__}: {getattr(error, 'msg', error)}{where}); nothing was "
                    "written (fix: this is a bug in symgrad: please report it with the spec)"
                ) from None


def build(
    spec_path: str | Path,
    spec_label: str | None = None,
    extras: tuple[str, ...] = (),
    flat: bool = False,
    recompute: bool = True,
    documents: bool = True,
    keep: str | None = None,
) -> Built:
    """Build from a spec file; ``spec_label`` is how generated headers name it (default: the path);
    ``extras`` adds optional functions (``hvp``) to those the spec asks for; ``flat`` writes a spec's
    blocks out instance by instance instead of one function per block; ``recompute=False`` keeps
    every activation the backward reads, as autograd does, where by default a cheap one is computed
    again in the backward from the operand it keeps anyway (both recorded in the header); ``keep``:
    one of :data:`KEEP` (``recompute=False`` is ``keep="autograd"``; ``lean`` is recorded too);
    ``documents=False`` renders the module and its test file alone, not the derivation's ``.md`` and
    ``.html`` pages (most of the time of a large network's build: for a module imported, not kept)."""
    return _build(
        read_spec(spec_path),
        spec_label or Path(spec_path).as_posix(),
        extras,
        flat,
        recompute=recompute,
        documents=documents,
        keep=keep,
    )


def build_text(
    text: str,
    label: str = "<spec>",
    extras: tuple[str, ...] = (),
    flat: bool = False,
    fused: bool = True,
    recompute: bool = True,
    documents: bool = True,
    tests: bool = True,
    keep: str | None = None,
) -> Built:
    """Build from spec text; ``label`` names it in errors and headers; ``fused=False`` makes
    ``gradients`` run the readable derivation (a spec without blocks, or with ``flat``; not recorded in
    the header, so for a module kept in memory, as ``symgrad certify``'s); ``recompute`` and
    ``documents``, ``keep``: see :func:`build`; ``tests=False``: the module alone, for one imported and not kept
    (``Built.shapes`` is then empty)."""
    return _build(parse_spec(text, label), label, extras, flat, fused, recompute, documents, tests, keep)
