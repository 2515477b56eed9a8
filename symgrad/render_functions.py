"""The functions of the generated module as a model (:mod:`symgrad.render_sections`): ``forward``,
``gradients``, the extras (``hvp``, ``per_sample_gradients``), the saving forward and its backward, the
autograd Function and its entry, decided and printed for ``module/loss.jinja`` and ``module/outputs.jinja``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from jinja2.utils import htmlsafe_json_dumps

from .algebra import tensor
from .emit import Line, outputs_context, packed, printed_forward, printed_line, printed_lines
from .plan import Structured


@dataclass(frozen=True)
class Hvp:
    """``hvp(...)``: forward mode over :func:`gradients`."""

    forward: tuple[Line, ...]
    backward: tuple[Line, ...]
    tangent_signature: str
    returned: str
    keyed_note: str


@dataclass(frozen=True)
class PerSample:
    """``per_sample_gradients(...)`` and its result's class."""

    fields: tuple[str, ...]
    params: bool
    keyed_note: str
    described: str
    forward: tuple[Line, ...]
    dead: tuple[str, ...]
    backward: tuple[Line, ...]
    returned: str


@dataclass(frozen=True)
class Outputs:
    """A spec that ends in outputs: their table, and the forward that returns them."""

    described: str
    keys: str
    kind: str
    eval_module: str | None
    reached_by: tuple[str, ...]
    names: str
    forward: tuple[tuple[bool, Line], ...]
    """Each forward line, and whether it is the one that returns the outputs."""
    returned: str


@dataclass(frozen=True)
class Autograd:
    """The autograd Function and its entry (``ExplicitGradient`` or ``ExplicitOutputs``,
    ``loss_with_explicit_backward``): what the macros ``entry_function``, ``function_head``,
    ``saved_under_compile``, ``saved_read_back`` and ``function_tail`` print."""

    signature: str
    has_params: bool
    positional: tuple[str, ...]
    function_inputs: str
    saved_inputs: str
    """What ``ctx.save_for_backward`` keeps (a running statistic passed by name as None: not moved twice)."""
    compile_saved_inputs: str
    device_of: str
    random: bool
    read_back_targets: str
    read_back_sliced: bool
    """Python takes at most 255 names before a starred one: the saved tensors are read by slicing."""
    rest_name: str
    positional_count: int
    guarded: bool
    """Named inputs not in ``wrt``: the backward refuses a call that asks for their gradients."""
    guarded_names: str
    guarded_indices: str
    unreached: bool
    function_grads: str
    parameter_grads_return: str


@dataclass(frozen=True)
class Saving:
    """``_forward_saving`` and ``_backward_from_saved``: what the macro ``saving_and_backward`` prints."""

    signature: str
    has_params: bool
    moves_params: bool
    channels_last_test: str | None
    channels_last_named: tuple[str, ...]
    backward_channels_last_named: tuple[str, ...]
    backward_moved_keys: str
    moved_test: str
    saving_forward: tuple[Line, ...]
    saving_returns: tuple[str, ...]
    saving_returns_plain: str
    saved_names: tuple[str, ...]
    saved_plain: str
    layout_kept: tuple[str, ...]
    default_cotangent: str
    boundary_dead: tuple[str, ...]
    backward: tuple[Line, ...]
    backward_steps: tuple
    """Each backward line's derivation step (the documents link each step to its lines)."""
    positional_returns: tuple[tuple[str, str], ...]
    positional_returns_line: str
    params_open: str
    params_close: str
    param_returns: tuple[str, ...]


@dataclass(frozen=True)
class Functions:
    """``module/loss.jinja`` and ``module/outputs.jinja``: ``forward``, ``gradients``, the extras, then
    the saving forward and its backward (:class:`Saving`) and the autograd Function (:class:`Autograd`)."""

    outputs: Outputs | None
    signature: str
    has_params: bool
    positional_wrt: tuple[str, ...]
    positional_casts: str
    """``x=grads.x.to(x.dtype), ...``: each positional gradient in its input's dtype, as autograd's engine
    casts it (under autocast a product's gradient comes out in its lower precision)."""
    gradient_fields: tuple[str, ...]
    """``Gradients``' fields: a gradient by its input's name, and ``params`` saying how it is keyed."""
    gradients_of: str
    reduction: str
    loss_shape: str
    forward: tuple[Line, ...]
    per_sample: PerSample | None
    hvp: Hvp | None
    default_cotangent: str
    loss_name: str
    saving: Saving
    autograd: Autograd


def unpacked(names) -> str:
    """``a, b`` (``a,`` alone): the targets that unpack a list of ``names``."""
    return ", ".join(names) + ("," if len(names) == 1 else "")


def entries_packed(pairs: list, indent: int, merged: tuple = ()) -> list[str]:
    """A returned mapping's entries (``"conv1.weight": grad_conv1_weight,``, then ``**grads,``) as
    many to a line as fit at column ``indent``; one a line (its value below a long key) where one
    alone does not fit."""
    from .printing import entry

    entries = [f'"{key}": {value},' for key, value in pairs] + [f"**{text}," for text in merged]
    if all(indent + len(text) <= 100 for text in entries):
        return packed(entries, indent)
    return [entry(key, value, indent) for key, value in pairs] + [f"**{text}," for text in merged]


def functions_section(structured: Structured, sources: dict, positional: list[str], random: bool) -> Functions:
    """The functions of ``structured``'s module: what ``module/loss.jinja`` or ``module/outputs.jinja`` prints."""
    from .printing import to_code

    spec, graph, planned, top = structured.spec, structured.graph, structured.planned, structured.top_plan
    entries, layout = top.entries, structured.layout_plan
    wrt = list(graph.wrt)
    positional_wrt = tuple(name for name in wrt if name not in sources)
    params = bool(sources)
    running = {name for mean, var, _ in structured.running_statistics for name in (mean, var)}
    saved = [("None" if name in running else name) for name in positional]  # a re-run must not move them again
    if params:
        function_inputs, saved_inputs = ", ".join(["keys", *positional, "*values"]), ", ".join([*saved, "*kept"])
    else:
        function_inputs, saved_inputs = ", ".join(positional), unpacked(saved)
    # the named inputs not differentiated by, at their positions among the Function's arguments
    guarded = [(index, name) for index, name in enumerate(positional, start=2 if params else 1) if name not in wrt]
    function_grads = ", ".join(f"grads.{name}" if name in wrt else "None" for name in positional)
    positional_returns = tuple(
        (name, f"grad_{name}.contiguous(memory_format={name}_layout)" if name in layout.kept else f"grad_{name}")
        for name in positional_wrt
    )
    forward = tuple(
        printed_forward([dataclasses.replace(item, value=item.value.xreplace(entries)) for item in planned.forward])
    )
    outputs = _outputs(spec, structured.flat_graph, forward, planned.loss_name)
    star_rest = "*values" if params else "*tensors"
    steps = list(planned.step_of_line)  # each backward line's derivation step, as printed
    backward = tuple(printed_lines(list(top.backward), steps, own_line=4))
    signature = ", ".join(positional + (["params"] if params else []))
    default_cotangent = to_code(planned.program.default_cotangent)
    saving = Saving(
        signature=signature,
        has_params=params,
        moves_params=bool(layout.keys),
        channels_last_test=layout.test,
        channels_last_named=tuple(layout.named),
        backward_channels_last_named=tuple(layout.backward_named),
        backward_moved_keys=", ".join(str(htmlsafe_json_dumps(key)) for key in layout.backward_keys),
        moved_test=moved_test(layout),
        saving_forward=tuple(printed_lines(list(top.saving_forward))),
        saving_returns=(planned.loss_name, *planned.saved_names),
        saving_returns_plain=", ".join([planned.loss_name, *planned.saved_names])
        + ("" if planned.saved_names else ","),
        saved_names=tuple(planned.saved_names),
        saved_plain=unpacked(planned.saved_names),
        layout_kept=tuple(layout.kept),
        default_cotangent=default_cotangent,
        boundary_dead=tuple(planned.boundary_dead),
        backward=backward,
        backward_steps=tuple(steps),
        positional_returns=positional_returns,
        positional_returns_line=", ".join(f"{name}={value}" for name, value in positional_returns),
        params_open="_in_layouts(layouts, {" if layout.keys else "{",
        params_close=")" if layout.keys else "",
        # under `params=` beside other fields, else right under `return Gradients(params={`
        param_returns=tuple(
            entries_packed(
                list(structured.param_returns), 12 if positional_returns else 8, tuple(structured.merged_returns)
            )
        ),
    )
    autograd = Autograd(
        signature=signature,
        has_params=params,
        positional=tuple(positional),
        function_inputs=function_inputs,
        saved_inputs=saved_inputs,
        compile_saved_inputs=saved_inputs.removesuffix(","),
        device_of=positional[0] if positional else "values[0]",  # an output that reads no data input
        random=random,
        read_back_targets=", ".join(positional + [star_rest]) if positional else star_rest[1:],
        read_back_sliced=len(positional) >= 255,
        rest_name=star_rest[1:],
        positional_count=len(positional),
        guarded=bool(guarded),
        guarded_names=", ".join(name for _, name in guarded),
        guarded_indices=", ".join(str(index) for index, _ in guarded) + ("," if len(guarded) == 1 else ""),
        unreached=bool(outputs and outputs.reached_by),
        function_grads=function_grads,
        parameter_grads_return=", ".join(
            ["None", "None"] + ([function_grads] if function_grads else []) + ["*parameter_grads"]
        ),
    )
    return Functions(
        outputs=outputs,
        signature=signature,
        has_params=params,
        positional_wrt=positional_wrt,
        positional_casts=", ".join(f"{name}=grads.{name}.to({name}.dtype)" for name in positional_wrt),
        gradient_fields=tuple(f"{name}: torch.Tensor" for name in positional_wrt)
        + (("params: dict  # the gradients with respect to the parameters, keyed as they are",) if params else ()),
        gradients_of=", ".join(positional_wrt + (("the parameters",) if params else ())),
        reduction=graph.loss.params["reduction"],
        loss_shape="[N]" if graph.loss.params["reduction"] == "per_sample" else "[]",
        forward=forward,
        per_sample=_per_sample(planned, top, sources),
        hvp=_hvp(planned, entries, sources, positional),
        default_cotangent=default_cotangent,
        loss_name=planned.loss_name,
        saving=saving,
        autograd=autograd,
    )


def moved_test(layout) -> str:
    """Which ``params`` entries ``_channels_last`` moves: those listed in ``CHANNELS_LAST`` where other
    4-d entries stay, else every 4-d one (:class:`~symgrad.plan.LayoutPlan`)."""
    return "key in CHANNELS_LAST" if layout.others else "value.dim() == 4"


def _outputs(spec, graph, forward: tuple[Line, ...], loss_name: str) -> Outputs | None:
    """The outputs' table and the forward returning them (None: a spec that ends in a loss)."""
    context = outputs_context(spec, graph)
    if not context["outputs"]:
        return None
    returned = "_unread_as_none(ctx, outputs)" if context["reached_by"] else "outputs"
    return Outputs(
        described=context["outputs_described"],
        keys=context["outputs_keys"],
        kind=context["outputs_kind"],
        eval_module=context["eval_module"],
        reached_by=tuple(context["reached_by"]),
        names=", ".join(context["outputs_names"]),
        forward=tuple((line.target == loss_name, line) for line in forward),
        returned=returned,
    )


def _returned(values: dict, sources: dict, params: bool) -> str:
    named = [f"{name}={value}" for name, value in values.items() if name not in sources]
    keyed = [f'"{sources[name]}": {value}' for name, value in values.items() if name in sources]
    return ", ".join(named + (["params={" + ", ".join(keyed) + "}"] if params else []))


def _hvp(planned, entries: dict, sources: dict, positional: list[str]) -> Hvp | None:
    """``hvp``, printed with the names the code uses: a parameter's tangent is its entry of
    ``tangent_params``, keyed as ``params`` is, and its products come back keyed so too."""
    from .printing import to_code

    if not planned.hvp_results:
        return None
    wrt = list(planned.program.graph.wrt)
    tangents = {
        tensor(f"tangent_{name}"): tensor(f'tangent_params["{sources[name]}"]') for name in wrt if name in sources
    }
    names = {**entries, **tangents}
    results = {
        name: (
            to_code(value.xreplace(names))
            if value != 0
            else f"torch.zeros_like({to_code(tensor(name).xreplace(entries))})"
        )
        for name, value in planned.hvp_results.items()
    }
    return Hvp(
        forward=tuple(printed_line(dataclasses.replace(s, value=s.value.xreplace(names))) for s in planned.hvp_forward),
        backward=tuple(
            printed_line(dataclasses.replace(s, value=s.value.xreplace(names))) for s in planned.hvp_backward
        ),
        tangent_signature=", ".join(
            [f"tangent_{name}" for name in positional if name in wrt]
            + (["tangent_params"] if any(name in sources for name in wrt) else [])
        ),
        returned=_returned(results, sources, bool(sources)),
        keyed_note=" (``tangent_params`` keyed as ``params``)" if sources else "",
    )


def _per_sample(planned, top, sources: dict) -> PerSample | None:
    """``per_sample_gradients`` (``Plan``'s extra), its parameters keyed as ``params`` is."""
    if not planned.per_sample_forward:
        return None
    names = planned.per_sample_names
    params = any(name in sources for name in names)
    return PerSample(
        fields=tuple(name for name in names if name not in sources),
        params=params,
        keyed_note=" (``params``: keyed as the parameters)" if params else "",
        described=", ".join(name if name not in sources else f'``params["{sources[name]}"]``' for name in names),
        forward=tuple(printed_lines(list(top.per_sample_forward))),
        dead=tuple(planned.per_sample_dead),
        backward=tuple(printed_lines(list(top.per_sample_backward))),
        returned=_returned({name: f"per_sample_grad_{name}" for name in names}, sources, params),
    )
