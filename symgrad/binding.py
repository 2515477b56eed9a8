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

from .call_guards import kept
from .fast_checks import BatchCounter, HookWatch, Snapshot, StateReader, module_paths
from .fingerprint import IGNORED, literal
from .generated_module import (
    BindError,
    check_fingerprint,
    check_generated,
    check_matches,
    generated_reference,
    load_generated,
    missing,
    name_of,
)
from .guards import guardable
from .retrace import retrace
from .step_checks import StepChecks, first_line
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


class Guard(StepChecks):
    """What a bound form reads off its generated module and checks at each call (both forms: :class:`Bound`
    and :class:`symgrad.bound_model.BoundModel` per mode): the model as bound, every mode as traced,
    every tensor that requires grad given its gradient, devices, and sizes on meta tensors (nothing moves
    on a call the model refuses; the checks: :mod:`symgrad.step_checks`). Needs ``model`` and
    ``allow_edited``; ``_setup`` sets the rest."""

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
        self._autocast_guards = tuple(
            (where, device, key == "autocast_read")
            for key in ("autocast", "autocast_read")
            for where, device in ((getattr(generated, "GUARDS", None) or {}).get(key) or {}).items()
        )
        """The model's own regions turning autocast off and the places it asks whether autocast is on (file:line,
        device, whether it asks): the caller's autocast is refused (``StepChecks._check_autocast``)."""
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
        # each module's children's names as bound: one added since (a shortcut the code reads by hasattr, a
        # Sequential appended to) changes what the model computes as surely as one replaced
        self._owned = tuple((path, module, tuple(module._modules)) for path, module in modules.items())
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
        paths = module_paths(model)  # under torch.compile the checks walk to each module from the model
        self._snapshot = Snapshot(self._children, self._hypers, moded, paths, self._owned)
        self._hook_watch = HookWatch(model)
        self._refuse_backward_hooks(self._hook_watch.hooks)
        self._reader = StateReader(self._state, paths)
        self._counter = BatchCounter(self._statistics, paths)
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
        if self._autocast_guards:
            self._check_autocast(data)
        self._check_model_and_mode()
        self._check_values()
        arguments, params = self._reader.read(data, self.model)  # params: named by state_dict key
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
        self._counter(self.model)

    def check_unchanged(self) -> None:
        """The checks that a replayed CUDA graph (:mod:`symgrad.cuda_graph`) does not run: the model as bound, and
        every module in the mode it was traced in."""
        self._check_model_and_mode()
        self._check_values()


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
            f"{name_of(self.generated)}: the step failed: {first_line(error)} (its BatchNorms moved "
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


def _owner(model: torch.nn.Module, key: str) -> tuple[torch.nn.Module, str]:
    path, _, attribute = key.rpartition(".")
    try:
        return model.get_submodule(path) if path else model, attribute
    except AttributeError:
        return model, key  # reported by _check_matches
