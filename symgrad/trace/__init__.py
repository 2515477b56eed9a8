"""From PyTorch code to a spec: ``symgrad trace model.py:Net --input x=8,3,32,32 --loss mse``.

The function, or an ``nn.Module``'s forward, runs on random tensors while ``recorder.Recorder``
keeps every torch call; ``layers.SpecBuilder`` turns the calls into layers, and the end of the
function (or ``--loss``) into the spec's loss; a function that returns no loss (a tensor, a tuple or a
dict of tensors: the model's outputs) gives a spec that ends in ``outputs:``, which ``trace_modes``
traces as the user set its modes and in its other mode. Parameters and buffers become inputs named by their
module path (``layer1_0_conv1_weight``, ``bn1_running_mean``); tensors the function reads from its
module's globals or closure (the seed's ``k`` and ``y``), and the parameters of ``nn.Module``
globals (``model_conv1_weight``), become inputs under those names.

Sizes stay symbolic: the code runs a second time at other sizes (batch + 1 and oblong spatial sizes,
falling back to fewer changes where the model refuses), and an argument that differs between the
two runs, being computed from the input's size, is refused rather than frozen into the spec.
Everything that cannot be traced is reported at once, one line each, with the user's file:line
and module path.

This file is the driver: loading a target from a file, the runs, the refusals of value reads and
timeouts, and the spec's text. How the code ends (a loss or the outputs) is read in ``losses.py``; the
second run at other sizes is ``rerun.py``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import math
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch
import yaml

from ..callable_module import make_callable
from ..check import available_memory
from ..errors import SpecError, SymgradError
from ..graph import build_graph
from ..guards import CallRecorder, guards_text, set_profile_back
from ..spec import parse_spec
from ..spec_values import check_identifier
from .constants import at_full_precision
from .custom_functions import checked_functions, merge_checks
from .dataflow import Problem, Source, fitted, plain_name, report
from .errors import Refusal, TraceError
from .layers import SpecBuilder
from .losses import LOSS_NAMES, LossChoice, ends_in_outputs, live_layers, loss_of, outputs_of, target_input
from .recorder import VALUE_READS, Recorder, is_users, user_line, user_line_of_traceback
from .rerun import other_sizes, shapes_text, size_dependence
from .size_checks import drop_fixed
from .sizes import einops_uncached
from .unused_statistics import refuse_unused_statistics


def load_target(reference: str, init: dict[str, Any] | None = None) -> Callable:
    """``path/to/file.py:function`` or ``:Class`` (an nn.Module, built with ``init`` as keyword arguments).

    The file's folder goes on ``sys.path`` first, so a model imported from a file beside it is found."""
    if ":" not in reference:
        raise TraceError(f"error: '{reference}' is not FILE.py:NAME (fix: write e.g. model.py:Net or model.py:loss)")
    file, attribute = reference.rsplit(":", 1)
    path = Path(file)
    if not path.is_file():
        raise TraceError(f"error: no file {file} (fix: check the path)")
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(f"_symgrad_traced_{plain_name(path.stem)}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # the user's file fails on import: one line, where
        raise TraceError(f"{user_line_of_traceback(error.__traceback__)}: error: importing {file} failed: "
                         f"{_first_line(error)} (fix: make the file importable on its own)") from None
    target = getattr(module, attribute, None)
    if target is None:
        raise TraceError(f"error: {file} has no '{attribute}' (fix: name a function or nn.Module class in it)")
    if inspect.isclass(target) and issubclass(target, torch.nn.Module):
        try:
            target = target(**(init or {}))
        except Exception as error:
            raise TraceError(f"{user_line_of_traceback(error.__traceback__)}: error: building {attribute}"
                             f"({_arguments_text(init)}) failed: {_first_line(error)} "
                             "(fix: pass the constructor's arguments with --init 'name=value,...')") from None
    elif init:
        raise TraceError(f"error: --init is for an nn.Module class, and {attribute} is not one (fix: drop --init)")
    return target


def trace(target: Callable, shapes: dict[str, tuple[int, ...]], wrt: list[str] | str | None = None, name: str = "traced",
          *, loss: LossChoice | None = None, arguments: dict[str, Any] | None = None,
          dtypes: dict[str, str] | None = None, mode: str | None = None, timeout: float | None = None,
          blocks: bool = False) -> str:
    """The spec (YAML text) for ``target`` called with random tensors of ``shapes`` (``dtypes``: ``int64``
    for class labels) and the Python values ``arguments``; ``mode`` ``train`` or ``eval`` sets the modules'
    mode while tracing (default: as they are); ``timeout``: seconds after which tracing stops with an error;
    ``blocks``: write the instances of a repeated submodule as one block (``symgrad.trace.grouping``).
    ``wrt``: the tensors to differentiate by (default: the arguments and trainable parameters), or
    ``"parameters"``: those parameters alone, as a training step (``symgrad.bind``) needs them: no
    gradient of the input is then computed (a ResNet-18's stem convolution's input gradient is 9% of
    its training step on a CPU)."""
    module = target if isinstance(target, torch.nn.Module) else None
    _refuse_untraced_hooks(module)
    function = module.forward if module is not None else target
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        raise TraceError(f"error: the arguments of {function!r} cannot be read (fix: trace a def or lambda that calls it)") from None
    parameters = [p for p in signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    arguments = dict(arguments or {})
    dtypes = dict(dtypes or {})
    missing = [p.name for p in parameters if p.name not in shapes and p.name not in arguments and p.default is p.empty]
    if missing:
        raise TraceError(f"error: no shape for argument(s) {', '.join(missing)} "
                         f"(fix: pass --input {missing[0]}=8,3,32,32, or --arg {missing[0]}=VALUE for a number)")
    unknown = [key for key in [*shapes, *arguments] if key not in {p.name for p in parameters}]
    if unknown:
        raise TraceError(f"error: {getattr(function, '__qualname__', 'the function')} takes no argument "
                         f"'{unknown[0]}' (fix: name one of {', '.join(p.name for p in parameters) or 'none'})")
    tensor_names = [p.name for p in parameters if p.name in shapes]
    _check_sizes({key: tuple(shapes[key]) for key in tensor_names}, dtypes)
    modules = [module] if module is not None else []
    modules += [value for value in _visible_globals(function).values() if isinstance(value, torch.nn.Module)]
    modes = [(each, each.training) for root in modules for each in root.modules()]
    if mode is not None:
        for root in modules:
            root.train(mode == "train")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the runs are small: intra-op threads only spin, and on a busy machine 8x slower
    try:
        with _time_limit(timeout), torch.inference_mode(False):  # the caller's inference_mode: a training step's run
            return _traced_text(function, module, shapes, tensor_names, arguments, dtypes, loss, wrt, name, blocks)
    except SymgradError:
        raise
    except Exception as error:  # noqa: BLE001 - symgrad's own failure on a call it met: one line, never a traceback
        where = user_line_of_traceback(error.__traceback__)
        raise TraceError(f"{where + ': ' if where != '<traced code>' else ''}error: symgrad could not trace "
                         f"{getattr(function, '__qualname__', 'the model')} ({type(error).__name__}: "
                         f"{_first_line(error)[:200]}) (fix: this is a bug in symgrad's tracer: please report it "
                         "with the model; until then, trace the part of the model before this line)") from None
    finally:
        torch.set_num_threads(threads)
        for each, training in modes:
            each.training = training


def trace_modes(target: Callable, shapes: dict[str, tuple[int, ...]], wrt: list[str] | str | None = None,
                name: str = "traced", **options) -> tuple[str, str | None]:
    """A model traced as the user set it, and in its other mode where it returns its outputs: (the
    train-mode spec, the eval-mode spec named ``NAME_eval``), or (the one spec, None) where the model
    ends in a loss (a loss-ending spec trains in one mode) or both run the same layers.

    The modes as set are never changed: the spec of the mode the model's root is in is the model as it
    is, each submodule in its own mode (``model.train(); model.backbone.eval()``: a frozen backbone's
    BatchNorm normalises with its running statistics and moves nothing, its dropout draws nothing); the
    other spec is the whole model in the other mode (``model.eval()``, or ``model.train()`` where the root
    was in eval mode when traced). The train-mode spec then names the other in ``eval: NAME_eval``, and
    ``symgrad.bind`` of the module generated from it runs, at each call, the module whose traced modes
    the model's submodules are in (both generated into one folder). ``options``: those of :func:`trace`
    but ``mode`` and ``loss``."""
    training = not isinstance(target, torch.nn.Module) or target.training
    as_set = trace(target, shapes, wrt, name, **options)
    if "\noutputs:" not in as_set:
        return as_set, None
    other = trace(target, shapes, wrt, name if not training else f"{name}_eval",
                  mode="eval" if training else "train", **options)
    train, evaluation = (as_set, other) if training else (other, _renamed(as_set, f"{name}_eval"))
    if _body(train) == _body(evaluation):
        return train, None
    return train + f"eval: {name}_eval\n", evaluation


def _renamed(text: str, name: str) -> str:
    """A traced spec under another name (its one ``name:`` line)."""
    lines = text.splitlines(keepends=True)
    index = next(number for number, line in enumerate(lines) if line.startswith("name:"))
    return "".join([*lines[:index], f"name: {_name(name)}\n", *lines[index + 1:]])


def _body(text: str) -> list[str]:
    """A traced spec's lines but its header and name."""
    return [line for line in text.splitlines() if not line.startswith(("#", "name:"))]


def _check_sizes(shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str]) -> None:
    """Refuse sizes below 1, and inputs that cannot fit in memory at the traced sizes and the second run's
    (both runs' tensors are alive at once), before anything is allocated."""
    for key, shape in shapes.items():
        if any(size < 1 for size in shape):
            raise TraceError(f"error: --input {key}={','.join(map(str, shape))} has a size below 1 "
                             "(fix: give every dimension a size of at least 1, e.g. x=8,3,32,32)")
    other = next(other_sizes(shapes), shapes)
    needed = sum(math.prod(shape) * 8 for sizes in (shapes, other) for shape in sizes.values())  # float64 at most
    free = available_memory()
    if needed > free:
        raise TraceError(f"error: the inputs {shapes_text(shapes)} alone need about {needed / 2**30:.1f} GiB "
                         f"(with the second run's, at other sizes), and {free / 2**30:.1f} GiB is available "
                         "(fix: trace at small --input sizes, e.g. x=2,3,32,32: the spec's sizes stay symbolic)")


@contextlib.contextmanager
def _time_limit(seconds: float | None):
    """Stop the trace with a Refusal after ``seconds`` (SIGALRM: the main thread only); the previous
    handler and timer are put back."""
    if seconds is None or seconds >= 2**31:  # no limit; setitimer cannot go that far
        yield
        return
    if not seconds > 0:
        raise TraceError(f"error: the timeout is {seconds!r} s (fix: give a positive number of seconds)")
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        raise TraceError("error: a trace timeout needs the main thread of a POSIX process (fix: trace without timeout, "
                         "or from the main thread)")

    def stop(number, frame):
        where = user_line(frame)
        raise Refusal(f"{where + ': ' if where != '<traced code>' else ''}error: tracing ran past --timeout "
                      f"{seconds:g} s (fix: trace at smaller --input sizes, which the spec keeps symbolic, or give a "
                      "longer --timeout; a loop that never ends stops here)")

    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, stop)
    earlier, interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if earlier:  # someone else's timer was running: let it go off when it would have
            signal.setitimer(signal.ITIMER_REAL, max(earlier - (time.monotonic() - started), 1e-3), interval)


def _traced_text(function, module, shapes, tensor_names, arguments, dtypes, loss, wrt, name, blocks=False) -> str:
    with CallRecorder() as called:  # the Python functions the forward runs, which symgrad.guards guards
        spec, calls = _run(function, module, {key: tuple(shapes[key]) for key in tensor_names}, arguments, dtypes, loss)
    again: list[dict] = []  # the second run's specs: their Functions' checks, at other sizes, are the spec's too
    problems = size_dependence(lambda changed: _kept(again, _run(function, module, changed, arguments, dtypes, loss,
                                                                 quiet=True)),
                               {key: tuple(shapes[key]) for key in tensor_names}, spec, calls)
    if problems:
        raise TraceError("\n".join(problems))
    at_full_precision(spec, module, function, lambda function, module: _run(
        function, module, {key: tuple(shapes[key]) for key in tensor_names}, arguments, dtypes, loss, quiet=True,
        dtype=torch.float64))
    merge_checks(spec, again)
    calls[:] = [calls[index] for index in drop_fixed(spec, again[-1] if again else None)]
    if wrt == "parameters":
        spec["wrt"] = [key for key in spec["wrt"] if key not in tensor_names]
    elif wrt:
        for item in wrt:  # `--wrt params`: said against what --wrt takes, not at the traced spec's line
            if item not in spec["inputs"]:
                import difflib

                close = difflib.get_close_matches(item, ["parameters", *spec["inputs"]], n=1)
                raise TraceError(f"error: --wrt names '{item}', which is not an input of the traced spec"
                                 + (f"; did you mean '{close[0]}'?" if close else "") + " (fix: name the function's "
                                 "arguments or parameters by their spec names, or write --wrt parameters)")
        spec["wrt"] = list(wrt)
    header = (f"# Traced by symgrad from {getattr(function, '__qualname__', 'a function')} at "
              + ", ".join(f"{key}={spec['inputs'][key]['shape']}" for key in tensor_names if key in spec["inputs"])
              + "; edit freely.\n")
    text = header + _yaml({"name": name, **spec})
    try:  # arguments PyTorch took but a rule refuses: said at the model's line, not the spec's
        graph = build_graph(parse_spec(text, "<traced spec>"))
    except SpecError as error:
        raise TraceError(_at_call(error, text, calls)) from None
    if blocks and module is not None:
        text = _with_blocks(text, header, name, spec, calls, module, graph)
    if module is not None:  # what symgrad.bind compares the model with
        text += _fingerprint_text(module, calls) + guards_text(module, function, called, tensor_names, arguments)
    return text


def _kept(runs: list, run: tuple) -> tuple:
    runs.append(run[0])
    return run


def _refuse_untraced_hooks(module: torch.nn.Module | None) -> None:
    """Refuse the forward hooks a trace would not run: the model's own (the trace calls its ``forward``,
    where each submodule's run with it) and the global ones (a bound step calls no module)."""
    from torch.nn.modules import module as modules

    from ..fingerprint import forward_hooks

    if module is not None and forward_hooks(module):
        raise TraceError(f"{_defined_at(forward_hooks(module)[0][1])}error: {type(module).__name__} itself has a "
                         "forward hook, which tracing its forward does not run (fix: remove it, or register it on a "
                         "submodule, whose hooks the trace runs)")
    hooks = [*modules._global_forward_pre_hooks.values(), *modules._global_forward_hooks.values()]
    if hooks:
        raise TraceError(f"{_defined_at(hooks[0])}error: a global module forward hook is registered "
                         "(register_module_forward_hook), which a bound step would not run (fix: remove it while "
                         "tracing)")


def _defined_at(hook) -> str:
    """``FILE:LINE: `` where ``hook``'s function is defined, or "" where it has no code (a callable object)."""
    from ..fingerprint import hook_function
    from ..write import shown_path

    code = getattr(hook_function(hook), "__code__", None)
    return f"{shown_path(code.co_filename)}:{code.co_firstlineno}: " if code is not None else ""


def _fingerprint_text(module: torch.nn.Module, calls: list) -> str:
    """The spec's ``fingerprint:`` section for ``module`` as traced (``symgrad.fingerprint``)."""
    from ..fingerprint import fingerprint_of

    counts: dict[str, int] = {}
    for call in calls:
        if call.name == "batch_norm":
            counts[call.module] = counts.get(call.module, 0) + 1
    entries = fingerprint_of(module, counts)

    return "fingerprint:\n" + "".join(f"  {json.dumps(path)}: {_flow(entry)}\n" for path, entry in entries.items())


def _with_blocks(text: str, header: str, name: str, spec: dict, calls: list, module, graph) -> str:
    """The traced spec with the instances of each repeated submodule as one block."""
    from ..expand import expand
    from ..pipeline import planned_program
    from ..rules import LAYER_RULES, LOSS_RULES
    from .grouping import group_blocks

    shapes = {node.name: node.shape for node in graph.nodes.values()}
    for strict in (False, True):
        grouped, relaxed = group_blocks(spec, [call.module for call in calls], dict(module.named_modules()),
                                        shapes, set(LAYER_RULES) | set(LOSS_RULES), strict=strict)
        if "blocks" not in grouped:
            return text
        grouped_text = header + _yaml({"name": name, **grouped})
        try:  # a block the spec refuses is no block (its names are checked as they are made: never expected)
            grouped_spec = parse_spec(grouped_text, "<traced spec>")
        except SpecError:
            continue
        if not relaxed:
            return grouped_text
        try:  # one derivation for instances that differ in hypers or kernel sizes, where it serves them all
            planned_program(expand(grouped_spec), tests=False)
        except SpecError:
            continue
        return grouped_text
    return text


def _at_call(error: SpecError, text: str, calls: list) -> str:
    lines = text.splitlines()
    first_layer = next((number for number, line in enumerate(lines, 1) if line.startswith("layers:")), 0) + 1
    index = error.location.line - first_layer if error.location else -1
    if not 0 <= index < len(calls):
        return str(error)
    call = calls[index]
    inside = f" (in {call.module})" if call.module else ""
    modules = list(dict.fromkeys(other.module for other in calls if other.where == call.where and other.module))
    if len(modules) > 1:  # the check stops at the first instance; the others may fail alike
        shown = ", ".join(modules[:3]) + (", ..." if len(modules) > 3 else "")
        inside = f" (in {call.module}, the first of {len(modules)} modules running this line: {shown})"
    return f"{call.where}: error: {error.message}{inside}" + (f" (fix: {error.fix})" if error.fix else "")


_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
"""libyaml's emitter where PyYAML has it: the same text as the pure-Python one (34,055 values of every
zoo network's trace compared, none differed), 5-10x faster; a traced network writes thousands."""


def _flow(value) -> str:
    """``value`` as one flow-style YAML line."""
    return yaml.dump(value, Dumper=_DUMPER, default_flow_style=True, width=10_000, sort_keys=False).strip()


def _yaml(document: dict) -> str:
    """Block style for the sections, one flow-style line per input and per layer."""
    line = _flow
    lines = [f"name: {_name(document['name'])}", "inputs:"]
    lines += [f"  {key}: {line(value)}" for key, value in document["inputs"].items()]
    if document.get("blocks"):
        lines.append("blocks:")
        for block_name, block in document["blocks"].items():
            lines += [f"  {block_name}:", f"    inputs: {line(block['inputs'])}", f"    params: {line(block['params'])}"]
            lines += [f"    hyper: {line(block['hyper'])}"] if block.get("hyper") else []
            lines += ["    layers:"] + [f"      - {line(layer)}" for layer in block["layers"]]
            lines.append(f"    output: {_name(block['output'])}")
    lines += ["layers:" + ("" if document["layers"] else " []")] + [f"  - {line(layer)}" for layer in document["layers"]]
    end = "outputs" if "outputs" in document else "loss"
    value = document[end]  # one output: its node's name, an identifier
    lines += [f"{end}: {_name(value) if isinstance(value, str) else line(value)}", f"wrt: {line(document['wrt'])}"]
    lines += [f"eval: {document['eval']}"] if document.get("eval") else []
    if document.get("checked_functions"):
        lines.append("checked_functions:")
        lines += [f"  {key}: {line(value)}" for key, value in document["checked_functions"].items()]
    return "\n".join(lines) + "\n"


def _name(name: str) -> str:
    """``name`` as a YAML value: quoted where YAML would read it as another value (``off``, ``null``, ``1``)."""
    try:
        plain = yaml.safe_load(name) == name
    except yaml.YAMLError:  # not a name YAML takes bare (`[x`): the spec's reader then says what a name is
        plain = False
    return name if plain else json.dumps(name)


def _run(function, module, shapes, arguments, dtypes, loss: LossChoice | None, quiet: bool = False,
         dtype: torch.dtype | None = None):
    """Run once at ``shapes``: the spec dict (inputs, layers, loss, wrt) and the layers' calls; ``dtype``: the
    inputs' (default: the model's own precision)."""
    roots: list[tuple[str, torch.nn.Module]] = [("", module)] if module is not None else []
    named_tensors: dict[str, torch.Tensor] = {}
    for key, value in _visible_globals(function).items():
        if isinstance(value, torch.Tensor):
            named_tensors[key] = value
        elif isinstance(value, torch.nn.Module):
            roots.append((key, value))
    floating = [value.dtype for _, root in roots for value in root.parameters() if value.is_floating_point()]
    floating += [value.dtype for value in named_tensors.values() if value.is_floating_point()]
    dtype = dtype or (floating[0] if floating else torch.get_default_dtype())  # the model's own precision
    generator = torch.Generator().manual_seed(0)
    tensors = {key: (torch.zeros(shape, dtype=torch.int64) if dtypes.get(key) == "int64"
                     else torch.randn(shape, generator=generator, dtype=dtype)) for key, shape in shapes.items()}
    sources: dict[int, Source] = {id(value): Source(key, dtypes.get(key) != "int64") for key, value in tensors.items()}
    sources.update({id(value): Source(key, False) for key, value in named_tensors.items() if id(value) not in sources})
    module_paths: dict[int, str] = {}
    mutable: set[int] = set()
    for prefix, root in roots:
        for path, child in root.named_modules():
            module_paths.setdefault(id(child), ".".join(part for part in (prefix, path) if part))
        for path, value in root.named_parameters():
            sources.setdefault(id(value), Source(_source_name(prefix, path, root), value.requires_grad,
                                                 path if root is module else None))
        for path, value in root.named_buffers():
            sources.setdefault(id(value), Source(_source_name(prefix, path, root), False, path if root is module else None))
            mutable.add(id(value))
    saved = [(owner, key, value, value.detach().clone()) for _, root in roots for owner in root.modules()
             for key, value in owner._buffers.items() if value is not None]
    recorder = Recorder(module_paths)
    recorder.from_integers.update(id(value) for value in tensors.values() if value.dtype == torch.int64)
    recorder.precision = dtype  # constants are recorded as a float64 run of the model makes them
    try:  # as a training step runs it, whatever the caller's mode (each recorded call: no graph)
        with torch.enable_grad(), recorder, einops_uncached():
            output, returned_at = _call(function, {**tensors, **arguments})
    except TraceError:
        raise
    except Exception as error:  # the user's code failed at these shapes: say where, in one line
        _refuse_value_reads(recorder)  # ... unless it took a branch from a tensor's value first
        if quiet:
            raise
        raise TraceError(f"{user_line_of_traceback(error.__traceback__)}: error: running it at "
                         f"{shapes_text(shapes)} failed: {_first_line(error)} (fix: check the --input shapes and --arg values)") from None
    finally:  # tracing must not move the model's running statistics, nor put another tensor in a buffer's place
        replaced = [(owner, key) for owner, key, value, _ in saved if owner._buffers.get(key) is not value]
        for owner, key, value, copy in saved:
            owner._buffers[key] = value
            value.copy_(copy)
    _refuse_value_reads(recorder)
    if replaced:
        owner, key = replaced[0]
        buffer = ".".join(part for part in (module_paths.get(id(owner), ""), key) if part)
        raise TraceError(f"{_defined_at(type(owner).forward)}error: the forward puts a new tensor in the buffer "
                         f"{buffer} (self.{key} = ...), which the explicit training step does not do (fix: return what "
                         "the update reads as one more output and update the buffer in your training loop, or trace "
                         "the model without the update)")
    if recorder.no_grad_in_checkpoint:
        raise TraceError(f"{recorder.no_grad_in_checkpoint[0]}: error: turns gradients off inside a "
                         "torch.utils.checkpoint block, whose own no_grad() hides which values autograd "
                         "differentiates (fix: compute that value outside the checkpointed function)")
    modules = {path: child for path, child in module.named_modules()} if module is not None else {}
    builder = SpecBuilder(sources, mutable, modules=modules, size_tensors=recorder.size_tensors, quiet=quiet,
                          arguments={key: value for key, value in tensors.items() if value.is_floating_point()})
    for call in recorder.calls:
        builder.add(call)
    try:
        outputs = outputs_of(builder, output, returned_at) if loss is None and ends_in_outputs(builder, output) else None
        loss_entry = loss_of(builder, output, loss, shapes, returned_at) if outputs is None else {"in": None, "target": None}
    except TraceError as error:  # a custom Function refused at these sizes alone: no other size mends it
        raise builder.function_refusal(error) from None
    layers, used = live_layers(builder, loss_entry, outputs)
    refuse_unused_statistics(builder.layers, layers, builder.layer_calls, modules)
    inputs: dict[str, dict] = {}
    state_keys = {source.name: source.state_key for source in sources.values() if source.state_key}
    for key in [*shapes, *builder.used_sources]:
        if key in used and key not in inputs:
            value = tensors.get(key, builder.used_sources.get(key))
            inputs[key] = {"shape": list(value.shape), **({"dtype": "int64"} if value.dtype == torch.int64 else {}),
                           **({"source": state_keys[key]} if key in state_keys else {})}
    if loss is not None:
        inputs[loss.target] = target_input(builder, output, loss)
    trainable = {source.name for source in sources.values() if source.trainable}
    wrt = [key for key in inputs if key in trainable and key != loss_entry["target"]]
    layer_calls = [call for call, layer in zip(builder.layer_calls, builder.layers) if layer in layers]
    end = {"outputs": outputs} if outputs is not None else {"loss": loss_entry}
    checked = checked_functions(builder.checked_functions, layer_calls)
    return {"inputs": inputs, "layers": layers, **end, "wrt": wrt, **checked}, layer_calls


def _call(function, arguments: dict[str, Any]) -> tuple[Any, str | None]:
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


def _refuse_value_reads(recorder: Recorder) -> None:
    """Refuse, one line per source line, every Python value or decision taken from a tensor that is not a
    constant: the spec would hold the branch or the number these random inputs gave, for every input."""
    if not recorder.value_reads:
        return
    problems = []
    for read in recorder.value_reads:
        shown, kind = VALUE_READS.get(read.name, (f"torch.{read.name}", "branch"))
        if kind == "branch" and read.integers:  # transformers' padding_mask.all() (masking_utils.py:369)
            what = ("decides with the values of an int64 input (a padding mask, ids), so the spec would keep the "
                    "branch these inputs took, for every input")
            fix = ("pass the mask as the float tensor the attention adds to its scores, which the code uses as "
                   "given (transformers: attention_mask of shape [B, 1, 1, T], 0 where attended and -1e4 where "
                   "padded), or compute the decision outside the traced code")
        elif kind == "branch":
            what = ("decides with the value of a tensor computed from the inputs, parameters or random numbers, "
                    "so the spec would keep the branch these random inputs took, for every input")
            fix = ("write the choice with tensor ops, so that every input runs the same ops (F.relu(h) for "
                   "`h if h > 0 else 0`, h.abs(), h.clamp(a, b)); a setting that is not data belongs in a Python "
                   "attribute or --arg, a check or a log line outside the traced code")
        else:
            what = ("takes a number out of a tensor computed from the inputs, parameters or random numbers, so the "
                    "spec would keep the value these random inputs gave, for every input")
            fix = ("keep it a tensor and compute with it (x * s, not x * s.item()); a setting that is not data "
                   "belongs in a Python attribute or --arg, a check or a log line outside the traced code")
        problems.append(Problem(read.where, read.module, shown, what, fix))
    raise Refusal("\n".join(report(problems))) from None


def _visible_globals(function) -> dict[str, Any]:
    """What the function reads by name from its module's globals and its closure."""
    try:
        closure = inspect.getclosurevars(function)
    except (TypeError, ValueError):
        return {}
    return {key: value for scope in (closure.globals, closure.nonlocals) for key, value in scope.items()
            if check_identifier(key) is None}


def _source_name(prefix: str, path: str, root: torch.nn.Module) -> str:
    name = fitted(plain_name(".".join(part for part in (prefix, path) if part)))
    if name[:1].isdigit() or check_identifier(name) is not None:
        name = fitted(f"{plain_name(type(root).__name__).lower()}_{name}")
    return name


def _arguments_text(init) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in (init or {}).items())


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


__all__ = ["LOSS_NAMES", "LossChoice", "TraceError", "load_target", "trace", "trace_modes"]

make_callable(__name__, trace)  # symgrad.trace(model, shapes) is trace(...) (symgrad/callable_module.py)
