"""A bound step replayed as CUDA graphs: ``fast = symgrad.bind(module, model, cuda_graph=True)``.

On a GPU a training step at the sizes people train is bound by the host: what the step costs around
its kernels (the guard, the generated forward's and backward's Python, autograd's engine) is the
step's time. :class:`GraphedStep` captures the bound step, forward and explicit backward, as two CUDA
graphs with ``torch.cuda.make_graphed_callables``, once per set of data shapes, dtypes, strides,
autocast state and generated module serving the model's modes, and replays them at every later call
with the same set: the Python runs once per capture, not once per step. ::

    fast = symgrad.bind("gen/net_gradients.py", model, cuda_graph=True)
    for images, labels in loader:                      # the same batch size at every step
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fast(images), labels)   # replayed from the second call of a shape on
        loss.backward()                                # the explicit backward, replayed
        optimizer.step()

What it keeps right:

- BatchNorm statistics: ``make_graphed_callables`` runs the step a few times before capturing it (its
  warm-up); every buffer of the model (running statistics, ``num_batches_tracked``) is put back
  afterwards, so the statistics move once per call, as the model's own forward moves them.
- The guard: a replay runs none of the step's Python, so before each replay the checks of the model
  (a submodule swapped, a hyper-parameter changed, a module's mode) run as the eager step runs them; a
  parameter or buffer replaced (``model.to()``) drops the graphs and captures again.
- Where a step cannot be captured (a read back to the host, such as a ``momentum=None`` BatchNorm's
  batch count; no CUDA; no gradient wanted: ``torch.no_grad()`` and inference run eagerly), it warns
  once in one line and runs the eager bound step for that shape set.

What a replay shares, as every CUDA graph does: the returned tensors are the graph's own output
buffers, overwritten by the next replay (``loss.item()`` or ``.clone()`` what you keep), and dropout
draws from the graph's own offsets of the generator (other masks than an eager step's, alike in law).
"""

from __future__ import annotations

import inspect
import warnings

import torch

from .errors import SymgradError
from .fast_checks import StateReader


class _Positional(torch.nn.Module):
    """The bound step called with its data tensors by position, as ``make_graphed_callables`` calls it;
    its parameters are the model's (the bound step holds the model)."""

    def __init__(self, bound: torch.nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.bound = bound
        self.names = names

    def forward(self, *tensors):
        return self.bound(**dict(zip(self.names, tensors)))


class GraphedStep(torch.nn.Module):
    """``bound`` (a :class:`symgrad.binding.Bound` or :class:`symgrad.bound_model.BoundModel`) replayed as
    CUDA graphs where it can be; see :mod:`symgrad.cuda_graph`."""

    def __init__(self, bound: torch.nn.Module, warmup: int = 3):
        super().__init__()
        self.bound = bound
        self.warmup = warmup
        model = bound.model
        self._tensors = StateReader(
            {
                key: (model.get_submodule(key.rpartition(".")[0]), key.rpartition(".")[2])
                for key, _ in [*model.named_parameters(), *model.named_buffers()]
            }
        )
        self._signature = None if hasattr(bound, "data_arguments") else inspect.signature(model.forward)
        self._graphs: dict = {}
        self._refused: set = set()
        self._identity: tuple | None = None

    def forward(self, *args, **kwargs):
        if self._signature is not None:  # the model's own call (the outputs form)
            try:
                data = dict(self._signature.bind(*args, **kwargs).arguments)
            except TypeError:
                return self.bound(*args, **kwargs)  # its own message
        elif args:
            return self.bound(*args, **kwargs)  # the loss form takes keywords: its own message
        else:
            data = kwargs
        key = self._key(data)
        if key is None or key in self._refused:
            return self.bound(*args, **kwargs)
        graphed = self._graphs.get(key)
        if graphed is None:
            graphed = self._capture(key, data)
            if graphed is None:
                return self.bound(*args, **kwargs)
        self.bound.check_unchanged()  # what a replay skips of the guard: the model as bound, its modes
        return graphed(*data.values())

    def _key(self, data: dict) -> tuple | None:
        """What a graph is captured for, or None where the step runs eagerly."""
        if (
            not torch.is_grad_enabled()
            or not data
            or not all(isinstance(value, torch.Tensor) and value.is_cuda for value in data.values())
        ):
            return None
        identity = tuple(
            (id(value), getattr(value, "requires_grad", None)) for value in self._tensors.read({})[1].values()
        )
        if identity != self._identity:  # a tensor replaced (the graphs read the old ones), or (un)frozen
            self._graphs.clear()
            self._refused.clear()
            self._identity = identity
        return (
            tuple(
                (name, value.shape, value.dtype, value.stride(), value.requires_grad) for name, value in data.items()
            ),
            torch.is_autocast_enabled("cuda"),
            torch.get_autocast_dtype("cuda"),
            self.bound.serving() if hasattr(self.bound, "serving") else self.bound.model.training,
        )

    def _capture(self, key: tuple, data: dict):
        """The step captured for ``key``, or None (warned) where it cannot be; the model's buffers as
        they were before the warm-up either way."""
        buffers = list(self.bound.model.buffers())
        before = [buffer.clone() for buffer in buffers]
        step = _Positional(self.bound, tuple(data))
        sample = tuple(value.clone() for value in data.values())  # the graph's inputs: not the caller's tensors
        try:
            with torch.autocast("cuda", dtype=key[2], enabled=key[1], cache_enabled=False):
                graphed = torch.cuda.make_graphed_callables(
                    step, sample, num_warmup_iters=self.warmup, allow_unused_input=True
                )
        except (SymgradError, ValueError, TypeError):  # the guard's refusals: the eager step says them
            graphed = None
        except Exception as error:  # noqa: BLE001 - any capture failure: run eagerly, said once
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            warnings.warn(
                f"symgrad: this bound step cannot run as a CUDA graph ({type(error).__name__}: {first}); "
                "it runs eagerly for these shapes (fix: bind without cuda_graph=True to silence this)",
                stacklevel=5,
            )
            self._refused.add(key)
            graphed = None
        finally:
            torch.cuda.synchronize()
            with torch.no_grad():
                for buffer, value in zip(buffers, before):
                    buffer.copy_(value)
        if graphed is not None:
            self._graphs[key] = graphed
        return graphed

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_graphs"], state["_refused"], state["_identity"] = {}, set(), None  # captured again when used
        return state
