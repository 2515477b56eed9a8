"""Rendering a :class:`~symgrad.plan.Plan` into files (``symgrad.write`` writes them): printing
its statements and filling the templates, nothing decided here.

Templates live in ``templates/`` (shipped in the wheel as ``symgrad/templates``). They only ever
receive strings made here from validated identifiers, ints and printed sympy expressions: no spec
string reaches them raw. They render in Jinja's sandbox with ``StrictUndefined``.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from . import __version__
from .documents import Section, environment, headed, render_documents, render_tests
from .fingerprint import module_constants
from .plan import Plan, Scheduled
from .printing import to_code, to_latex
from .write import (HEADER, edited_by_hand, read_header, with_header as _with_header,  # noqa: F401
                    write_files, write_text)  # re-exported: the writing lives in symgrad.write

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


def printed_line(statement, dead: tuple[str, ...] = (), in_place: bool = False) -> Line:
    """``statement`` (a :class:`~symgrad.reverse.Statement`) printed; with ``in_place``, as its op's
    in-place form, overwriting its first operand (``torch.relu_(norm)``)."""
    math = statement.math if statement.math is not None else statement.value
    value = statement.value
    code = (value.primitive.inplace([to_code(operand) for operand in value.operands], value.params, to_code)
            if in_place else to_code(value, boolean=_is_mask(statement)))
    return Line(statement.target.name, code, statement.comment, f"{statement.target.name} = {code}",
                to_latex(statement.target), to_latex(math), dead)


def printed_lines(scheduled: list[Scheduled], steps: list | None = None, overwrite: bool = False) -> list[Line]:
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
        return printed_line(item.statement, item.dead, in_place), 1
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


def render(planned: Plan, spec_label: str, recorded_extras: tuple[str, ...] = ()) -> Rendered:
    """All generated files for ``planned``; ``recorded_extras`` are the extras named in the headers
    (those the command line added, so that ``check`` can redo them)."""
    program = planned.program
    graph = program.graph
    spec = graph.spec
    names = [node.name for node in graph.inputs]
    forward = [printed_line(statement) for statement in planned.forward]
    readable_backward = [printed_line(statement) for statement in planned.readable_backward]
    step_of_line = list(planned.step_of_line)
    gradients_backward = printed_lines(planned.backward, step_of_line)
    layout_kept, running = planned.layout_kept, planned.running_statistics
    hvp_results = {name: (to_code(value) if value != 0 else f"torch.zeros_like({name})")
                   for name, value in planned.hvp_results.items()}
    context = dict(
        **outputs_context(spec, graph),
        sources={item.name: (item.source, item.shape) for item in spec.inputs if item.source},
        fingerprint=module_constants(spec),
        running_statistics=running,
        helpers=planned.helpers,
        channels_last=planned.channels_last,
        channels_last_in_backward=planned.channels_last_in_backward,
        channels_last_test=planned.channels_last_test,
        channels_last_constant=planned.channels_last_constant,
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
        saving_forward=printed_lines(planned.saving_forward, overwrite=True),
        loss_name=planned.loss_name,
        hvp=bool(hvp_results),
        per_sample=bool(planned.per_sample_forward),
        per_sample_forward=printed_lines(planned.per_sample_forward),
        per_sample_backward=printed_lines(planned.per_sample_backward),
        per_sample_dead=planned.per_sample_dead,
        per_sample_names=planned.per_sample_names,
        per_sample_return=", ".join(f"{name}=per_sample_grad_{name}" for name in planned.per_sample_names),
        per_sample_batched=planned.per_sample_batched,
        hvp_lines=([printed_line(statement) for statement in planned.hvp_forward],
                   [printed_line(statement) for statement in planned.hvp_backward]),
        hvp_return=", ".join(f"{name}={value}" for name, value in hvp_results.items()),
        tangent_signature=", ".join(f"tangent_{name}" for name in graph.wrt),
        default_cotangent=to_code(program.default_cotangent),
        grad_loss=planned.grad_loss,
        reduction=graph.loss.params["reduction"],
    )
    files = {f"{spec.name}.py": environment().get_template("module.py.jinja").render(**context)}
    per_sample = (planned.per_sample_names, planned.per_sample_batched) if planned.per_sample_forward else None
    files.update(render_tests(planned.test_facts, {},  # this module takes every input by name
                              hvp=bool(hvp_results), per_sample=per_sample))
    section = Section(spec.name, "", planned, tuple(line.text for line in gradients_backward), tuple(step_of_line))
    files.update(render_documents(spec, spec_label, [section]))
    files = headed(files, spec, spec_label, recorded_extras)
    summary = [line.text for line in gradients_backward]
    latex = "\\begin{aligned}\n" + " \\\\\n".join(f"{line.latex_target} &= {line.latex}" for line in readable_backward) + "\n\\end{aligned}"
    return Rendered(spec.name, files, summary, latex)


def outputs_context(spec, graph) -> dict:
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


DOCUMENTS = ("{name}.md", "{name}.html")

