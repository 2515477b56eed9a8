"""From PyTorch code to a spec: ``symgrad trace model.py:Net --input x=8,3,32,32 --loss mse``.

The function, or an ``nn.Module``'s forward, runs on random tensors while ``recorder.Recorder``
keeps every torch call; ``layers.SpecBuilder`` turns the calls into layers, and the end of the
function (or ``--loss``) into the spec's loss; a function that returns no loss (a tensor, a tuple or a
dict of tensors: the model's outputs) gives a spec that ends in ``outputs:``, which ``trace_modes``
traces in train and in eval mode. Parameters and buffers become inputs named by their
module path (``layer1_0_conv1_weight``, ``bn1_running_mean``); tensors the function reads from its
module's globals or closure (the seed's ``k`` and ``y``), and the parameters of ``nn.Module``
globals (``model_conv1_weight``), become inputs under those names.

Sizes stay symbolic: the code runs a second time at other sizes (batch + 1 and oblong spatial sizes,
falling back to fewer changes where the model refuses), and an argument that differs between the
two runs, being computed from the input's size, is refused rather than frozen into the spec.
Everything that cannot be traced is reported at once, one line each, with the user's file:line
and module path.

Longer than most modules because it is the whole driver: loading a target from a file, the runs, the
refusals of value reads and timeouts, and the loss tail, each with its one-line error.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import yaml

from ..check import available_memory
from ..errors import SpecError, SymgradError, cut
from ..graph import build_graph
from ..spec import check_identifier, parse_spec
from .constants import at_full_precision
from .layers import Problem, Reduction, Source, SpecBuilder, fitted, plain_name, report
from .recorder import VALUE_READS, Recorder, _is_users, user_line, user_line_of_traceback
from .sizes import einops_uncached


class TraceError(SymgradError):
    """The traced code does something symgrad cannot turn into a spec."""


class Refusal(TraceError):
    """A refusal that no other input size can mend (a value read, the timeout): raised through the second run."""


LOSS_NAMES = {"mse": "mse_loss", "half_sq_error": "half_sq_error", "l1": "l1_loss", "smooth_l1": "smooth_l1_loss",
              "huber": "huber_loss", "cross_entropy": "cross_entropy", "nll": "nll_loss"}
"""``--loss`` values: short names and the spec's loss ops."""


@dataclass(frozen=True)
class LossChoice:
    """A loss put after a model whose forward returns its prediction (``--loss mse --target y``)."""

    op: str
    target: str = "target"
    reduction: str | None = None

    @property
    def classes(self) -> bool:
        return self.op in ("cross_entropy", "nll_loss")


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
        with _time_limit(timeout):
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
    """A model whose forward returns its outputs, traced in train mode and in eval mode: (the train-mode
    spec, the eval-mode spec named ``NAME_eval``), or (the one spec, None) where the two modes run the same
    layers (no BatchNorm, no dropout, the same outputs). The train-mode spec then names the other in
    ``eval: NAME_eval``, and ``symgrad.bind`` of the module generated from it runs the module generated
    from the other while the model is in eval mode (both generated into one folder). ``options``: those
    of :func:`trace` but ``mode`` and ``loss`` (a loss-ending spec trains in one mode)."""
    train = trace(target, shapes, wrt, name, mode="train", **options)
    evaluation = trace(target, shapes, wrt, f"{name}_eval", mode="eval", **options)
    if "\noutputs:" not in train or _body(train) == _body(evaluation):
        return train, None
    return train + f"eval: {name}_eval\n", evaluation


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
    other = next(_other_sizes(shapes), shapes)
    needed = sum(math.prod(shape) * 8 for sizes in (shapes, other) for shape in sizes.values())  # float64 at most
    free = available_memory()
    if needed > free:
        raise TraceError(f"error: the inputs {_shapes_text(shapes)} alone need about {needed / 2**30:.1f} GiB "
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
    spec, calls = _run(function, module, {key: tuple(shapes[key]) for key in tensor_names}, arguments, dtypes, loss)
    problems = _size_dependence(function, module, shapes, tensor_names, arguments, dtypes, loss, spec, calls)
    if problems:
        raise TraceError("\n".join(problems))
    at_full_precision(spec, module, function, lambda function, module: _run(
        function, module, {key: tuple(shapes[key]) for key in tensor_names}, arguments, dtypes, loss, quiet=True,
        dtype=torch.float64))
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
        text += _fingerprint_text(module, calls)
    return text


def _fingerprint_text(module: torch.nn.Module, calls: list) -> str:
    """The spec's ``fingerprint:`` section for ``module`` as traced (``symgrad.fingerprint``)."""
    from ..fingerprint import fingerprint_of

    counts: dict[str, int] = {}
    for call in calls:
        if call.name == "batch_norm":
            counts[call.module] = counts.get(call.module, 0) + 1
    entries = fingerprint_of(module, counts)

    def line(value) -> str:
        return yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False).strip()

    return "fingerprint:\n" + "".join(f"  {json.dumps(path)}: {line(entry)}\n" for path, entry in entries.items())


def _with_blocks(text: str, header: str, name: str, spec: dict, calls: list, module, graph) -> str:
    """The traced spec with the instances of each repeated submodule as one block."""
    from ..rules import LAYER_RULES, LOSS_RULES
    from ..plan_blocks import build_structured
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
            build_structured(grouped_spec)
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


def _yaml(document: dict) -> str:
    """Block style for the sections, one flow-style line per input and per layer."""
    def line(value) -> str:
        return yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False).strip()

    lines = [f"name: {document['name']}", "inputs:"]
    lines += [f"  {key}: {line(value)}" for key, value in document["inputs"].items()]
    if document.get("blocks"):
        lines.append("blocks:")
        for block_name, block in document["blocks"].items():
            lines += [f"  {block_name}:", f"    inputs: {line(block['inputs'])}", f"    params: {line(block['params'])}"]
            lines += [f"    hyper: {line(block['hyper'])}"] if block.get("hyper") else []
            lines += ["    layers:"] + [f"      - {line(layer)}" for layer in block["layers"]]
            lines.append(f"    output: {block['output']}")
    lines += ["layers:" + ("" if document["layers"] else " []")] + [f"  - {line(layer)}" for layer in document["layers"]]
    end = "outputs" if "outputs" in document else "loss"
    value = document[end]  # one output: its node's name, an identifier
    lines += [f"{end}: {value if isinstance(value, str) else line(value)}", f"wrt: {line(document['wrt'])}"]
    lines += [f"eval: {document['eval']}"] if document.get("eval") else []
    return "\n".join(lines) + "\n"


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
    saved = [(value, value.detach().clone()) for _, root in roots for value in root.buffers()]
    recorder = Recorder(module_paths)
    recorder.precision = dtype  # constants are recorded as a float64 run of the model makes them
    try:
        with torch.no_grad(), recorder, einops_uncached():
            output, returned_at = _call(function, {**tensors, **arguments})
    except TraceError:
        raise
    except Exception as error:  # the user's code failed at these shapes: say where, in one line
        _refuse_value_reads(recorder)  # ... unless it took a branch from a tensor's value first
        if quiet:
            raise
        raise TraceError(f"{user_line_of_traceback(error.__traceback__)}: error: running it at "
                         f"{_shapes_text(shapes)} failed: {_first_line(error)} (fix: check the --input shapes and --arg values)") from None
    finally:
        for value, copy in saved:  # tracing must not move the model's running statistics
            value.copy_(copy)
    _refuse_value_reads(recorder)
    modules = {path: child for path, child in module.named_modules()} if module is not None else {}
    builder = SpecBuilder(sources, mutable, modules=modules, size_tensors=recorder.size_tensors)
    for call in recorder.calls:
        builder.add(call)
    outputs = _outputs(builder, output, returned_at) if loss is None and _ends_in_outputs(builder, output) else None
    loss_entry = _loss(builder, output, loss, shapes, returned_at) if outputs is None else {"in": None, "target": None}
    layers, used = _live(builder, loss_entry, outputs)
    inputs: dict[str, dict] = {}
    state_keys = {source.name: source.state_key for source in sources.values() if source.state_key}
    for key in [*shapes, *builder.used_sources]:
        if key in used and key not in inputs:
            value = tensors.get(key, builder.used_sources.get(key))
            inputs[key] = {"shape": list(value.shape), **({"dtype": "int64"} if value.dtype == torch.int64 else {}),
                           **({"source": state_keys[key]} if key in state_keys else {})}
    if loss is not None:
        inputs[loss.target] = _target_input(builder, output, loss)
    trainable = {source.name for source in sources.values() if source.trainable}
    wrt = [key for key in inputs if key in trainable and key != loss_entry["target"]]
    layer_calls = [call for call, layer in zip(builder.layer_calls, builder.layers) if layer in layers]
    end = {"outputs": outputs} if outputs is not None else {"loss": loss_entry}
    return {"inputs": inputs, "layers": layers, **end, "wrt": wrt}, layer_calls


def _ends_in_outputs(builder: SpecBuilder, output: Any) -> bool:
    """Whether the traced code returns the model's outputs (a tensor that is no loss, a tuple or a dict
    of tensors), which a spec then ends in, rather than a loss."""
    if isinstance(output, (tuple, list, dict)):
        return True
    return isinstance(output, torch.Tensor) and id(output) not in builder.reductions


def _outputs(builder: SpecBuilder, output: Any, returned_at: str | None) -> str | list | dict:
    """The spec's ``outputs:`` for what the traced code returns: a node, a list or a mapping of them."""
    where = returned_at or (builder.layer_calls[-1].where if builder.layer_calls else "<traced code>")
    items = output.items() if isinstance(output, dict) else enumerate(output) if isinstance(output, (tuple, list)) \
        else [(None, output)]
    names, problems = {}, set()
    for key, value in items:
        shown = "the output" if key is None else f"output {key!r}"
        if not isinstance(value, torch.Tensor):
            raise TraceError(f"{where}: error: {shown} is {type(value).__name__}, not a tensor (fix: return "
                             "tensors, a tuple or a dict of tensors)")
        if isinstance(key, str) and check_identifier(key) is not None and not key.isidentifier():
            raise TraceError(f"{where}: error: output key {key!r} is not an identifier (fix: name the outputs "
                             "with letters, digits and '_')")
        node = builder.node(value)
        if isinstance(node, frozenset):
            problems |= node
            continue
        if node not in {layer["out"] for layer in builder.layers}:
            raise TraceError(f"{where}: error: {shown} is the input or parameter '{node}' itself, which no layer "
                             "computes (fix: return what the model computes from its inputs)")
        names[key] = node
    if problems:
        found = [builder.problems[index] for index in sorted(problems) if index >= 0]
        raise TraceError("\n".join(report(found)) if found else f"{where}: error: an output is a tensor that no "
                         "traced call made and that is no input (fix: return what the model computes from its inputs)")
    if isinstance(output, dict):
        return dict(names)
    if isinstance(output, (tuple, list)):
        return list(names.values())
    return names[None]


def _loss(builder: SpecBuilder, output: Any, loss: LossChoice | None, shapes, returned_at: str | None = None) -> dict:
    """The spec's loss entry, or a TraceError listing every problem the loss depends on; ``returned_at``:
    the ``file:line`` of the traced function's ``return``."""
    where = getattr(builder.layer_calls[-1], "where", "<traced code>") if builder.layer_calls else "<traced code>"
    if isinstance(output, (tuple, list)):
        raise TraceError(f"{returned_at or where}: error: the traced code returns {len(output)} values, not one loss "
                         "(fix: return only the loss, or only the prediction and pass --loss)")
    if not isinstance(output, torch.Tensor):
        raise TraceError(f"{returned_at or where}: error: the traced code returns {type(output).__name__}, not a tensor "
                         "(fix: return the loss, or the prediction and pass --loss)")
    reasons = builder.poison.get(id(output))
    if reasons:
        raise TraceError("\n".join(report([builder.problems[index] for index in sorted(reasons) if index >= 0])))
    reduction = builder.reductions.get(id(output))
    if loss is not None:
        if reduction is not None:
            raise TraceError(f"{reduction.call.where}: error: the traced code already ends in a loss "
                             "(fix: drop --loss, or return the prediction)")
        prediction = builder.node(output)
        if isinstance(prediction, frozenset):  # a tensor of the model's own, not computed from the inputs
            raise TraceError(f"{returned_at or where}: error: the traced code returns a tensor that no traced call "
                             "made and that is no input (fix: return the prediction computed from the inputs)")
        entry = {"op": loss.op, "in": prediction, "target": loss.target}
        if loss.reduction:
            entry["reduction"] = loss.reduction
        return entry
    if reduction is None:
        shape = list(output.shape)
        raise TraceError(f"{where}: error: the traced code returns a tensor of shape {shape}, not a loss "
                         "(fix: pass --loss mse --target y, or end the code in a loss such as F.mse_loss(p, y))")
    return _reduction_loss(builder, reduction, list(shapes))


def _reduction_loss(builder: SpecBuilder, reduction: Reduction, arguments: list[str]) -> dict:
    """The loss a reduction spells; ``arguments`` (the traced arguments in order) decides which side of
    ``p - y`` is the prediction when both are arguments: the one the function takes first."""
    call = reduction.call
    how = reduction.how
    forms = ("F.mse_loss(p, y), F.l1_loss(p, y), F.cross_entropy(p, labels), 0.5 * (p - y).pow(2).sum() "
             "or .sum(dim=[1, 2, 3]) per sample")

    def refuse(what: str) -> TraceError:
        return TraceError(f"{call.where}: error: {what} (fix: end in one of {forms})")

    if how == "none":
        raise refuse("the traced code returns elementwise loss values, not a loss")
    if reduction.loss is not None:
        entry = dict(reduction.loss)
        if reduction.scale == 0.5 and entry["op"] == "mse_loss":
            entry["op"] = "half_sq_error"
        elif reduction.scale != 1:
            raise refuse(f"the loss is scaled by {reduction.scale}, which no spec loss is")
        entry["reduction"] = how
        return entry
    producers = {layer["out"]: layer for layer in builder.layers}
    inner = producers.get(reduction.source)
    if inner is None:
        raise refuse(f"the code reduces '{reduction.source}' directly, with no target to compare it with")
    if inner["op"] == "pow" and inner.get("exponent", 2) == 2:
        kind = {0.5: "half_sq_error", 1: "mse_loss"}.get(reduction.scale)
    elif inner["op"] == "abs":
        kind = {1: "l1_loss"}.get(reduction.scale)
    else:
        raise refuse(f"the code reduces the result of '{inner['op']}', which is no loss symgrad knows")
    difference = producers.get(inner["in"]) if isinstance(inner["in"], str) else None
    if kind is None or difference is None or difference["op"] != "sub" or not isinstance(difference["in"], list):
        raise refuse(f"the reduced {inner['op']} is not of a difference prediction - target scaled to a known loss "
                     f"(scale {reduction.scale})")
    for layer in (inner, difference):
        readers = [other for other in builder.layers if layer["out"] in _reads(other)]
        if readers == ([inner] if layer is difference else []):
            builder.layers.remove(layer)
    left, right = difference["in"]
    computed = [left in producers, right in producers]
    if computed == [False, True] or (computed == [False, False] and left in arguments and right in arguments
                                     and arguments.index(right) < arguments.index(left)):
        left, right = right, left  # y - p: the prediction is the computed one, or the first argument
    return {"op": kind, "in": left, "target": right, "reduction": how}


def _reads(layer: dict) -> list[str]:
    names = []
    for key, value in layer.items():
        if key in ("op", "out"):
            continue
        items = value if isinstance(value, list) else [value]  # size: {like: skip}, skip's sizes read at run time
        items = [item.get("like") if isinstance(item, dict) else item for item in items]
        names += [item for item in items if isinstance(item, str)]
    return names


def _live(builder: SpecBuilder, loss: dict, outputs=None) -> tuple[list[dict], set[str]]:
    """The layers the loss (or the outputs) depend on, and every name they and the loss read."""
    needed = {loss["in"], loss["target"]} - {None}
    if outputs is not None:
        needed |= set(outputs.values() if isinstance(outputs, dict) else [outputs] if isinstance(outputs, str)
                      else outputs)
    kept = []
    for layer in reversed(builder.layers):
        if layer["out"] in needed:
            kept.append(layer)
            needed.update(_reads(layer))
    return kept[::-1], needed


def _target_input(builder: SpecBuilder, output: torch.Tensor, loss: LossChoice) -> dict:
    if check_identifier(loss.target) is not None or loss.target in builder.used_sources:
        raise TraceError(f"error: --target {loss.target!r} is not a free identifier (fix: choose another name, e.g. y)")
    if loss.classes:
        if output.dim() < 2:
            raise TraceError(f"error: {loss.op} needs a prediction [N, C, ...], and the model returns "
                             f"{list(output.shape)} (fix: choose another --loss)")
        return {"shape": [output.shape[0], *output.shape[2:]], "dtype": "int64"}
    return {"shape": list(output.shape)}


def _size_dependence(function, module, shapes, tensor_names, arguments, dtypes, loss, spec, calls) -> list[str]:
    """Run again at other sizes; every layer argument that changed was computed from a size."""
    for changed in _other_sizes({key: tuple(shapes[key]) for key in tensor_names}):
        try:
            other, _ = _run(function, module, changed, arguments, dtypes, loss, quiet=True)
        except Refusal:  # a value read or the timeout: no other size helps
            raise
        except Exception:  # the model does not run at these sizes: try fewer changes
            continue
        described = _shapes_text(changed)
        problems = []
        ops, other_ops = [layer["op"] for layer in spec["layers"]], [layer["op"] for layer in other["layers"]]
        if ops != other_ops:
            first = next((index for index, pair in enumerate(zip(ops, other_ops)) if pair[0] != pair[1]),
                         min(len(ops), len(other_ops)))
            where = calls[min(first, len(calls) - 1)].where if calls else "<traced code>"
            return [f"{where}: error: the code runs different ops from here on at {described} than at the given "
                    "shapes, so no single spec describes it (fix: trace a model whose ops do not depend on the "
                    "input's size)"]
        for layer, again, call in zip(spec["layers"], other["layers"], calls):
            for key, value in layer.items():
                if key in ("in", "out", "op") or again.get(key) == value:
                    continue
                fixed = _fixed_sizes(value, again.get(key), call) if key in ("shape", "size") else None
                if fixed is not None:  # a size that only happened to equal one the code read: the number
                    layer[key] = fixed
                    continue
                problems.append(Problem(call.where, call.module, layer["op"], f"argument {key}={_shown(value)} becomes "
                                        f"{_shown(again.get(key))} at {described}: it is computed from the input's size, "
                                        "which a spec cannot express",
                                        "use sizes that do not depend on the input (a fixed pad, scale_factor "
                                        "instead of size, flatten instead of view(N, ...)), or read them from the "
                                        "tensor to match: F.interpolate(h, size=skip.shape[-2:]), U-Net's "
                                        "F.pad(h, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2]) with dx, dy "
                                        "from skip.size() and h.size()"))
        problems = report(problems)  # one line per source line, however many modules share it
        if other.get("loss") != spec.get("loss") or other.get("outputs") != spec.get("outputs"):
            problems.append(f"{calls[-1].where if calls else '<traced code>'}: error: the loss changes at {described} "
                            "(fix: reduce over every dim but the first, or over all)")
        return problems
    return []


def _fixed_sizes(value: Any, again: Any, call) -> list | None:
    """A list of sizes where each entry that differs between the runs was read from a tensor at the given
    shapes (``{like: x}``) but is the same number at the other shapes, the size this call's result has at
    the given shapes too (Swin's ``view(N, N, -1)`` of its bias table, N happening to equal the tokens per
    window the code read): those entries as that number; None when any other entry differs."""
    traced = getattr(call.result, "shape", None)
    if not (isinstance(value, list) and isinstance(again, list) and len(value) == len(again) and traced is not None
            and len(traced) == len(value)):
        return None
    fixed = []
    for position, (first, second) in enumerate(zip(value, again)):
        if first == second:
            fixed.append(first)
        elif isinstance(first, dict) and isinstance(second, int) and second == traced[position]:
            fixed.append(second)
        else:
            return None
    return fixed


def _shown(value: Any) -> str:
    """An argument as the spec writes it: ``{like: x}``, ``[0, 1]``."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {item}" for key, item in value.items()) + "}"
    return cut(repr(value), 120)  # a constant's values: the start says enough


def _other_sizes(shapes: dict[str, tuple[int, ...]]):
    """Other input sizes to run at: batch + 1 and the spatial sizes grown unequally (x2, x3, x2, ...: a
    square input becomes oblong, so a size read from the height is never mistaken for the width's), then
    the spatial sizes doubled with the batch, then each change alone (for models that need square or
    power-of-two inputs)."""
    batch = {key: (shape[0] + 1, *shape[1:]) if shape else shape for key, shape in shapes.items()}
    spatial = {key: (*shape[:2], *(2 * size for size in shape[2:])) for key, shape in shapes.items()}
    oblong = {key: (*shape[:2], *((2 + axis % 2) * size for axis, size in enumerate(shape[2:])))
              for key, shape in shapes.items()}
    tried = []
    for candidate in ({key: (batch[key][:1] + oblong[key][1:]) if shape else shape for key, shape in shapes.items()},
                      {key: (batch[key][:1] + spatial[key][1:]) if shape else shape for key, shape in shapes.items()},
                      batch, spatial):
        if candidate != shapes and candidate not in tried:
            tried.append(candidate)
            yield candidate


def _call(function, arguments: dict[str, Any]) -> tuple[Any, str | None]:
    """``function(**arguments)``, and the ``file:line`` of the ``return`` that ended it, when the function is
    the user's own code: its frame, caught as it starts (the profiler then removes itself, so it costs nothing
    while the code runs), keeps the line it returned from."""
    here = sys._getframe()
    started: list = []
    previous = sys.getprofile()

    def profile(frame, event, argument) -> None:
        sys.setprofile(previous)
        if event == "call" and frame.f_back is here:
            started.append(frame)

    sys.setprofile(profile)
    try:
        output = function(**arguments)
    finally:
        sys.setprofile(previous)
    if not started or not _is_users(started[0].f_code.co_filename):
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
        if kind == "branch":
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


def _shapes_text(shapes) -> str:
    return ", ".join(f"{key}={list(shape)}" for key, shape in shapes.items())


def _arguments_text(init) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in (init or {}).items())


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


__all__ = ["LOSS_NAMES", "LossChoice", "TraceError", "load_target", "trace"]
