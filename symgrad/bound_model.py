"""The model itself, run by its generated explicit gradients: ``fast = symgrad.bind(module, model)``.

For a module generated from a spec that ends in outputs (``symgrad trace model.py:Net --input ...``
without ``--loss``), ``bind`` returns a :class:`BoundModel`: an ``nn.Module`` called as the model is
called, returning what ``model.forward`` returns (a tensor, a tuple or a dict), computed by the
generated forward. Its backward is one ``autograd.Function`` (``outputs_with_explicit_backward``)
whose backward runs the generated explicit backward from the outputs' cotangents and fills the
model's ``.grad``. Everything after the outputs is the user's, in plain autograd::

    fast = symgrad.bind(net_gradients, model)
    logits, aux = fast(images)
    loss = F.cross_entropy(logits, labels, label_smoothing=0.1) + 0.4 * F.cross_entropy(aux, labels)
    loss.backward()                      # explicit backward from d loss / d outputs
    optimizer.step()

It follows ``model.training`` at every call: where the model was traced in both modes (the generated
module names its eval-mode sibling in ``EVAL_MODULE``), eval mode runs the sibling (BatchNorm's
running statistics, no dropout, the eval-mode outputs). In training mode BatchNorm's running
statistics and ``num_batches_tracked`` move exactly as the model's own forward moves them.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType

import torch

from .binding import BindError, _check_matches, _load, _name, _owner, check_fingerprint, check_generated


class _Mode:
    """One generated module (of one mode) bound to the model's tensors."""

    def __init__(self, generated: ModuleType, model: torch.nn.Module, allow_edited: bool = False):
        check_generated(generated, allow_edited)
        check_fingerprint(generated, model, allow_edited)
        self.structured = bool(getattr(generated, "STRUCTURED", False))  # parameters in one `params` mapping
        sources = getattr(generated, "SOURCES", None)
        statistics = getattr(generated, "RUNNING_STATISTICS", ())
        if self.structured:  # keyed by state_dict key, read where used: the model's own, whatever they are
            state = {**dict(model.named_parameters(remove_duplicate=False)),
                     **dict(model.named_buffers(remove_duplicate=False))}
            sources = {key: (key, tuple(value.shape)) for key, value in state.items()}
            statistics = [(f"{path}.running_mean", f"{path}.running_var", momentum)
                          for path, momentum in getattr(generated, "MOMENTA", {}).items()]
        if not isinstance(sources, dict) or not hasattr(generated, "outputs_with_explicit_backward"):
            raise BindError(f"{_name(generated)} was not generated from a traced model (it has no SOURCES table) "
                            "(fix: symgrad trace FILE.py:Model ..., then symgrad generate the spec it writes)")
        _check_matches(generated, model, sources)
        self.generated = generated
        self.arguments = tuple(inspect.signature(generated.forward).parameters)
        self.data_arguments = tuple(name for name in self.arguments if name not in sources and not (
            self.structured and name == "params"))
        self.state = {name: _owner(model, key) for name, (key, _) in sources.items()}
        self.sources = sources
        for key in (key for mean, var, _ in statistics for key in (mean, var) if key not in sources):
            raise BindError(f"{_name(generated)} moves the running statistics {key}, which the model lacks (fix: "
                            "bind the module generated from this model, or trace the changed model again)")
        self.statistics = tuple((_owner(model, sources[mean][0])[0], mean, var, momentum)
                                for mean, var, momentum in statistics)
        has_batch_norm = any(key.endswith(".running_mean") for key, _ in sources.values())
        self.training = True if self.statistics else (False if has_batch_norm else None)
        """The BatchNorm mode it was traced in; None: it has no BatchNorm, and serves either mode."""

    def __call__(self, data: dict[str, torch.Tensor]):
        arguments = dict(data)
        for name, (owner, attribute) in self.state.items():  # looked up per call: .to() replaces buffers
            arguments[name] = getattr(owner, attribute)
        previous = []
        for module, mean, var, momentum in self.statistics:  # as nn.BatchNorm's forward counts batches
            counter = getattr(module, "num_batches_tracked", None)
            if counter is not None:
                counter.add_(1)
            if momentum is None:  # cumulative: the module passes 1 / num_batches_tracked
                previous.append((mean, var, arguments[mean].clone(), arguments[var].clone(), 1.0 / float(counter)))
        if self.structured:
            params = {key: arguments[name] for name, (key, _) in self.sources.items()}
            outputs = self.generated.outputs_with_explicit_backward(**data, params=params)
        else:
            outputs = self.generated.outputs_with_explicit_backward(*(arguments[name] for name in self.arguments))
        with torch.no_grad():
            for mean, var, old_mean, old_var, factor in previous:  # the generated code wrote the batch's own
                for name, old in ((mean, old_mean), (var, old_var)):
                    arguments[name].copy_(factor * arguments[name] + (1 - factor) * old)
        kind, keys = self.generated.OUTPUTS_KIND, self.generated.OUTPUTS
        if kind == "tensor":
            return outputs[0]
        if kind == "dict":
            return dict(zip(keys, outputs))
        return tuple(outputs)


class BoundModel(torch.nn.Module):
    """``model`` run by its generated explicit gradients, returning what ``model.forward`` returns;
    see :mod:`symgrad.bound_model`."""

    def __init__(self, generated: ModuleType, model: torch.nn.Module, eval_module: ModuleType | None = None,
                 allow_edited: bool = False):
        super().__init__()
        self.model = model
        self.generated = generated
        modes = [_Mode(generated, model, allow_edited)]
        eval_name = getattr(generated, "EVAL_MODULE", None)
        if eval_module is None and eval_name is not None:
            where = getattr(generated, "__file__", None)
            path = Path(where).with_name(f"{eval_name}.py") if where else None
            if path is None or not path.is_file():
                raise BindError(f"{_name(generated)} names its eval-mode module {eval_name}, and there is no "
                                f"{path or eval_name + '.py'} beside it (fix: symgrad generate the eval spec that "
                                "symgrad trace wrote beside the train spec into the same folder, and bind by path)")
            eval_module = _load(path, allow_edited)
        if eval_module is not None:
            modes.append(_Mode(eval_module, model, allow_edited))
            modes[0].training, modes[1].training = True, False
        self._modes = modes
        self._signature = inspect.signature(model.forward)

    def forward(self, *args, **kwargs):
        """What ``model(*args, **kwargs)`` returns, computed by the generated forward of the model's
        current mode; a backward through it runs the explicit gradients."""
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{type(self.model).__name__}.forward: {error}") from None
        bound.apply_defaults()
        mode = self._mode()
        missing = [name for name in mode.data_arguments if name not in bound.arguments]
        if missing:
            raise TypeError(f"{_name(mode.generated)} takes the data arguments {', '.join(mode.data_arguments)}; "
                            f"missing: {', '.join(missing)}")
        return mode({name: bound.arguments[name] for name in mode.data_arguments})

    def _mode(self) -> _Mode:
        training = self.model.training
        for mode in self._modes:
            if mode.training is None or mode.training == training:
                return mode
        traced = "train" if self._modes[0].training else "eval"
        raise BindError(f"{_name(self.generated)} was traced in {traced} mode only, and the model is now in "
                        f"{'train' if training else 'eval'} mode (fix: call model.{traced}(), or trace without "
                        "--eval/--train so that symgrad traces both modes)")
