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

This file is the driver: loading a target from a file, the runs, the timeouts, and the spec's text.
One run at given sizes (the recorded calls built into layers, value reads refused) is ``run_once.py``;
how the code ends (a loss or the outputs) is read in ``losses.py``; the second run at other sizes is
``rerun.py``.
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
from ..guards import CallRecorder, guards_text
from ..spec import parse_spec
from .constants import at_full_precision
from .custom_functions import merge_checks
from .dataflow import plain_name
from .errors import Refusal, TraceError
from .frames import user_line, user_line_of_traceback
from .losses import LOSS_NAMES, LossChoice
from .rerun import dim_one_pins, other_sizes, shapes_text, size_dependence
from .run_once import defined_at, first_line, run_once, visible_globals
from .size_checks import drop_fixed, pin_dim_one
from .static_sizes import guard_sizes, refused_elsewhere, second_runs, shapes_words, static_branches, with_static_fix


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
        raise TraceError(
            f"{user_line_of_traceback(error.__traceback__)}: error: importing {file} failed: "
            f"{first_line(error)} (fix: make the file importable on its own)"
        ) from None
    target = getattr(module, attribute, None)
    if target is None:
        raise TraceError(f"error: {file} has no '{attribute}' (fix: name a function or nn.Module class in it)")
    if inspect.isclass(target) and issubclass(target, torch.nn.Module):
        try:
            target = target(**(init or {}))
        except Exception as error:
            raise TraceError(
                f"{user_line_of_traceback(error.__traceback__)}: error: building {attribute}"
                f"({_arguments_text(init)}) failed: {first_line(error)} "
                "(fix: pass the constructor's arguments with --init 'name=value,...')"
            ) from None
    elif init:
        raise TraceError(f"error: --init is for an nn.Module class, and {attribute} is not one (fix: drop --init)")
    return target


def trace(
    target: Callable,
    shapes: dict[str, tuple[int, ...]],
    wrt: list[str] | str | None = None,
    name: str = "traced",
    *,
    loss: LossChoice | None = None,
    arguments: dict[str, Any] | None = None,
    dtypes: dict[str, str] | None = None,
    mode: str | None = None,
    timeout: float | None = None,
    blocks: bool = False,
    static_sizes: bool = False,
) -> str:
    """The spec (YAML text) for ``target`` called with random tensors of ``shapes`` (``dtypes``: ``int64``
    for class labels) and the Python values ``arguments``; ``mode`` ``train`` or ``eval`` sets the modules'
    mode while tracing (default: as they are); ``timeout``: seconds after which tracing stops with an error;
    ``blocks``: write the instances of a repeated submodule as one block (``symgrad.trace.grouping``);
    ``static_sizes``: trace at these sizes alone, each input's sizes guarded (``symgrad.trace.static_sizes``).
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
        raise TraceError(
            f"error: the arguments of {function!r} cannot be read (fix: trace a def or lambda that calls it)"
        ) from None
    parameters = [p for p in signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    arguments = dict(arguments or {})
    dtypes = dict(dtypes or {})
    missing = [p.name for p in parameters if p.name not in shapes and p.name not in arguments and p.default is p.empty]
    if missing:
        raise TraceError(
            f"error: no shape for argument(s) {', '.join(missing)} "
            f"(fix: pass --input {missing[0]}=8,3,32,32, or --arg {missing[0]}=VALUE for a number)"
        )
    unknown = [key for key in [*shapes, *arguments] if key not in {p.name for p in parameters}]
    if unknown:
        raise TraceError(
            f"error: {getattr(function, '__qualname__', 'the function')} takes no argument "
            f"'{unknown[0]}' (fix: name one of {', '.join(p.name for p in parameters) or 'none'})"
        )
    tensor_names = [p.name for p in parameters if p.name in shapes]
    _check_sizes({key: tuple(shapes[key]) for key in tensor_names}, dtypes)
    modules = [module] if module is not None else []
    modules += [value for value in visible_globals(function).values() if isinstance(value, torch.nn.Module)]
    modes = [(each, each.training) for root in modules for each in root.modules()]
    if mode is not None:
        for root in modules:
            root.train(mode == "train")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the runs are small: intra-op threads only spin, and on a busy machine 8x slower
    try:
        with _time_limit(timeout), torch.inference_mode(False):  # the caller's inference_mode: a training step's run
            return _traced_text(
                function, module, shapes, tensor_names, arguments, dtypes, loss, wrt, name, blocks, static_sizes
            )
    except SymgradError:
        raise
    except Exception as error:  # noqa: BLE001 - symgrad's own failure on a call it met: one line, never a traceback
        where = user_line_of_traceback(error.__traceback__)
        raise TraceError(
            f"{where + ': ' if where != '<traced code>' else ''}error: symgrad could not trace "
            f"{getattr(function, '__qualname__', 'the model')} ({type(error).__name__}: "
            f"{first_line(error)[:200]}) (fix: this is a bug in symgrad's tracer: please report it "
            "with the model; until then, trace the part of the model before this line)"
        ) from None
    finally:
        torch.set_num_threads(threads)
        for each, training in modes:
            each.training = training


def trace_modes(
    target: Callable,
    shapes: dict[str, tuple[int, ...]],
    wrt: list[str] | str | None = None,
    name: str = "traced",
    **options,
) -> tuple[str, str | None]:
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
    other = trace(
        target, shapes, wrt, name if not training else f"{name}_eval", mode="eval" if training else "train", **options
    )
    train, evaluation = (as_set, other) if training else (other, _renamed(as_set, f"{name}_eval"))
    if _body(train) == _body(evaluation):
        return train, None
    return train + f"eval: {name}_eval\n", evaluation


def _renamed(text: str, name: str) -> str:
    """A traced spec under another name (its one ``name:`` line)."""
    lines = text.splitlines(keepends=True)
    index = next(number for number, line in enumerate(lines) if line.startswith("name:"))
    return "".join([*lines[:index], f"name: {_name(name)}\n", *lines[index + 1 :]])


def _body(text: str) -> list[str]:
    """A traced spec's lines but its header and name."""
    return [line for line in text.splitlines() if not line.startswith(("#", "name:"))]


def _check_sizes(shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str]) -> None:
    """Refuse sizes below 1, and inputs that cannot fit in memory at the traced sizes and the second run's
    (both runs' tensors are alive at once), before anything is allocated."""
    for key, shape in shapes.items():
        if any(size < 1 for size in shape):
            raise TraceError(
                f"error: --input {key}={','.join(map(str, shape))} has a size below 1 "
                "(fix: give every dimension a size of at least 1, e.g. x=8,3,32,32)"
            )
    other = next(other_sizes(shapes), shapes)
    needed = sum(math.prod(shape) * 8 for sizes in (shapes, other) for shape in sizes.values())  # float64 at most
    free = available_memory()
    if needed > free:
        raise TraceError(
            f"error: the inputs {shapes_text(shapes)} alone need about {needed / 2**30:.1f} GiB "
            f"(with the second run's, at other sizes), and {free / 2**30:.1f} GiB is available "
            "(fix: trace at small --input sizes, e.g. x=2,3,32,32: the spec's sizes stay symbolic)"
        )


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
        raise TraceError(
            "error: a trace timeout needs the main thread of a POSIX process (fix: trace without timeout, "
            "or from the main thread)"
        )

    def stop(number, frame):
        where = user_line(frame)
        raise Refusal(
            f"{where + ': ' if where != '<traced code>' else ''}error: tracing ran past --timeout "
            f"{seconds:g} s (fix: trace at smaller --input sizes, which the spec keeps symbolic, or give a "
            "longer --timeout; a loop that never ends stops here)"
        )

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


def _traced_text(
    function, module, shapes, tensor_names, arguments, dtypes, loss, wrt, name, blocks=False, static_sizes=False
) -> str:
    autocast: dict[str, dict] = {}  # the code's own regions turning autocast off, its questions: where, device
    traced_shapes = {key: tuple(shapes[key]) for key in tensor_names}
    with CallRecorder() as called:  # the Python functions the forward runs, which symgrad.guards guards
        spec, calls = run_once(function, module, traced_shapes, arguments, dtypes, loss, autocast_guards=autocast)
    again: list[dict] = []  # the second run's specs: their Functions' checks, at other sizes, are the spec's too
    refused: list = []  # symgrad's refusals at the second run's sizes, where the model ran
    problems = (
        []
        if static_sizes
        else size_dependence(
            second_runs(
                lambda changed: _kept(again, run_once(function, module, changed, arguments, dtypes, loss, quiet=True)),
                refused,
            ),
            traced_shapes,
            spec,
            calls,
        )
        or refused_elsewhere(refused)
    )
    if problems:
        raise TraceError("\n".join(with_static_fix(problems)))
    dim_one: list[dict] = []  # the run at another dim 1 alone, where the model ran there
    pins = (
        {}
        if static_sizes
        else dim_one_pins(
            lambda changed: _kept(dim_one, run_once(function, module, changed, arguments, dtypes, loss, quiet=True)),
            traced_shapes,
            spec,
            calls,
        )
    )
    at_full_precision(
        spec,
        module,
        function,
        lambda function, module: run_once(
            function, module, traced_shapes, arguments, dtypes, loss, quiet=True, dtype=torch.float64
        ),
    )
    merge_checks(spec, again)
    if static_sizes:  # each branch on a size holds at the traced sizes, which the guards below keep
        again.append(static_branches(spec, dtypes, tensor_names))
    calls[:] = [calls[index] for index in drop_fixed(spec, again[-1] if again else None, *dim_one)]
    pin_dim_one(spec, calls, pins)
    guarded = (
        guard_sizes(spec, calls, traced_shapes, dtypes, f"traced at {shapes_words(traced_shapes)}")
        if static_sizes
        else None
    )
    if wrt == "parameters":
        spec["wrt"] = [key for key in spec["wrt"] if key not in tensor_names]
    elif wrt:
        for item in wrt:  # `--wrt params`: said against what --wrt takes, not at the traced spec's line
            if item not in spec["inputs"]:
                import difflib

                close = difflib.get_close_matches(item, ["parameters", *spec["inputs"]], n=1)
                raise TraceError(
                    f"error: --wrt names '{item}', which is not an input of the traced spec"
                    + (f"; did you mean '{close[0]}'?" if close else "")
                    + " (fix: name the function's "
                    "arguments or parameters by their spec names, or write --wrt parameters)"
                )
        spec["wrt"] = list(wrt)
    header = (
        f"# Traced by symgrad from {getattr(function, '__qualname__', 'a function')} at "
        + ", ".join(f"{key}={spec['inputs'][key]['shape']}" for key in tensor_names if key in spec["inputs"])
        + "; edit freely.\n"
    )
    text = header + _yaml({"name": name, **spec})
    try:  # arguments PyTorch took but a rule refuses: said at the model's line, not the spec's
        graph = build_graph(parse_spec(text, "<traced spec>"))
    except SpecError as error:
        raise TraceError(_at_call(error, text, calls)) from None
    if blocks and module is not None:
        text = _with_blocks(text, header, name, spec, calls, module, graph)
    if module is not None:  # what symgrad.bind compares the model with
        text += _fingerprint_text(module, calls) + guards_text(
            module, function, called, tensor_names, arguments, guarded, **autocast
        )
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
        raise TraceError(
            f"{defined_at(forward_hooks(module)[0][1])}error: {type(module).__name__} itself has a "
            "forward hook, which tracing its forward does not run (fix: remove it, or register it on a "
            "submodule, whose hooks the trace runs)"
        )
    hooks = [*modules._global_forward_pre_hooks.values(), *modules._global_forward_hooks.values()]
    if hooks:
        raise TraceError(
            f"{defined_at(hooks[0])}error: a global module forward hook is registered "
            "(register_module_forward_hook), which a bound step would not run (fix: remove it while "
            "tracing)"
        )


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
    from ..pipeline import check_plans
    from ..rules import LAYER_RULES, LOSS_RULES
    from .grouping import group_blocks

    shapes = {node.name: node.shape for node in graph.nodes.values()}
    for strict in (False, True):
        grouped, relaxed = group_blocks(
            spec,
            [call.module for call in calls],
            dict(module.named_modules()),
            shapes,
            set(LAYER_RULES) | set(LOSS_RULES),
            strict=strict,
        )
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
            check_plans(grouped_spec)
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
            lines += [
                f"  {block_name}:",
                f"    inputs: {line(block['inputs'])}",
                f"    params: {line(block['params'])}",
            ]
            lines += [f"    hyper: {line(block['hyper'])}"] if block.get("hyper") else []
            lines += [f"    optional: {line(block['optional'])}"] if block.get("optional") else []
            lines += ["    layers:"] + [f"      - {line(layer)}" for layer in block["layers"]]
            lines.append(f"    output: {_name(block['output'])}")
    lines += ["layers:" + ("" if document["layers"] else " []")] + [
        f"  - {line(layer)}" for layer in document["layers"]
    ]
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


def _arguments_text(init) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in (init or {}).items())


__all__ = ["LOSS_NAMES", "LossChoice", "TraceError", "load_target", "trace", "trace_modes"]

make_callable(__name__, trace)  # symgrad.trace(model, shapes) is trace(...) (symgrad/callable_module.py)
