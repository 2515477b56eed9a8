"""Training a traced model with its explicit gradients: ``step = symgrad.bind(module, model)``.

A module generated from ``symgrad trace model.py:Net`` takes every parameter and buffer in one
``params`` mapping keyed by ``state_dict()`` names, reads each where it is used, at any size (a
wider model of the same structure binds too), and records in ``FINGERPRINT`` what the traced model
was (``symgrad.fingerprint``: per submodule its class, code, hyper-parameters, parameter shapes and
mode). ``bind`` checks it against the model, and the generated file against its header's hash, and
returns an ``nn.Module`` whose forward takes only the data arguments. Each step checks what can change after ``bind`` (modes, a
submodule swapped, a hyper-parameter set, a parameter unfrozen, an input that requires grad) and
runs the forward on meta tensors once per new set of sizes, so a call the model would refuse moves
no buffer (its checks of the generated module: :mod:`symgrad.generated_module`)::

    step = symgrad.bind(resnet_gradients, model)
    loss = step(x=images, target=labels)   # the traced loss, as a tensor
    loss.backward()                        # explicit backward: fills .grad of the model's parameters
    optimizer.step()

The loss is ``loss_with_explicit_backward`` of the generated module applied to the model's own
parameter tensors, so ``.backward()`` accumulates into their ``.grad`` as autograd does, frozen
parameters (``requires_grad=False``) are left alone, and ``DistributedDataParallel(step)`` all-reduces
the gradients as it does for the model. In training mode every BatchNorm's ``running_mean``,
``running_var`` and ``num_batches_tracked`` move exactly as the module's own forward moves them
(``momentum=None`` included: the cumulative average).
"""

from __future__ import annotations

import copy
import importlib
import inspect
import operator
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from types import ModuleType

import torch
import torch.utils.checkpoint

from .call_guards import first_changed, kept
from .fast_checks import BatchCounter, HookWatch, Snapshot, StateReader
from .fingerprint import IGNORED, literal
from .generated_module import (
    BindError,
    SizeChecks,
    check_fingerprint,
    check_generated,
    check_matches,
    generated_reference,
    load_generated,
    missing,
    name_of,
)
from .guards import MISSING, guardable, shown
from .modes import mode_refusal
from .retrace import retrace
from .value_guard import ValueGuard


class BindArgumentError(BindError, TypeError):
    """A bound step called with arguments it does not take (a TypeError too, as Python's own)."""


@dataclass(frozen=True)
class _Statistics:
    """One training-mode batch norm's buffers, its momentum (None: cumulative average), and how often
    the traced forward runs it."""

    module: torch.nn.Module
    mean: str
    var: str
    momentum: float | None
    calls: int = 1


class Guard:
    """What a bound form reads off its generated module and checks at each call (both forms: :class:`Bound`
    and :class:`symgrad.bound_model.BoundModel` per mode): the model as bound, every mode as traced,
    every tensor that requires grad given its gradient, devices, and sizes on meta tensors (nothing moves
    on a call the model refuses). Needs ``model`` and ``allow_edited``; ``_setup`` sets the rest."""

    _ENTRY = "loss_with_explicit_backward"  # the function of the generated module the form calls

    def _setup(self, generated: ModuleType) -> None:
        """Everything read off ``generated``, checked against the model (run again when unpickled)."""
        model = self.model
        check_generated(generated, self.allow_edited)
        self.generated = generated
        self.values = ValueGuard(getattr(generated, "GUARDS", None), model)
        self._static_sizes = (getattr(generated, "GUARDS", None) or {}).get("sizes") or {}
        """Each input's shape where the spec was traced with static sizes: any other is refused at each call."""
        """Module constants, functions called by name, class attributes read: checked at each call."""
        # kept.kept_as_layouts's stand-ins, made in the saving forwards: CPU and CUDA kernels only (_check_devices)
        self._keeps_layouts = any(
            "meta" in value.__code__.co_consts
            for name, value in vars(generated).items()
            if inspect.isfunction(value) and name.endswith(("_forward_saving", "_forward"))
        )
        arguments = list(inspect.signature(generated.forward).parameters) if hasattr(generated, "forward") else []
        if "params" not in arguments or not hasattr(generated, self._ENTRY):
            raise BindError(
                f"{name_of(generated)} was not generated from a traced model (it takes no `params`) "
                "(fix: symgrad trace FILE.py:Model ..., then symgrad generate the spec it writes)"
            )
        # shape-generic, keyed by state_dict key: the model's own, whatever they are
        state = {
            **dict(model.named_parameters(remove_duplicate=False)),
            **dict(model.named_buffers(remove_duplicate=False)),
        }
        sources = {
            key: (key, tuple(value.shape)) for key, value in state.items() if not key.endswith("num_batches_tracked")
        }  # bind counts; kept out of the saved tensors
        self.sources = sources
        # every model tensor comes in `params`: an argument named as a buffer (BERT's position_ids) is data
        self.data_arguments = tuple(name for name in arguments if name != "params")
        self._state = {name: _owner(model, key) for name, (key, _) in sources.items()}
        fingerprint = check_fingerprint(generated, model, self.allow_edited)
        check_matches(generated, model, sources)
        statistics = [
            (f"{module}.running_mean", f"{module}.running_var", momentum)
            for module, momentum in getattr(generated, "MOMENTA", {}).items()
        ]
        for key in (key for mean, var, _ in statistics for key in (mean, var) if key not in sources):
            raise missing(generated, model, key)
        calls: dict[str, int] = {}
        for mean, _, _ in statistics:  # a module the flat table lists once per call
            calls[mean] = calls.get(mean, 0) + 1
        found = {}
        for mean, var, momentum in statistics:
            module = _owner(model, sources[mean][0])[0]
            path = sources[mean][0].rpartition(".")[0]
            count = fingerprint[path][5] if fingerprint and path in fingerprint else calls[mean]
            found.setdefault(mean, _Statistics(module, mean, var, momentum, max(count, 1)))
        self._statistics = tuple(found.values())
        for statistics in self._statistics:
            momentum = statistics.module.momentum  # nn.InstanceNorm passes None on as 0.0: its statistics stay
            momentum = (
                0.0
                if momentum is None
                and statistics.momentum == 0.0
                and not isinstance(statistics.module, torch.nn.modules.batchnorm._BatchNorm)
                else momentum
            )
            if (momentum is None) != (statistics.momentum is None) or (
                statistics.momentum is not None and momentum != statistics.momentum
            ):
                raise BindError(
                    f"{name_of(generated)} was traced with momentum {statistics.momentum} for "
                    f"{sources[statistics.mean][0].rsplit('.', 1)[0]}, and the model has "
                    f"{statistics.module.momentum} (fix: trace the model again)"
                )
            if statistics.momentum is None and statistics.calls > 1:
                raise BindError(
                    f"{name_of(generated)}: {sources[statistics.mean][0].rsplit('.', 1)[0]} is a "
                    f"momentum=None BatchNorm the forward runs {statistics.calls} times, whose running "
                    "statistics a bound step cannot move as the module does (fix: give it a momentum, "
                    "e.g. 0.1, and trace again)"
                )
        self._traced_training = bool(self._statistics) or None
        if not self._statistics and any(key.endswith(".running_mean") for key, _ in sources.values()):
            self._traced_training = False
        modules = dict(model.named_modules(remove_duplicate=False))
        self._modes = tuple(
            (path, modules[path], entry[4])
            for path, entry in (fingerprint or {}).items()
            if entry[4] is not None and path in modules
        )
        gradient_fields = set(getattr(generated.Gradients, "_fields", ()))
        frozen = getattr(generated, "FROZEN", None)
        self._undifferentiated = tuple(  # parameters: buffers need no gradient
            (key, name)
            for name, (key, _) in sources.items()
            if key in set(frozen or ()) and self._state[name][1] in self._state[name][0]._parameters
        )
        self._constant_data = tuple(name for name in self.data_arguments if name not in gradient_fields)
        self._checked: set = set()
        self._children = tuple(
            (parent, name, child) for parent in modules.values() for name, child in parent._modules.items()
        )
        self._hypers = [
            (path, module, key, kept(value))
            for path, module in modules.items()
            for key, value in vars(module).items()
            if fingerprint and path in fingerprint and _hyper(key, value)
        ]
        # _check_mode's second rule: the BatchNorms (or the running statistics' owners) in the traced mode
        self._normed = tuple(statistics.module for statistics in self._statistics) or tuple(
            owner for owner, attribute in self._state.values() if attribute == "running_mean"
        )
        moded = tuple(self._modes)
        if not self._modes and self._traced_training is not None:
            moded += tuple(("", owner, self._traced_training) for owner in self._normed)
        self._moded = moded
        self._snapshot = Snapshot(self._children, self._hypers, moded)
        self._hook_watch = HookWatch(model)
        self._refuse_backward_hooks(self._hook_watch.hooks)
        self._reader = StateReader(self._state)
        self._counter = BatchCounter(self._statistics)
        self._cumulative = tuple(statistics for statistics in self._statistics if statistics.momentum is None)

    def _checked_arguments(self, data: dict) -> tuple[dict, dict, list]:
        """Every per-step check passed, the call's arguments with the model's tensors looked up now (``.to()``
        replaces buffers), those tensors alone by key, and each cumulative (``momentum=None``) BatchNorm's
        statistics before the step."""
        for name, value in data.items():
            if isinstance(value, torch.Tensor) and value.numel() == 0:
                raise ValueError(
                    f"{name} has shape {list(value.shape)}: an empty batch, which the generated "
                    "BatchNorm and convolution kernels cannot take (fix: skip empty batches)"
                )
        if self._static_sizes:
            self._check_static_sizes(data)
        self._check_model_and_mode()
        self._check_values()
        arguments, params = self._reader.read(data)  # params: each argument is named by its state_dict key
        if not all(map(operator.is_not, params.values(), repeat(None))):
            key = next(key for key, value in params.items() if value is None)
            raise BindError(
                f"{name_of(self.generated)}: {key} is None since bind, and the generated code reads it "
                f"(fix: give the model its tensor back, or trace and generate the changed model: "
                f"{retrace(self.generated, self.model)})"
            )
        self._check_requires_grad(data, arguments)
        self._check_devices(data, arguments)
        if not torch.compiler.is_compiling():  # meta tensors under a dispatch mode, which dynamo cannot trace
            self._check_sizes(data, arguments)  # a call the model refuses moves nothing
        previous = []
        for statistics in self._cumulative:  # momentum=None: the module passes 1 / num_batches_tracked
            counter = getattr(statistics.module, "num_batches_tracked", None)
            previous.append(
                (
                    statistics,
                    arguments[statistics.mean].clone(),
                    arguments[statistics.var].clone(),
                    1.0 / (float(counter) + 1),
                )
            )
        return arguments, params, previous

    def _check_static_sizes(self, data: dict) -> None:
        """A call at other sizes than a spec traced with static sizes holds (``symgrad.trace.static_sizes``),
        refused in one line naming the traced sizes and the trace at the sizes given now."""
        changed = {
            key: list(data[key].shape)
            for key, traced in self._static_sizes.items()
            if isinstance(data.get(key), torch.Tensor) and list(data[key].shape) != traced
        }
        if changed:  # every input whose sizes changed, in the words and in the command (each --input)
            words = ", ".join(f"{name}={shape}" for name, shape in self._static_sizes.items())
            now = ", ".join(f"{key} is {shape}" for key, shape in changed.items())
            command = retrace(
                self.generated,
                self.model,
                change=[("--input", key, ",".join(map(str, shape))) for key, shape in changed.items()],
            )
            if "--static-sizes" not in command:
                command = command.replace(" && ", " --static-sizes && ", 1)
            raise BindError(
                f"{name_of(self.generated)} was traced with static sizes at {words}, and {now} "
                f"now: its code holds the sizes, branches and constants the model computed at those "
                f"sizes alone (fix: call it at those sizes{_last_batch(changed, self._static_sizes)}, or "
                f"trace and generate it at these: {command})"
            )

    def _moved(self, arguments: dict, previous: list) -> None:
        """After the generated forward ran: the batch counted, and each cumulative BatchNorm's statistics
        (the generated code wrote the batch's own) blended with those before, as nn.BatchNorm does."""
        self._count()
        if not previous:  # no cumulative BatchNorm
            return
        with torch.no_grad():
            for statistics, mean, var, factor in previous:
                for name, old in ((statistics.mean, mean), (statistics.var, var)):
                    batch = arguments[name]
                    batch.copy_(factor * batch + (1 - factor) * old)

    def _count(self) -> None:
        """``num_batches_tracked`` of each training-mode BatchNorm, moved as the module moves it: once per call."""
        self._counter()

    def check_unchanged(self) -> None:
        """The checks that a replayed CUDA graph (:mod:`symgrad.cuda_graph`) does not run: the model as bound, and
        every module in the mode it was traced in."""
        self._check_model_and_mode()
        self._check_values()

    def _check_values(self) -> None:
        """What the forward read that can be set between calls (:mod:`symgrad.value_guard`)."""
        changed = self.values.problem()
        if changed:  # the generated code computes with what was traced
            raise BindError(
                f"{name_of(self.generated)}: {changed}, or trace and generate the model again: "
                f"{retrace(self.generated, self.model)})"
            )

    def _check_model_and_mode(self) -> None:
        """:meth:`_check_model` and :meth:`_check_mode`, the common case (nothing changed) in a few C calls
        (dynamo traces the loops instead, and guards on what they read); where anything changed the loops
        say what. Hooks are looked at where one was registered anywhere since (``RemovableHandle`` counts
        them all) or one the model had is gone."""
        if not torch.compiler.is_compiling():
            if self._hook_watch.moved():
                self._check_hooks()
            if self._snapshot.unchanged():
                return
        self._check_model()
        self._check_mode()

    def _refuse_backward_hooks(self, hooks: dict) -> None:
        for path, kind in hooks.items():
            if kind == "backward":
                raise BindError(
                    f"{name_of(self.generated)}: {path or 'the model'} has a backward hook, which the "
                    "explicit backward does not run (fix: remove it, or apply what it does to the "
                    "parameters' .grad after backward)"
                )

    def _check_hooks(self) -> None:
        """The model's hooks as bound: a forward hook registered or removed since changes what the model
        computes, and the bound step runs what was traced."""
        now, bound = self._hook_watch.changes(), self._hook_watch.hooks
        self._refuse_backward_hooks(now)
        for path, hooks in now.items():
            if hooks != bound.get(path):
                shown = path or "the model"
                change = (
                    f"a forward hook of {shown} was removed"
                    if hooks is None and bound.get(path)
                    else f"{shown} has a forward hook registered"
                    if not bound.get(path)
                    else f"the forward hooks of {shown} changed"
                )
                raise BindError(
                    f"{name_of(self.generated)}: {change} since bind, and the bound step runs what was "
                    f"traced (fix: set the hooks back, or trace and generate the model with its hooks: "
                    f"{retrace(self.generated, self.model)})"
                )

    def _check_model(self) -> None:
        """The model as bound: the same submodules in the same places, the same hyper-parameters
        (a module swapped for another, or a momentum changed after ``bind``, is refused)."""
        for parent, name, child in self._children:
            if parent._modules.get(name) is not child:
                raise BindError(
                    f"{name_of(self.generated)}: a submodule {name} of {type(parent).__name__} was replaced "
                    f"or removed after bind (fix: bind the model again: {retrace(self.generated, self.model)} "
                    "if it changed what it computes)"
                )
        changed, refreshed = first_changed(self._hypers)  # symgrad.guards: dicts, lists, partials by value
        if refreshed:  # an equal value made anew (a partial): compared as it is now from here on
            self._snapshot = Snapshot(self._children, self._hypers, self._moded)
        if changed:
            path, module, key, value, now = changed
            has = f"no {key}" if now is MISSING else f"{key}={shown(now)}"
            raise BindError(
                f"{name_of(self.generated)}: {path or 'the model'} ({type(module).__name__}) has "
                f"{has} since bind, traced with {key}={shown(value)} (fix: set it back, or trace and "
                f"generate the changed model: {retrace(self.generated, self.model)})"
            )

    def _check_mode(self) -> None:
        if self._modes:  # every module whose code reads its mode, as traced (symgrad.modes words the refusal)
            wrong = [(path, module, training) for path, module, training in self._modes if module.training != training]
            if wrong:
                raise BindError(
                    mode_refusal(
                        name_of(self.generated),
                        wrong,
                        list(self._modes),
                        self.model,
                        lambda options: retrace(self.generated, self.model, options),
                        both_modes=self._ENTRY == "outputs_with_explicit_backward",
                    )
                )
            return
        if self._traced_training is not None:
            if {owner.training for owner in self._normed} != {self._traced_training}:
                traced = "train" if self._traced_training else "eval"
                raise BindError(
                    f"{name_of(self.generated)} was traced in {traced} mode, and the model's BatchNorm "
                    f"modules are now in {'eval' if traced == 'train' else 'train'} mode (fix: call "
                    f"model.{traced}(), or trace and generate the other mode too)"
                )

    def _check_requires_grad(self, data: dict, arguments: dict) -> None:
        """Every tensor that requires grad gets its gradient, or this one-line error."""
        if not torch.is_grad_enabled():
            return
        for name in self._constant_data:
            value = data[name]
            if isinstance(value, torch.Tensor) and value.requires_grad:
                raise BindError(
                    f"{name_of(self.generated)}: {name} requires grad, and the module computes no "
                    f"gradient for it (traced without it in wrt) (fix: pass {name}.detach(), or trace "
                    f"with --wrt naming {name} and generate again)"
                )
        for key, name in self._undifferentiated:
            value = arguments[name]
            if value.requires_grad:
                raise BindError(
                    f"{name_of(self.generated)}: {key} requires grad, and the module computes no "
                    f"gradient for it (it was frozen when traced) (fix: freeze it again with "
                    f"requires_grad_(False), or trace the model as it is now: "
                    f"{retrace(self.generated, self.model)})"
                )

    def _check_devices(self, data: dict, arguments: dict) -> None:
        device = next((value.device for name, value in arguments.items() if name not in data), None)
        if device is not None and device.type not in ("cpu", "cuda") and self._keeps_layouts:
            raise BindError(
                f"{name_of(self.generated)} passes a pooling backward an unset tensor laid out as its "
                f"input, which CPU's and CUDA's kernels read only for its layout, and {device.type}'s "
                f"may not (fix: train on cpu or cuda, or generate the module with --no-recompute)"
            )
        for name, value in data.items():
            if device is not None and value.device != device:
                raise BindError(
                    f"{name_of(self.generated)}: {name} is on {value.device}, and the model on {device} "
                    f"(fix: pass {name}.to('{device}'))"
                )

    def _check_sizes(self, data: dict, arguments: dict) -> None:
        """Run the forward once per set of data sizes on meta tensors (no kernel, no buffer moved):
        inputs it cannot take, and a training-mode BatchNorm given one value per channel, are refused
        before anything moves, as the model's forward refuses them."""
        autocast = tuple(torch.is_autocast_enabled(device) for device in ("cpu", "cuda"))
        key = (
            autocast,
            tuple((name, value.shape, value.dtype) for name, value in data.items()),
            tuple(map(id, arguments.values())),
        )  # a parameter replaced is checked again
        if key in self._checked:
            return
        floating = next(
            (
                value.dtype
                for name, value in arguments.items()
                if isinstance(value, torch.Tensor) and value.is_floating_point() and name not in data
            ),
            None,
        )

        def meta(value):
            if not isinstance(value, torch.Tensor):
                return value
            dtype = floating if any(autocast) and value.is_floating_point() and floating is not None else value.dtype
            return torch.empty(value.shape, dtype=dtype, device="meta")

        try:
            self._run_forward(
                {name: meta(value) for name, value in arguments.items()},
                {name: meta(value) for name, value in data.items()},
            )
        except ValueError as error:
            raise ValueError(_first_line(error)) from None
        except (NotImplementedError, KeyError):  # an op without a meta kernel: the call itself decides
            pass
        except Exception:  # the real forward's own message, on copies of the buffers (nothing moves, the
            # random state neither: where it runs whole, the step then draws the masks it would have drawn)
            buffers = {name for name, (owner, attribute) in self._state.items() if attribute in owner._buffers}
            devices = {
                value.device
                for value in data.values()
                if isinstance(value, torch.Tensor) and value.device.type == "cuda"
            }
            try:
                with torch.random.fork_rng(devices=sorted(devices, key=str)):
                    self._run_forward(
                        {name: value.clone() if name in buffers else value for name, value in arguments.items()}, data
                    )  # data as given
            except Exception as error:
                shapes = ", ".join(
                    f"{name} {list(value.shape)}" for name, value in data.items() if isinstance(value, torch.Tensor)
                )
                raise BindError(
                    f"{name_of(self.generated)} cannot take {shapes}: {_first_line(error)} "
                    "(fix: pass the inputs the model takes; nothing was moved)"
                ) from None
        self._checked.add(key)

    def _run_forward(self, values: dict, data: dict) -> None:
        """The generated forward on ``data`` and the model's tensors in ``values`` (by name), without a
        graph, with nn.BatchNorm's own checks."""
        with torch.no_grad(), SizeChecks():
            self.generated.forward(**data, params={key: values[name] for name, (key, _) in self.sources.items()})


def _last_batch(changed: dict, traced: dict) -> str:
    """Where only the batch of a call at other static sizes is smaller (a DataLoader's last batch), how to
    leave it out; else nothing."""
    if all(shape[1:] == traced[key][1:] and shape[:1] < traced[key][:1] for key, shape in changed.items()):
        return " (a smaller last batch: DataLoader(..., drop_last=True))"
    return ""


class Bound(Guard, torch.nn.Module):
    """``model`` with its generated explicit gradients; see :func:`bind`. An ordinary ``nn.Module``:
    ``copy.deepcopy``, ``pickle`` and ``torch.save`` work; it keeps the generated module by its file
    or import name, and binds it again (with every check) when unpickled."""

    def __init__(self, generated: ModuleType, model: torch.nn.Module, allow_edited: bool = False):
        super().__init__()
        self.model = model
        self.allow_edited = allow_edited
        self._reference = generated_reference(generated)
        self._setup(generated)

    def forward(self, *positional, **data: torch.Tensor) -> torch.Tensor:
        """The traced loss for these data arguments; ``.backward()`` on it runs the explicit backward."""
        unknown = sorted(set(data) - set(self.data_arguments))
        missing = [name for name in self.data_arguments if name not in data]
        if positional or unknown or missing:
            raise BindArgumentError(
                f"{name_of(self.generated)} takes the data arguments {', '.join(self.data_arguments)}, by keyword"
                + (f"; given {len(positional)} by position" if positional else "")
                + (f"; unknown: {', '.join(unknown)}" if unknown else "")
                + (f"; missing: {', '.join(missing)}" if missing else "")
                + f" (fix: step({', '.join(f'{name}=...' for name in self.data_arguments)}))"
            )
        for name, value in data.items():
            if not isinstance(value, torch.Tensor):
                raise BindArgumentError(
                    f"{name_of(self.generated)}: {name} is a {type(value).__name__}, not a tensor "
                    f"(fix: pass torch.as_tensor({name}))"
                )
        arguments, params, previous = self._checked_arguments(data)
        try:
            loss = self.generated.loss_with_explicit_backward(**data, params=params)
        except CHECKPOINT_STOP:
            self._moved(arguments, previous)  # checkpoint's recomputation, stopped once its values were kept:
            raise  # the forward ran whole, and its BatchNorms moved, as the model's own do there
        except KeyError as error:  # the generated code looks up nothing else by key: one it reads, the model lacks
            if not (error.args and isinstance(error.args[0], str) and error.args[0] not in params):
                raise self._failed(error) from error
            raise missing(self.generated, self.model, error.args[0]) from None
        except Exception as error:  # a value the sizes did not show (a label out of range)
            raise self._failed(error) from error
        self._moved(arguments, previous)
        return loss

    def _failed(self, error: Exception) -> BindError:
        """A step that failed where its sizes, dtypes and devices passed: on a value (a label out of
        range), in the loss, after every BatchNorm ran and counted the batch, as in the model's forward."""
        self._count()
        return BindError(
            f"{name_of(self.generated)}: the step failed: {_first_line(error)} (its BatchNorms moved "
            "their statistics, as the model's forward does before its loss fails; fix: pass the "
            "inputs the model takes)"
        )

    def __getstate__(self):
        if self._reference is None:
            raise BindError(
                f"{name_of(self.generated)} was not loaded from a file, so a copy of the bound model "
                "cannot find it again (fix: bind the generated file's path, "
                "symgrad.bind('generated/NAME.py', model))"
            )
        state = dict(self.__dict__)
        state["generated"] = None
        state["_checked"] = set()
        return state

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)
        kind, where = self._reference
        self._setup(
            load_generated(Path(where), self.allow_edited) if kind == "path" else importlib.import_module(where)
        )

    def __deepcopy__(self, memo):
        memo[id(self.generated)] = self.generated  # a module is shared, as copy.deepcopy shares functions
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        copied.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return copied


CHECKPOINT_STOP = tuple(filter(None, [getattr(torch.utils.checkpoint, "_StopRecomputationError", None)]))
"""What ``torch.utils.checkpoint(..., use_reentrant=False)`` raises through a recomputed forward to stop it
early (PyTorch's control flow, not a failure of the step: passed through as it is)."""


def _hyper(key: str, value) -> bool:
    """Whether the attribute ``key`` of a module is a hyper-parameter the fingerprint holds."""
    return not key.startswith("_") and key not in IGNORED and (literal(value) is not ... or guardable(value))


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def _owner(model: torch.nn.Module, key: str) -> tuple[torch.nn.Module, str]:
    path, _, attribute = key.rpartition(".")
    try:
        return model.get_submodule(path) if path else model, attribute
    except AttributeError:
        return model, key  # reported by _check_matches
