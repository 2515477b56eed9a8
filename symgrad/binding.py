"""Training a traced model with its explicit gradients: ``step = symgrad.bind(module, model)``.

A module generated from ``symgrad trace model.py:Net`` takes every parameter and buffer as an
argument and records, in ``SOURCES``, which ``state_dict()`` key each one came from. ``bind`` reads
that table once, checks it against the model (names and shapes, so a model changed since it was
traced is refused), and returns an ``nn.Module`` whose forward takes only the data arguments.
Written as blocks (``STRUCTURED``), the module takes them in one ``params`` mapping keyed by
``state_dict()`` names and reads each where it is used, at any size (a wider model of the same
structure binds too): ``bind`` passes the model's parameters and buffers, and a key the module
reads and the model lacks is refused at the first call::

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

import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from .errors import SymgradError


class BindError(SymgradError):
    """The generated module and the model do not belong together."""


@dataclass(frozen=True)
class _Statistics:
    """One training-mode batch norm's buffers, and its momentum (None: cumulative average)."""

    module: torch.nn.Module
    mean: str
    var: str
    momentum: float | None


class Bound(torch.nn.Module):
    """``model`` with its generated explicit gradients; see :func:`bind`."""

    def __init__(self, generated: ModuleType, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.generated = generated
        self.structured = bool(getattr(generated, "STRUCTURED", False))  # parameters in one `params` mapping
        sources = getattr(generated, "SOURCES", None)
        if self.structured:  # shape-generic, keyed by state_dict key: the model's own, whatever they are
            state = {**dict(model.named_parameters(remove_duplicate=False)),
                     **dict(model.named_buffers(remove_duplicate=False))}
            sources = {key: (key, tuple(value.shape)) for key, value in state.items()}
        if not isinstance(sources, dict) or not hasattr(generated, "loss_with_explicit_backward"):
            raise BindError(f"{_name(generated)} was not generated from a traced model (it has no SOURCES table) "
                            "(fix: symgrad trace FILE.py:Model ..., then symgrad generate the spec it writes)")
        arguments = list(inspect.signature(generated.forward).parameters)
        self.sources = sources
        self.data_arguments = tuple(name for name in arguments if name not in sources
                                    and not (self.structured and name == "params"))
        self._arguments = tuple(arguments)
        self._state = {name: _owner(model, key) for name, (key, _) in sources.items()}
        _check_matches(generated, model, sources)
        statistics = getattr(generated, "RUNNING_STATISTICS", ())
        if self.structured:
            statistics = [(f"{module}.running_mean", f"{module}.running_var", momentum)
                          for module, momentum in getattr(generated, "MOMENTA", {}).items()]
            for key in (key for mean, var, _ in statistics for key in (mean, var) if key not in sources):
                raise _missing(generated, model, key)
        self._statistics = tuple(
            _Statistics(_owner(model, sources[mean][0])[0], mean, var, momentum)
            for mean, var, momentum in statistics)
        for statistics in self._statistics:
            if (statistics.module.momentum is None) != (statistics.momentum is None) or (
                    statistics.momentum is not None and statistics.module.momentum != statistics.momentum):
                raise BindError(f"{_name(generated)} was traced with momentum {statistics.momentum} for "
                                f"{sources[statistics.mean][0].rsplit('.', 1)[0]}, and the model has "
                                f"{statistics.module.momentum} (fix: trace the model again)")
        self._traced_training = bool(self._statistics) or None
        if not self._statistics and any(key.endswith(".running_mean") for key, _ in sources.values()):
            self._traced_training = False

    def forward(self, **data: torch.Tensor) -> torch.Tensor:
        """The traced loss for these data arguments; ``.backward()`` on it runs the explicit backward."""
        unknown = sorted(set(data) - set(self.data_arguments))
        missing = [name for name in self.data_arguments if name not in data]
        if unknown or missing:
            raise TypeError(f"{_name(self.generated)} takes the data arguments {', '.join(self.data_arguments)}"
                            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
                            + (f"; missing: {', '.join(missing)}" if missing else ""))
        self._check_mode()
        arguments = dict(data)
        for name, (owner, attribute) in self._state.items():  # looked up per call: .to() replaces buffers
            arguments[name] = getattr(owner, attribute)
        previous = []
        for statistics in self._statistics:
            counter = getattr(statistics.module, "num_batches_tracked", None)
            if counter is not None:
                counter.add_(1)
            if statistics.momentum is None:  # cumulative: the module passes 1 / num_batches_tracked
                previous.append((statistics, arguments[statistics.mean].clone(), arguments[statistics.var].clone(),
                                 1.0 / float(counter)))
        if self.structured:
            params = {key: arguments[name] for name, (key, _) in self.sources.items()}
            try:
                loss = self.generated.loss_with_explicit_backward(**data, params=params)
            except KeyError as error:  # the generated code looks up nothing else by key: one it reads, the model lacks
                if not (error.args and isinstance(error.args[0], str) and error.args[0] not in params):
                    raise
                raise _missing(self.generated, self.model, error.args[0]) from None
        else:
            loss = self.generated.loss_with_explicit_backward(**{name: arguments[name] for name in self._arguments})
        with torch.no_grad():
            for statistics, mean, var, factor in previous:  # the generated code wrote the batch's own statistics
                for name, old in ((statistics.mean, mean), (statistics.var, var)):
                    batch = arguments[name]
                    batch.copy_(factor * batch + (1 - factor) * old)
        return loss

    def _check_mode(self) -> None:
        if self._traced_training is None:
            return
        modes = {statistics.module.training for statistics in self._statistics} or {
            owner.training for owner, attribute in self._state.values() if attribute == "running_mean"}
        if modes != {self._traced_training}:
            traced = "train" if self._traced_training else "eval"
            raise BindError(f"{_name(self.generated)} was traced in {traced} mode, and the model's BatchNorm "
                            f"modules are now in {'eval' if traced == 'train' else 'train'} mode (fix: call "
                            f"model.{traced}(), or trace and generate the other mode too)")


def bind(generated: ModuleType | str | Path, model: torch.nn.Module) -> Bound:
    """The training step of ``model`` with the explicit gradients of ``generated`` (the module written
    by ``symgrad generate`` for a spec ``symgrad trace`` made from this model's class, or its path).

    Returns an ``nn.Module``: call it with the data arguments by keyword (``step(x=images,
    target=labels)``) to get the loss; ``.backward()`` fills ``.grad`` of the model's parameters.
    Raises :class:`BindError` when the model's parameter or buffer names or shapes differ from those
    the module was traced with.
    """
    if isinstance(generated, (str, Path)):
        generated = _load(Path(generated))
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise BindError("bind the model itself, then wrap the result: DistributedDataParallel(symgrad.bind(module, model))")
    if hasattr(generated, "OUTPUTS"):  # a spec that ends in outputs: the model itself (symgrad.bound_model)
        from .bound_model import BoundModel

        return BoundModel(generated, model)
    return Bound(generated, model)


def _owner(model: torch.nn.Module, key: str) -> tuple[torch.nn.Module, str]:
    path, _, attribute = key.rpartition(".")
    try:
        return model.get_submodule(path) if path else model, attribute
    except AttributeError:
        return model, key  # reported by _check_matches


def _check_matches(generated: ModuleType, model: torch.nn.Module, sources: dict[str, tuple[str, tuple]]) -> None:
    state = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers(remove_duplicate=False))}
    problems = []
    for name, (key, shape) in sources.items():
        if key not in state:
            problems.append(f"{key} (argument {name}) is not a parameter or buffer of the model")
        elif tuple(state[key].shape) != tuple(shape):
            problems.append(f"{key} has shape {list(state[key].shape)}, traced as {list(shape)}")
    if problems:
        more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
        raise BindError(f"{_name(generated)} does not fit {type(model).__name__}: {'; '.join(problems[:3])}{more} "
                        "(fix: bind the module generated from this model, or trace the changed model again)")


def _load(path: Path) -> ModuleType:
    if not path.is_file():
        raise BindError(f"no generated module at {path} (fix: check the path)")
    spec = importlib.util.spec_from_file_location(f"_symgrad_bound_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _missing(generated: ModuleType, model: torch.nn.Module, key: str) -> BindError:
    return BindError(f"{_name(generated)} does not fit {type(model).__name__}: it reads {key}, which is not a "
                     "parameter or buffer of the model (fix: bind the module generated from this model, or trace "
                     "the changed model again)")


def _name(generated: ModuleType) -> str:
    return getattr(generated, "__name__", "the generated module")
