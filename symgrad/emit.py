"""Rendering a :class:`~symgrad.plan.Plan` into files (``symgrad.write`` writes them): printing
its statements and filling the templates, nothing decided here.

Templates live in ``templates/`` (shipped in the wheel as ``symgrad/templates``). They only ever
receive strings made here from validated identifiers, ints and printed sympy expressions: no spec
string reaches them raw. They render in Jinja's sandbox with ``StrictUndefined``.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import math
from dataclasses import dataclass
from importlib import resources

import jinja2
import jinja2.sandbox
import sympy
from markupsafe import escape

from . import __version__
from .diagram import mermaid, svg
from .fingerprint import module_constants
from .mathml import CSS as MATHML_CSS, aligned, mathml
from .plan import Plan, Scheduled
from .printing import comment_lines, entry, fit, prose, to_code, to_latex
from . import testdata
from .write import (HEADER, edited_by_hand, read_header, with_header as _with_header,  # noqa: F401
                    write_files, write_text)  # re-exported: the writing lives in symgrad.write

TESTDATA_SOURCE = "\n\n".join(inspect.getsource(function) for function in (
    testdata.make_inputs, testdata.first_nonfinite, testdata.relative_errors, testdata.checked_subset,
    testdata.in_layout, testdata.float32_acceptable, testdata.available_memory, testdata.memory_shortfall))
"""symgrad.testdata's functions, verbatim, for the generated tests (one definition, two users)."""


@functools.lru_cache(maxsize=None)
def _environment() -> jinja2.Environment:
    """The sandboxed Jinja environment, built once per process: it compiles each template once."""
    loader = jinja2.FunctionLoader(lambda name: resources.files("symgrad.templates").joinpath(name).read_text("utf-8"))
    environment = jinja2.sandbox.SandboxedEnvironment(
        loader=loader, undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True,
        trim_blocks=True, lstrip_blocks=True)
    # the Python templates lay out each statement and sentence within printing.WIDTH columns
    environment.filters.update(fit=fit, prose=prose, comment_lines=comment_lines, entry=entry, hanging=hanging)
    return environment


def hanging(names: list[str], head: str, tail: str, indent: int = 4, plain: str | None = None,
            width: int = 100) -> str:
    """``plain`` where it fits on one line at column ``indent``, else ``head``, the ``names`` as
    many to a line as fit, aligned under the first, and ``tail``: ``(x, p, conv1,`` over
    `` relu) = saved``. The first line without its indent."""
    one = plain if plain is not None else head + ", ".join(names) + tail
    if indent + len(one) <= width:
        return one
    pad = indent + len(head)
    lines = [head]
    for index, name in enumerate(names):
        item = name + (tail if index == len(names) - 1 else ",")
        if lines[-1] == head or (pad if len(lines) > 1 else indent) + len(lines[-1]) + 1 + len(item) <= width:
            lines[-1] += ("" if lines[-1] == head else " ") + item
        else:
            lines.append(" " * pad + item)
    return "\n".join(lines)


@dataclass(frozen=True)
class Line:
    """One emitted statement, already printed."""

    target: str
    code: str
    comment: str
    text: str
    latex_target: str
    latex: str
    dead: tuple[str, ...] = ()
    """Names ``gradients`` deletes right after this line: their last use."""


def _line(statement, dead: tuple[str, ...] = (), in_place: bool = False) -> Line:
    """``statement`` (a :class:`~symgrad.reverse.Statement`) printed; with ``in_place``, as its op's
    in-place form, overwriting its first operand (``torch.relu_(norm)``)."""
    math = statement.math if statement.math is not None else statement.value
    value = statement.value
    code = (value.primitive.inplace([to_code(operand) for operand in value.operands], value.params, to_code)
            if in_place else to_code(value, boolean=_is_mask(statement)))
    return Line(statement.target.name, code, statement.comment, f"{statement.target.name} = {code}",
                to_latex(statement.target), to_latex(math), dead)


def _lines(scheduled: list[Scheduled], steps: list | None = None, overwrite: bool = False) -> list[Line]:
    """The scheduled statements printed, a fused kernel's tuple unpacked where it is made
    (``grad_x, grad_w, _ = _convolution_backward(...)``) instead of read entry by entry; with
    ``steps`` (each statement's derivation step), each line's step is ``steps`` entry, in place; with
    ``overwrite`` (a forward), each op that may overwrite its operand does (:func:`_overwritable`)."""
    lines, index = [], 0
    kept = []
    overwritten = _overwritable(scheduled) if overwrite else set()
    while index < len(scheduled):
        line, used = _unpacked(scheduled, index, index in overwritten)
        lines.append(line)
        kept.append(index)
        index += used
    if steps is not None:
        steps[:] = [steps[position] for position in kept]
    return lines


def _overwritable(scheduled: list[Scheduled]) -> set[int]:
    """The positions of the statements that may run in place: an op with an in-place form (ReLU's
    ``torch.relu_``) whose operand dies there and was made here by an op whose output is fresh
    (``Primitive.fresh``: a convolution's, a norm's, a sum's), so nothing else holds or reads that
    buffer, autograd included. One buffer fewer per ReLU, as the model's own ``ReLU(inplace=True)``;
    the ReLU's backward reads its output, which is what stays."""
    from .algebra import TensorOp

    made = {item.statement.target: item.statement.value for item in scheduled}

    def fresh(value) -> bool:
        if isinstance(value, TensorOp) and value.primitive.name == "item":  # an entry of a fresh tuple
            value = made.get(value.operands[0])
        return (isinstance(value, TensorOp) and value.primitive.fresh) or (
            isinstance(value, sympy.Add) and all(term.is_Symbol for term in value.args))

    positions = set()
    for index, item in enumerate(scheduled):
        value = item.statement.value
        if (isinstance(value, TensorOp) and value.primitive.inplace is not None and value.operands
                and value.operands[0].is_Symbol and value.operands[0].name in item.dead
                and fresh(made.get(value.operands[0]))):
            positions.add(index)
    return positions


def _unpacked(scheduled: list[Scheduled], index: int, in_place: bool = False) -> tuple[Line, int]:
    """The line for ``scheduled[index]`` and how many statements it stands for: one, or a tuple made
    there together with the ``t[i]`` reads right after it, when they are its only uses."""
    from .algebra import TensorOp

    item = scheduled[index]
    value, target = item.statement.value, item.statement.target
    outputs = value.primitive.outputs if isinstance(value, TensorOp) else None
    reads, position = {}, index + 1
    while position < len(scheduled):
        read = scheduled[position].statement.value
        if not (isinstance(read, TensorOp) and read.primitive.name == "item" and read.operands[0] == target):
            break
        reads[read.params["index"]] = scheduled[position]
        position += 1
    dead = [name for other in reads.values() for name in other.dead]
    if not outputs or not reads or target.name not in dead or max(reads) >= outputs:
        return _line(item.statement, item.dead, in_place), 1
    names = ", ".join(reads[entry].statement.target.name if entry in reads else "_" for entry in range(outputs))
    code = to_code(value)
    dying = tuple(dict.fromkeys(name for name in (*item.dead, *dead) if name != target.name))
    return (Line(names, code, item.statement.comment, f"{names} = {code}", to_latex(target), to_latex(value), dying),
            position - index)


def _is_mask(statement) -> bool:
    """A saved ReLU-style mask (``mask_<node>``): kept as bool, a quarter of a float's memory."""
    return statement.local_kind == "mask"


@dataclass
class Rendered:
    """The three generated files, as text, keyed by file name."""

    name: str
    files: dict[str, str]
    summary: list[str]
    latex: str = ""
    """The emitted gradients as one LaTeX ``aligned`` block."""


NOTATION = (r"$\overline{v}$ is the gradient of the loss with respect to node $v$ (same shape as $v$), $\odot$ is "
            r"the elementwise product, $w \star_{s,p,d,g} x$ is PyTorch's convolution (cross-correlation) with "
            r"stride, padding, dilation and groups, $w^{\top} \star$ its adjoint in the input (a transposed "
            r"convolution) and $x \star^{w} \overline{y}$ its adjoint in the weight. $\mathrm{local}_{v}$ and "
            r"$\mathrm{mask}_{v}$ name a local gradient of node $v$, computed once and reused; $A_{k}$ is the matrix "
            r"of a separable resampling or pooling op along spatial axis $k$ (the code reads it off at run time by "
            r"applying the op to the identity), so $A_{k}^{\top}$ carries the gradient back along that axis; "
            r"$\operatorname{mean}_{D}$ averages over the normalised axes $D$.")


def _notation_html() -> str:
    parts = NOTATION.split("$")
    return "".join(mathml(part) if index % 2 else str(escape(part)) for index, part in enumerate(parts))


def render(planned: Plan, spec_label: str, recorded_extras: tuple[str, ...] = ()) -> Rendered:
    """All generated files for ``planned``; ``recorded_extras`` are the extras named in the headers
    (those the command line added, so that ``check`` can redo them)."""
    program = planned.program
    graph = program.graph
    spec = graph.spec
    names = [node.name for node in graph.inputs]
    forward = [_line(statement) for statement in planned.forward]
    readable_backward = [_line(statement) for statement in planned.readable_backward]
    step_of_line = list(planned.step_of_line)
    gradients_backward = _lines(planned.backward, step_of_line)
    descriptions = _node_description(program)
    kinds = {"input": "leaf", "layer": "intermediate", "loss": "output"}
    node_rows = [dict(name=node.name, op=descriptions.get(node.name, "input"), shape=list(node.shape),
                      stored=planned.stored[node.name],
                      kind=("leaf (parameter, differentiated)" if node.name in graph.wrt else "leaf (constant)")
                      if node.kind == "input" else kinds[node.kind]) for node in graph.nodes.values()]
    lines_of_step: dict[int, list[int]] = {}
    for index, line_step in enumerate(step_of_line, 1):
        lines_of_step.setdefault(line_step, []).append(index)
    step_views = []
    for number, step in enumerate(program.steps, 1):
        step_views.append(dict(
            number=number, node=step.node, forward=step.forward, incoming=mathml(to_latex(step.incoming)),
            locals=[mathml(f"{to_latex(symbol)} = {to_latex(value)}") for symbol, value in step.locals],
            contributions=[dict(source=source, operand=operand, mathml=mathml(to_latex(value)),
                                branch=len(program.branch_sums.get(source, [])))
                           for operand, source, value in step.contributions],
            lines=lines_of_step.get(number, [])))
    layout_kept, running = planned.layout_kept, planned.running_statistics
    hvp_results = {name: (to_code(value) if value != 0 else f"torch.zeros_like({name})")
                   for name, value in planned.hvp_results.items()}
    context = dict(
        **_outputs_context(spec, graph),
        sources={item.name: (item.source, item.shape) for item in spec.inputs if item.source},
        fingerprint=module_constants(spec),
        running_statistics=running,
        helpers=planned.helpers,
        channels_last=planned.channels_last,
        channels_last_in_backward=planned.channels_last_in_backward,
        channels_last_test=planned.channels_last_test,
        channels_last_constant=planned.channels_last_constant,
        channels_last_at_spec=planned.channels_last_at_spec,
        layout_kept=layout_kept,
        gradients_return=", ".join(
            f"{name}=grad_{name}.contiguous(memory_format={name}_layout)" if name in layout_kept
            else f"{name}=grad_{name}" for name in graph.wrt),
        function_grads=", ".join(f"grads.{name}" if name in graph.wrt else "None" for name in names),
        name=spec.name,
        version=__version__,
        spec_label=spec_label,
        inputs=names,
        signature=", ".join(names),
        # the running statistics move in place in the forward, and a train-mode forward does not read
        # them: the Function keeps None for them, so that a forward re-run in the backward
        # (recompute, create_graph) computes the batch's statistics without moving them again
        saved_signature=", ".join("None" if any(name in entry[:2] for entry in running)
                                  else name for name in names),  # found once: per name, it was quadratic
        wrt=list(graph.wrt),
        non_wrt=[name for name in names if name not in graph.wrt],
        forward=forward,
        gradients_backward=gradients_backward,
        readable_backward=readable_backward,
        boundary_dead=planned.boundary_dead,
        saved_names=planned.saved_names,
        saving_forward=_lines(planned.saving_forward, overwrite=True),
        loss_name=planned.loss_name,
        hvp=bool(hvp_results),
        per_sample=bool(planned.per_sample_forward),
        per_sample_forward=_lines(planned.per_sample_forward),
        per_sample_backward=_lines(planned.per_sample_backward),
        per_sample_dead=planned.per_sample_dead,
        per_sample_names=planned.per_sample_names,
        per_sample_return=", ".join(f"{name}=per_sample_grad_{name}" for name in planned.per_sample_names),
        per_sample_batched=planned.per_sample_batched,
        hvp_lines=([_line(statement) for statement in planned.hvp_forward],
                   [_line(statement) for statement in planned.hvp_backward]),
        hvp_return=", ".join(f"{name}={value}" for name, value in hvp_results.items()),
        tangent_signature=", ".join(f"tangent_{name}" for name in graph.wrt),
        default_cotangent=to_code(program.default_cotangent),
        grad_loss=planned.grad_loss,
        reduction=graph.loss.params["reduction"],
        spec_shapes={node.name: tuple(node.shape) for node in graph.inputs},
        spec_entries=sum(math.prod(node.shape) for node in graph.nodes.values()),  # as check.require_memory counts
        small_shapes=planned.small_shapes,
        classes=planned.classes,
        roles=planned.roles,
        zero_by_structure=planned.zero_by_structure,
        testdata_source=TESTDATA_SOURCE,
        node_rows=node_rows,
        steps=program.steps,
        branch_sums=program.branch_sums,
        to_latex=to_latex,
        notation=NOTATION,
        loss_latex=to_latex(program.forward[-1].value),
        mermaid=mermaid(graph),
        # HTML views: every string below is built from validated names and printed sympy, then escaped
        svg=svg(graph),
        notation_html=_notation_html(),
        loss_mathml_block=mathml(r"\ell = " + to_latex(program.forward[-1].value), block=True),
        step_views=step_views,
        branch_rows=[dict(node=node, consumers=", ".join(consumers)) for node, consumers in program.branch_sums.items()],
        mathml_css=MATHML_CSS,
        gradients_mathml=aligned([(line.latex_target, line.latex) for line in readable_backward]),
        code_lines=[dict(number=index, step=step, text=str(escape(f"{line.target} = {line.code}")))
                    for index, (line, step) in enumerate(zip(gradients_backward, step_of_line), 1)],
    )
    environment = _environment()
    spec_hash = hashlib.sha256(spec.text.encode("utf-8")).hexdigest()
    files = {}
    for template, file_name in TEMPLATES:
        file_name = file_name.format(name=spec.name)
        body = environment.get_template(template).render(**context)
        files[file_name] = _with_header(body, spec_label, spec_hash, comment=_COMMENT_STYLE[file_name.rsplit(".", 1)[1]],
                                        extras=recorded_extras)
    summary = [line.text for line in gradients_backward]
    latex = "\\begin{aligned}\n" + " \\\\\n".join(f"{line.latex_target} &= {line.latex}" for line in readable_backward) + "\n\\end{aligned}"
    return Rendered(spec.name, files, summary, latex)


def _outputs_context(spec, graph) -> dict:
    """What the templates' outputs-form sections read (``outputs: False`` for a loss-ending spec)."""
    outputs = spec.outputs
    random = any(getattr(node.rule, "random", False) for node in graph.nodes.values() if node.rule is not None)
    if outputs is None:
        return dict(outputs=False, random=random)
    keys = [key for key, _, _ in outputs.entries]
    described = {"tensor": "one tensor", "tuple": f"a tuple of {len(keys)}",
                 "dict": "a dict with the keys " + ", ".join(keys)}[outputs.kind]
    return dict(outputs=True, outputs_kind=outputs.kind, random=random, outputs_names=list(outputs.nodes), outputs_described=described,
                outputs_keys="(" + ", ".join(f'"{key}"' for key in keys) + ("," if len(keys) == 1 else "") + ")",
                eval_module=spec.eval)


TEMPLATES = (("module.py.jinja", "{name}.py"), ("test_module.py.jinja", "test_{name}.py"),
             ("derivation.md.jinja", "{name}.md"), ("derivation.html.jinja", "{name}.html"))
DOCUMENTS = ("{name}.md", "{name}.html")
_COMMENT_STYLE = {"py": "python", "md": "markup", "html": "markup"}


def _node_description(program) -> dict[str, str]:
    graph = program.graph
    descriptions = {}
    for statement in program.forward:
        if statement.target.name in graph.nodes:
            descriptions[statement.target.name] = to_code(statement.value)
    return descriptions
