"""One run of the traced code at given shapes (:func:`run_once`): random inputs, the model's parameters,
buffers and the tensors its code reads by name as sources, every torch call recorded, the calls built
into layers and the spec dict (inputs, layers, loss or outputs, wrt); value reads refused, and the
model's buffers left as they were. ``symgrad.trace`` runs it at the traced sizes and again at others."""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch

from ..guards import set_profile_back
from ..spec_values import check_identifier
from .custom_functions import checked_functions
from .dataflow import Problem, Source, fitted, plain_name, report
from .errors import Refusal, TraceError
from .frames import is_users, user_line_of_traceback
from .layers import SpecBuilder
from .losses import LossChoice, ends_in_outputs, live_layers, loss_of, outputs_of, target_input
from .recorder import VALUE_READS, Recorder
from .rerun import shapes_text
from .sizes import PlainCompared, einops_uncached
from .unused_statistics import refuse_unused_statistics


def defined_at(hook) -> str:
    """``FILE:LINE: `` where ``hook``'s function is defined, or "" where it has no code (a callable object)."""
    from ..fingerprint import hook_function
    from ..write import shown_path

    code = getattr(hook_function(hook), "__code__", None)
    return f"{shown_path(code.co_filename)}:{code.co_firstlineno}: " if code is not None else ""


def run_once(
    function,
    module,
    shapes,
    arguments,
    dtypes,
    loss: LossChoice | None,
    quiet: bool = False,
    dtype: torch.dtype | None = None,
    autocast_guards: dict | None = None,
):
    """Run once at ``shapes``: the spec dict (inputs, layers, loss, wrt) and the layers' calls; ``dtype``: the
    inputs' (default: the model's own precision); ``autocast_guards`` is given the code's own regions that
    turn autocast off and the places that ask whether it is on (``Recorder.autocast_regions``, ``autocast_reads``),
    by the guards' keys ``autocast`` and ``autocast_read``."""
    roots: list[tuple[str, torch.nn.Module]] = [("", module)] if module is not None else []
    named_tensors: dict[str, torch.Tensor] = {}
    for key, value in visible_globals(function).items():
        if isinstance(value, torch.Tensor):
            named_tensors[key] = value
        elif isinstance(value, torch.nn.Module):
            roots.append((key, value))
    floating = [value.dtype for _, root in roots for value in root.parameters() if value.is_floating_point()]
    floating += [value.dtype for value in named_tensors.values() if value.is_floating_point()]
    dtype = dtype or (floating[0] if floating else torch.get_default_dtype())  # the model's own precision
    generator = torch.Generator().manual_seed(0)
    tensors = {
        key: (
            torch.zeros(shape, dtype=torch.int64)
            if dtypes.get(key) == "int64"
            else torch.randn(shape, generator=generator, dtype=dtype)
        )
        for key, shape in shapes.items()
    }
    sources: dict[int, Source] = {id(value): Source(key, dtypes.get(key) != "int64") for key, value in tensors.items()}
    sources.update({id(value): Source(key, False) for key, value in named_tensors.items() if id(value) not in sources})
    module_paths: dict[int, str] = {}
    mutable: set[int] = set()
    taken = {source.name for source in sources.values()}  # an argument named as a buffer (BERT's position_ids)
    for prefix, root in roots:
        for path, child in root.named_modules():
            module_paths.setdefault(id(child), ".".join(part for part in (prefix, path) if part))
        for path, value in root.named_parameters():
            if id(value) not in sources:
                sources[id(value)] = Source(
                    source_name(prefix, path, root, taken), value.requires_grad, path if root is module else None
                )
        for path, value in root.named_buffers():
            if id(value) not in sources:
                sources[id(value)] = Source(
                    source_name(prefix, path, root, taken), False, path if root is module else None
                )
            mutable.add(id(value))
    saved = [
        (owner, key, value, value.detach().clone())
        for _, root in roots
        for owner in root.modules()
        for key, value in owner._buffers.items()
        if value is not None
    ]
    recorder = Recorder(module_paths)
    recorder.from_integers.update(id(value) for value in tensors.values() if value.dtype == torch.int64)
    recorder.precision = dtype  # constants are recorded as a float64 run of the model makes them
    try:  # as a training step runs it, whatever the caller's mode (each recorded call: no graph)
        with torch.enable_grad(), recorder, einops_uncached():
            output, returned_at = call_returning(function, {**tensors, **arguments})
    except PlainCompared:  # len(h[h > 0]) compared: the value read says more
        refuse_value_reads(recorder)
        raise
    except TraceError:
        raise
    except Exception as error:  # the user's code failed at these shapes: say where, in one line
        refuse_value_reads(recorder)  # ... unless it took a branch from a tensor's value first
        if quiet:
            raise
        raise TraceError(
            f"{user_line_of_traceback(error.__traceback__)}: error: running it at "
            f"{shapes_text(shapes)} failed: {first_line(error)} (fix: check the --input shapes and --arg values)"
        ) from None
    finally:  # tracing must not move the model's running statistics, nor put another tensor in a buffer's place
        replaced = [(owner, key) for owner, key, value, _ in saved if owner._buffers.get(key) is not value]
        for owner, key, value, copy in saved:
            owner._buffers[key] = value
            value.copy_(copy)
    refuse_value_reads(recorder)
    if recorder.autocast_regions and module is None:  # no guards: nothing would refuse the caller's autocast
        where, device = next(iter(recorder.autocast_regions.items()))
        raise TraceError(
            f"{where}: error: the traced function turns autocast off for its own region "
            f'(torch.autocast("{device}", enabled=False)), which only the guards of a traced model can hold (fix: '
            "trace the model (FILE.py:Model), whose bound step refuses the caller's autocast around that region, "
            "or remove the region)"
        )
    if autocast_guards is not None:
        autocast_guards.update(autocast=recorder.autocast_regions, autocast_read=recorder.autocast_reads)
    if replaced:
        owner, key = replaced[0]
        buffer = ".".join(part for part in (module_paths.get(id(owner), ""), key) if part)
        raise TraceError(
            f"{defined_at(type(owner).forward)}error: the forward puts a new tensor in the buffer "
            f"{buffer} (self.{key} = ...), which the explicit training step does not do (fix: return what "
            "the update reads as one more output and update the buffer in your training loop, or trace "
            "the model without the update)"
        )
    if recorder.no_grad_in_checkpoint:
        raise TraceError(
            f"{recorder.no_grad_in_checkpoint[0]}: error: turns gradients off inside a "
            "torch.utils.checkpoint block, whose own no_grad() hides which values autograd "
            "differentiates (fix: compute that value outside the checkpointed function)"
        )
    modules = {path: child for path, child in module.named_modules()} if module is not None else {}
    builder = SpecBuilder(
        sources,
        mutable,
        modules=modules,
        size_tensors=recorder.size_tensors,
        quiet=quiet,
        arguments={key: value for key, value in tensors.items() if value.is_floating_point()},
        reserved=frozenset() if loss is None else frozenset({loss.target}),
    )
    for call in recorder.calls:
        builder.add(call)
    try:
        outputs = (
            outputs_of(builder, output, returned_at) if loss is None and ends_in_outputs(builder, output) else None
        )
        loss_entry = (
            loss_of(builder, output, loss, shapes, returned_at) if outputs is None else {"in": None, "target": None}
        )
    except TraceError as error:  # a custom Function refused at these sizes alone: no other size mends it
        raise builder.function_refusal(error) from None
    layers, used = live_layers(builder, loss_entry, outputs)
    refuse_unused_statistics(builder.layers, layers, builder.layer_calls, modules)
    inputs: dict[str, dict] = {}
    state_keys = {source.name: source.state_key for source in sources.values() if source.state_key}
    for key in [*shapes, *builder.used_sources]:
        if key in used and key not in inputs:
            value = tensors.get(key, builder.used_sources.get(key))
            inputs[key] = {
                "shape": list(value.shape),
                **({"dtype": "int64"} if value.dtype == torch.int64 else {}),
                **({"source": state_keys[key]} if key in state_keys else {}),
            }
    if loss is not None:
        inputs[loss.target] = target_input(builder, output, loss)
    trainable = {source.name for source in sources.values() if source.trainable}
    wrt = [key for key in inputs if key in trainable and key != loss_entry["target"]]
    layer_calls = [call for call, layer in zip(builder.layer_calls, builder.layers) if layer in layers]
    end = {"outputs": outputs} if outputs is not None else {"loss": loss_entry}
    checked = checked_functions(builder.checked_functions, layer_calls)
    return {"inputs": inputs, "layers": layers, **end, "wrt": wrt, **checked}, layer_calls


def call_returning(function, arguments: dict[str, Any]) -> tuple[Any, str | None]:
    """``function(**arguments)``, and the ``file:line`` of the ``return`` that ended it, when the function is
    the user's own code: its frame, caught as it starts (the profiler then removes itself, so it costs nothing
    while the code runs), keeps the line it returned from."""
    here = sys._getframe()
    started: list = []
    previous = sys.getprofile()

    def profile(frame, event, argument) -> None:
        if frame is here and event == "c_return" and argument is sys.setprofile:
            return  # sys.setprofile's own return, reported to this profiler where one was set before (guards')
        set_profile_back(previous)
        if callable(previous):  # the event removing this one, which a Python profiler set before would have had
            previous(frame, event, argument)
        if event == "call" and frame.f_back is here:
            started.append(frame)

    sys.setprofile(profile)
    try:
        output = function(**arguments)
    finally:
        set_profile_back(previous)
    if not started or not is_users(started[0].f_code.co_filename):
        return output, None
    return output, f"{started[0].f_code.co_filename}:{started[0].f_lineno}"


def refuse_value_reads(recorder: Recorder) -> None:
    """Refuse, one line per source line, every Python value or decision taken from a tensor that is not a
    constant: the spec would hold the branch or the number these random inputs gave, for every input."""
    if not recorder.value_reads:
        return
    problems = []
    for read in recorder.value_reads:
        shown, kind = VALUE_READS.get(read.name, (f"torch.{read.name}", "branch"))
        if kind == "branch" and read.integers:  # transformers' padding_mask.all() (masking_utils.py:369)
            what = (
                "decides with the values of an int64 input (a padding mask, ids), so the spec would keep the "
                "branch these inputs took, for every input"
            )
            fix = (
                "pass the mask as the float tensor the attention adds to its scores, which the code uses as "
                "given (transformers: attention_mask of shape [B, 1, 1, T], 0 where attended and -1e4 where "
                "padded), or compute the decision outside the traced code"
            )
        elif kind == "branch":
            what = (
                "decides with the value of a tensor computed from the inputs, parameters or random numbers, "
                "so the spec would keep the branch these random inputs took, for every input"
            )
            fix = (
                "write the choice with tensor ops, so that every input runs the same ops (F.relu(h) for "
                "`h if h > 0 else 0`, h.abs(), h.clamp(a, b)); a setting that is not data belongs in a Python "
                "attribute or --arg, a check or a log line outside the traced code"
            )
        else:
            what = (
                "takes a number out of a tensor computed from the inputs, parameters or random numbers, so the "
                "spec would keep the value these random inputs gave, for every input"
            )
            fix = (
                "keep it a tensor and compute with it (x * s, not x * s.item()); a setting that is not data "
                "belongs in a Python attribute or --arg, a check or a log line outside the traced code"
            )
        problems.append(Problem(read.where, read.module, shown, what, fix))
    raise Refusal("\n".join(report(problems))) from None


def visible_globals(function) -> dict[str, Any]:
    """What the function reads by name from its module's globals and its closure."""
    try:
        closure = inspect.getclosurevars(function)
    except (TypeError, ValueError):
        return {}
    return {
        key: value
        for scope in (closure.globals, closure.nonlocals)
        for key, value in scope.items()
        if check_identifier(key) is None
    }


def source_name(prefix: str, path: str, root: torch.nn.Module, taken: set[str] | None = None) -> str:
    """The spec's name of the parameter or buffer at ``path``, none of ``taken`` (then added to it): an argument
    of the traced function named as a buffer (BERT's ``position_ids`` argument and ``self.position_ids``) keeps
    its name, the buffer is ``bert_position_ids`` (its class's name first): one name for both read the buffer.
    Without ``taken`` (the tests' and benchmarks' naming of a model's own parameters) no name is taken yet."""
    taken = set() if taken is None else taken
    name = fitted(plain_name(".".join(part for part in (prefix, path) if part)))
    if name[:1].isdigit() or check_identifier(name) is not None or name in taken:
        name = fitted(f"{plain_name(type(root).__name__).lower()}_{name}")
    found, number = name, 2
    while found in taken:
        found, number = fitted(f"{name}_{number}"), number + 1
    taken.add(found)
    return found


def first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
