"""Running user code once while recording every torch call it makes.

A ``TorchFunctionMode`` sees each call into torch (``F.conv2d``, ``Tensor.view``, ``torch.cat``,
``x += y``): the recorder runs it, keeps the call with its arguments and result, the user's own
``file:line`` that made it and the path of the ``nn.Module`` it ran in (``layer2.0.bn1``), read
from module forward hooks. Calls made inside a recorded call (``F.interpolate``'s own kernels) are
not seen: the mode is off while its handler runs. Queries of size, type and layout are not kept.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.autograd.function
import torch.autograd.grad_mode
import torch.nn.functional as F
import torch.utils._contextlib
import torch.utils.checkpoint
from torch.nn.modules import module as module_hooks
from torch.overrides import TorchFunctionMode

from . import sizes
from .autocast_regions import AUTOCAST, AUTOCAST_ENTER, IS_AUTOCAST_ENABLED, autocast_read, autocast_region
from .custom_functions import Applied
from .frames import DISPATCH_FILES, TORCH_DIR, by_user, is_users, user_line
from .names_from_code import code_targets

SHAPE_QUERIES = frozenset(
    {
        "size",
        "dim",
        "ndimension",
        "numel",
        "nelement",
        "stride",
        "element_size",
        "is_contiguous",
        "is_floating_point",
        "is_complex",
        "get_device",
        "data_ptr",
        "storage_offset",
        "is_same_size",
        "is_pinned",
        "is_shared",
        "is_signed",
        "is_inference",
        "has_names",
        "type",
        "__sizeof__",
        "__len__",
        "__format__",
        "__repr__",
        "__str__",
        "__hash__",
        "requires_grad_",
        "__get__",
    }
)
"""Calls that only read sizes, types or layout, or format a tensor for a log line: they leave no trace in
the spec (``__get__`` is a property such as ``.shape``; one that returns a tensor, such as ``.T``, is
recorded by its name)."""

VALUE_READS = {
    "__bool__": ("bool(tensor)", "branch"),
    "item": (".item()", "number"),
    "__float__": ("float(tensor)", "number"),
    "__int__": ("int(tensor)", "number"),
    "__index__": ("a tensor as an index", "number"),
    "__complex__": ("complex(tensor)", "number"),
    "tolist": (".tolist()", "number"),
    "numpy": (".numpy()", "number"),
    "__array__": ("numpy.asarray(tensor)", "number"),
    "size of values": ("size of x[mask], nonzero(), masked_select() or unique()", "number"),
}
"""Calls that take a Python value or decision out of a tensor: how the error shows each, and which fix fits
(any other call that returns a Python bool or number from tensors, ``torch.equal``, is a decision too)."""

RANDOM = frozenset(
    {
        "rand",
        "randn",
        "randint",
        "randperm",
        "rand_like",
        "randn_like",
        "randint_like",
        "bernoulli",
        "bernoulli_",
        "multinomial",
        "normal",
        "normal_",
        "uniform_",
        "exponential_",
        "geometric_",
        "log_normal_",
        "cauchy_",
        "random_",
        "poisson",
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
    }
)
"""Calls whose result is random (or uninitialised memory): never a constant, even from literal arguments."""

FILLERS = frozenset({"ones_like", "zeros_like", "full_like", "new_ones", "new_zeros", "new_full", "new_tensor"})
"""Calls whose result's values do not depend on the values of their first tensor, whose size, dtype or
device they only take (``torch.ones_like(x)``, ``x.new_full((n, 1), 0.5)``): a constant when their other
arguments are (``x.new_tensor(y)`` copies y's values)."""

VALUE_SHAPED = frozenset(
    {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount", "repeat_interleave"}
)
"""Calls whose result's size depends on their arguments' values (so does ``torch.where(c)``, one argument,
and indexing with a boolean mask)."""

SIZES = frozenset({"size", "numel", "nelement", "__len__", "shape"})
"""Size queries: a number taken from values when the tensor's size came from values."""

BOOLEAN_DISPATCH = {
    F.max_pool1d: "max_pool1d",
    F.max_pool2d: "max_pool2d",
    F.max_pool3d: "max_pool3d",
    F.adaptive_max_pool1d: "adaptive_max_pool1d",
    F.adaptive_max_pool2d: "adaptive_max_pool2d",
    F.adaptive_max_pool3d: "adaptive_max_pool3d",
}
"""``torch.nn.functional`` functions whose Python name is a dispatcher's (``fn``), by identity."""

CHECKPOINT_FILES = {torch.utils.checkpoint.__file__, os.path.realpath(torch.utils.checkpoint.__file__)}
FUNCTION_FILES = {torch.autograd.function.__file__, os.path.realpath(torch.autograd.function.__file__)}


NO_GRAD = "no_grad"
"""``Call.undifferentiated`` of a call the traced code made under ``torch.no_grad()`` or ``inference_mode()``."""


def _undifferentiated(frame, applied: dict[int, Applied] | None = None) -> str | Applied:
    """Why a call made with gradients off (from ``frame``) gets no gradient from autograd: the custom
    ``autograd.Function``'s apply whose forward runs it (its own backward decides; ``applied`` keeps one
    :class:`Applied` per apply, by its arguments), or :data:`NO_GRAD`; "" where ``torch.utils.checkpoint``
    runs it (its reentrant form runs the forward under ``no_grad`` and again with gradients in the backward)."""
    if torch.is_inference_mode_enabled():  # never checkpoint's
        return NO_GRAD
    while frame is not None:
        if frame.f_code.co_filename in CHECKPOINT_FILES:
            return ""
        function = frame.f_locals.get("cls") if frame.f_code.co_filename in FUNCTION_FILES else None
        if isinstance(function, type) and frame.f_code.co_name == "apply":
            if function.__module__ == torch.utils.checkpoint.__name__:
                return ""
            arguments = frame.f_locals.get("args", ())
            if applied is None or id(arguments) not in applied:  # one per apply (it keeps the tuple, and so its id)
                made = Applied(function, tuple(arguments), dict(frame.f_locals.get("kwargs") or {}), user_line(frame))
                if applied is None:
                    return made
                applied[id(arguments)] = made
            return applied[id(arguments)]
        frame = frame.f_back
    return NO_GRAD


GRAD_MODE_FILES = {torch.autograd.grad_mode.__file__, torch.utils._contextlib.__file__}
GRAD_MODE_FILES |= {os.path.realpath(path) for path in GRAD_MODE_FILES}


def _setter(frame):
    """The user's frame that turned gradients on or off (``with torch.no_grad():``, a ``@torch.no_grad()``
    method, ``torch.set_grad_enabled(False)``), past torch's own grad-mode code; None where torch's code did."""
    while frame is not None and frame.f_code.co_filename in GRAD_MODE_FILES:
        frame = frame.f_back
    return frame if frame is not None and is_users(frame.f_code.co_filename) else None


@dataclass
class Call:
    """One recorded torch call."""

    name: str
    """The function's name: ``conv2d``, ``view``, ``add_``, ``__getitem__``, ``max_pool2d``."""
    function: Callable
    arguments: tuple
    keywords: dict[str, Any]
    result: Any
    where: str
    module: str
    """Path of the innermost ``nn.Module`` running (``layer2.0.bn1``); empty outside any module."""
    leaf: bool
    """Whether that module has no submodules (so the call is the module's own op)."""
    sizes_read: tuple = ()
    """The tensors whose sizes the user's own code read (``x.shape[-2:]``, ``x2.size()[2]``) since the call
    before: where a size argument may have come from."""
    constant: bool = False
    """Whether the result is a constant: made from literals alone (``torch.full``, ``torch.ones_like(x)``)."""
    fill: float | None = None
    """A constant result's one value, when every entry holds it (``torch.full((n, 1, h, w), 0.1)``), as it
    was when made (a later in-place update makes a new call)."""
    undifferentiated: str | Applied = ""
    """Why autograd does not differentiate the call: :data:`NO_GRAD` (the traced code's ``torch.no_grad()``),
    or the custom ``autograd.Function``'s apply whose forward ran it; "" where it does."""
    compared: tuple = ()
    """The sizes the user's code compared since the call before (``sizes.COMPARED``), as ``(relation, left,
    right, outcome, where)``: the branches taken on the input's size, which the walk writes as checks."""
    targets: tuple = ()
    """The names the user's statement gives the result, one per piece of a tuple result (``q, k, v =
    qkv.unbind(0)``), None for a piece it names not: ``names_from_code.code_targets``; () where none."""


def _bound(frame, call: Call) -> bool:
    """Whether the frame's variables hold ``call``'s result under the names its statement gives it."""
    values = call.result if isinstance(call.result, (tuple, list)) else (call.result,)
    variables = frame.f_locals
    return any(name is not None and variables.get(name) is value for name, value in zip(call.targets, values))


@dataclass
class ValueRead:
    """A Python value or decision the traced code took out of a tensor that is not a constant."""

    name: str
    """The call: ``__bool__``, ``item``, ``tolist``, ``equal``."""
    where: str
    module: str
    integers: bool = False
    """Whether the tensor read is an int64 input or computed from one (a padding mask)."""


def function_name(function: Callable) -> str:
    if function in BOOLEAN_DISPATCH:
        return BOOLEAN_DISPATCH[function]
    return getattr(function, "__name__", None) or repr(function)


class Recorder(TorchFunctionMode):
    """Records the torch calls of the code run inside it; ``module_paths`` maps id(module) to its path."""

    def __init__(self, module_paths: dict[int, str]):
        super().__init__()
        self.calls: list[Call] = []
        self.module_paths = module_paths
        self.constants: set[int] = set()
        """ids of the tensors the code made from literals alone (``torch.tensor(2.0)``, ``torch.ones(3)``, and
        what is computed from those only): every other tensor may hold a value of the inputs, parameters,
        buffers or random numbers. Recorded results stay alive in ``calls``, so their ids stay theirs."""
        self.value_reads: list[ValueRead] = []
        self.no_grad_in_checkpoint: list[str] = []
        """Where the traced code turns gradients off inside a ``torch.utils.checkpoint`` block."""
        self.precision: torch.dtype | None = None
        """The model's floating dtype (its parameters'), which a constant follows where the code asks
        for it (``dtype=x.dtype``, ``torch.full_like(x, ...)``)."""
        self.exact: dict[int, torch.Tensor] = {}
        """For the float constants among ``constants``: their values computed in float64 (see
        :meth:`_exact_fill`), as the Python code wrote them whatever the model's precision."""
        self.value_shaped: set[int] = set()
        """ids of the tensors whose size depends on values that are not constants (``h.nonzero()``)."""
        self.from_integers: set[int] = set()
        """ids of the int64 inputs and of what is computed from them (a padding mask's ``mask.all()``)."""
        self.running: list[torch.nn.Module] = []
        self.applied: dict[int, Applied] = {}
        """The custom ``autograd.Function`` applies met, by the id of their arguments' tuple."""
        self._hooks: list = []
        self._sizes_read: list[torch.Tensor] = []
        self.size_tensors: list[torch.Tensor] = []
        """The tensors whose sizes the user's code read, by the index its sizes carry (``sizes.Dim``)."""
        self._size_index: dict[int, int] = {}
        self._autocast_enter: Callable = AUTOCAST_ENTER
        self._is_autocast_enabled: Callable = IS_AUTOCAST_ENABLED
        self.autocast_regions: dict[str, str] = {}
        """The traced code's own ``torch.autocast(device, enabled=False)`` regions, a no-op while it runs (no
        autocast on for their device): each ``file:line`` and its device, for the guards (a bound step refuses
        to run under the caller's autocast, where the region would matter: :func:`~symgrad.trace.autocast_regions.autocast_region`)."""
        self.autocast_reads: dict[str, str] = {}
        """Where the traced code asked whether autocast is on (``torch.is_autocast_enabled(device)``, as
        transformers' ``maybe_autocast`` does before it opens a region, or timm's norms before they cast), and
        for which device: off, as the trace runs; the caller's autocast is refused there alike."""
        self._named_site: tuple | None = None
        """(frame, instruction, call) of the last call given names by its statement (:meth:`_name`)."""

    def __enter__(self):
        self.compared = sizes.COMPARED = []
        self._hooks = [
            module_hooks.register_module_forward_pre_hook(self._entered),
            module_hooks.register_module_forward_hook(self._left, always_call=True),
        ]
        regions = self.autocast_regions

        def enter(region):  # a function, so that `with` binds the region to it as to torch's own __enter__
            return autocast_region(region, regions)

        def is_autocast_enabled(*arguments, **keywords):  # the traced code's question, noted where it asks it
            return autocast_read(reads, *arguments, **keywords)

        reads = self.autocast_reads
        self._autocast_enter, AUTOCAST.__enter__ = AUTOCAST.__enter__, enter
        self._is_autocast_enabled, torch.is_autocast_enabled = torch.is_autocast_enabled, is_autocast_enabled
        return super().__enter__()

    def _entered(self, module, arguments) -> None:  # a hook returning a value would replace the input
        self.running.append(module)

    def _left(self, module, arguments, output) -> None:  # ... or the output
        self.running.pop()

    def __exit__(self, *exception):
        sizes.COMPARED = None
        self._named_site = None  # its frame, kept no longer
        for hook in self._hooks:
            hook.remove()
        AUTOCAST.__enter__ = self._autocast_enter
        torch.is_autocast_enabled = self._is_autocast_enabled
        self.running.clear()
        return super().__exit__(*exception)

    def _module(self) -> tuple[str, bool]:
        """Path of the innermost running module, and whether it is a leaf."""
        module = self.running[-1] if self.running else None
        if module is None:
            return "", False
        return self.module_paths.get(id(module), type(module).__name__), next(iter(module.children()), None) is None

    def __torch_function__(self, function, types, arguments=(), keywords=None):
        keywords = keywords or {}
        if function is torch._C._set_grad_enabled:  # the traced code's torch.no_grad(), as it sets it
            caller = _setter(sys._getframe(1))
            why = _undifferentiated(caller, self.applied) if arguments and not arguments[0] and caller else NO_GRAD
            if why == "":
                self.no_grad_in_checkpoint.append(user_line(caller))  # checkpoint's own no_grad would hide it
            elif isinstance(why, Applied) and not why.no_grad_at:  # a Function's forward: its check must know
                why.no_grad_at = user_line(caller)
            return function(*arguments, **keywords)
        arguments, keywords = _copied(tuple(arguments)), _copied(dict(keywords))  # as called, not as later appended to
        # the traced code's no_grad() or inference_mode(), or a custom autograd.Function's forward (not checkpoint's)
        undifferentiated = "" if torch.is_grad_enabled() else _undifferentiated(sys._getframe(1), self.applied)
        with torch.no_grad():  # the calls themselves build no graph
            result = function(*arguments, **keywords)
        name = function_name(function)
        if name == "__get__":
            name = getattr(getattr(function, "__self__", None), "__name__", name)  # .shape, .T, .mT, .data
            if not isinstance(result, torch.Tensor):
                return self._size_read(name, arguments, result)
        elif name in SHAPE_QUERIES:
            return self._size_read(name, arguments, result)
        read = list(
            _tensors(arguments[1:], keywords) if name in FILLERS and arguments else _tensors(arguments, keywords)
        )
        if name in FILLERS and arguments and isinstance(arguments[0], torch.Tensor) and by_user(sys._getframe(1)):
            self._sizes_read.append(arguments[0])  # torch.full_like(x[:, :1], 0.1): its sizes are x[:, :1]'s
        constant = name not in RANDOM and all(id(value) in self.constants for value in read)
        integers = any(id(value) in self.from_integers for value in read)
        if name in VALUE_READS or _is_value(result):
            if not constant:
                self._value_read(name, sys._getframe(1), integers)
            return result
        if integers:
            self.from_integers.update(id(value) for value in _tensors((result,), {}))
        shaped = not constant and (
            name in VALUE_SHAPED
            or (name == "where" and len(arguments) + len(keywords) == 1)
            or (name == "__getitem__" and _masks(arguments[1:]))
        )
        shaped = shaped or any(id(value) in self.value_shaped for value in _tensors(arguments, keywords))
        for value in _tensors((result,), {}):
            (self.constants.add if constant else self.constants.discard)(id(value))
            (self.value_shaped.add if shaped else self.value_shaped.discard)(id(value))
        if (
            not constant
            and arguments
            and isinstance(arguments[0], torch.Tensor)
            and (name.endswith("_") or name == "__setitem__" or name.startswith("__i"))
        ):
            self.constants.discard(id(arguments[0]))  # c[0] = h.sum(), c.add_(h): c now holds a value of h
            self.exact.pop(id(arguments[0]), None)
        path, leaf = self._module()
        constant_result = constant and isinstance(result, torch.Tensor)
        fill = _fill(result) if constant_result else None
        if constant_result and result.is_floating_point():
            fill = self._exact_fill(function, name, arguments, keywords, result, fill)
        else:
            self.exact.pop(id(result), None)
        self.calls.append(
            Call(
                name,
                function,
                arguments,
                keywords,
                result,
                user_line(sys._getframe(1)),
                path,
                leaf,
                tuple(self._sizes_read),
                constant_result,
                fill,
                undifferentiated,
                tuple((*entry[:4], user_line(entry[4])) for entry in self.compared if by_user(entry[4])),
            )
        )
        self._name(self.calls[-1], sys._getframe(1))
        self._sizes_read.clear()
        self.compared.clear()
        return result

    def _name(self, call: Call, frame) -> None:
        """``call.targets``: the names the running statement gives the call's result. A library function
        the statement calls (einops' ``rearrange``) may make several torch calls from one expression: the
        last of them is its value, so a call at the same place whose result the statement has not yet
        bound (a loop's next pass has) gives its names up to this one."""
        frame, call.targets = code_targets(frame, is_users)
        if not call.targets:
            return
        site = self._named_site
        if site is not None and site[0] is frame and site[1] == frame.f_lasti and not _bound(frame, site[2]):
            site[2].targets = ()
        self._named_site = (frame, frame.f_lasti, call)

    def _exact_fill(
        self, function, name: str, arguments: tuple, keywords: dict, result: torch.Tensor, fill: float | None
    ) -> float | None:
        """A constant's one value as the Python code makes it when the model runs in float64: the call
        made again with the model's precision (``precision``) read as float64, from the float64 values of
        the constants it reads (kept in ``exact``), so that ``torch.full_like(x, 0.1)`` in a float32
        model records 0.1, not float32's 0.10000000149011612 (``torch.tensor(0.1)``, float32 in a float64
        model too, stays float32's). The value traced is kept where the float64 one does not round to it."""

        def in_float64(value: Any, first: bool = False) -> Any:
            if isinstance(value, torch.Tensor):
                if id(value) in self.exact and id(value) in self.constants:
                    return self.exact[id(value)]
                return value.double() if value.dtype == self.precision and not (first and name in FILLERS) else value
            if value == self.precision:  # dtype=x.dtype; torch.tensor(0.3) is float32 in a float64 model too
                return torch.float64
            if type(value) in (list, tuple):  # torch.cat's tensors; a torch.Size is a size, kept
                return type(value)(in_float64(item) for item in value)
            return value

        exact = None
        try:
            arguments64 = [in_float64(value, index == 0) for index, value in enumerate(arguments)]
            keywords64 = {key: in_float64(value) for key, value in keywords.items()}
            if name in FILLERS and "dtype" not in keywords and arguments[0].dtype == self.precision:
                keywords64["dtype"] = torch.float64
            exact = function(*arguments64, **keywords64)
        except Exception:  # noqa: BLE001 - a call that will not run in float64 keeps its traced value
            exact = None
        if not isinstance(exact, torch.Tensor) or exact.shape != result.shape or not exact.is_floating_point():
            self.exact.pop(id(result), None)
            return fill
        self.exact[id(result)] = exact if exact.dtype == torch.float64 else exact.double()
        exact_fill = _fill(self.exact[id(result)])
        if fill is None or exact_fill is None or torch.tensor(exact_fill, dtype=result.dtype).item() != fill:
            return fill
        return exact_fill

    def _size_read(self, name: str, arguments: tuple, result: Any) -> Any:
        """A size query's result; a value read when the tensor's size came from values."""
        if name in SIZES and any(id(value) in self.value_shaped for value in _tensors(arguments, {})):
            self._value_read("size of values", sys._getframe(2))
        if name in SIZES and arguments and isinstance(arguments[0], torch.Tensor) and by_user(sys._getframe(2)):
            self._sizes_read.append(arguments[0])
            index = self._size_index.setdefault(id(arguments[0]), len(self.size_tensors))
            if index == len(self.size_tensors):
                self.size_tensors.append(arguments[0])
            return sizes.traced(index, arguments[0], name, arguments, result)  # ints that carry their dims
        return result

    def _value_read(self, name: str, frame, integers: bool = False) -> None:
        """Keep a value read, unless torch's own code made it (BatchNorm's ``float(num_batches_tracked)``)."""
        while frame is not None and frame.f_code.co_filename.startswith(DISPATCH_FILES):
            frame = frame.f_back
        if frame is None or os.path.realpath(frame.f_code.co_filename).startswith(TORCH_DIR):
            return
        self.value_reads.append(ValueRead(name, user_line(frame), self._module()[0], integers))


def _fill(tensor: torch.Tensor) -> float | None:
    """The one value every entry of ``tensor`` holds, or None (empty, or several values)."""
    if tensor.numel() == 0 or tensor.is_complex() or tensor.dtype == torch.bool:
        return None
    flat = tensor.detach().reshape(-1)
    first = flat[0].item()
    if not bool((flat == first).all()) or not math.isfinite(first):
        return None
    return first


def _copied(value: Any) -> Any:
    """Lists, tuples and dicts copied (the items themselves not): ``torch.cat(features)`` keeps the list it was
    given, not what ``features.append(...)`` makes of it later."""
    if isinstance(value, list):
        return [_copied(item) for item in value]
    if type(value) is tuple:
        return tuple(_copied(item) for item in value)
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    return value


def _tensors(arguments, keywords):
    """The tensors among arguments, inside lists, tuples and dicts too."""
    for value in [*arguments, *keywords.values()]:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensors(value, {})
        elif isinstance(value, dict):
            yield from _tensors((), value)


def _masks(index: tuple) -> bool:
    """Whether an index holds a boolean tensor (``x[x > 0]``)."""
    return any(value.dtype == torch.bool for value in _tensors(index, {}))


def _is_value(result: Any) -> bool:
    """Whether a call's result is a Python value rather than tensors: ``torch.equal``'s bool, ``allclose``."""
    if isinstance(result, (bool, int, float, complex)):
        return True
    return type(result).__module__ == "numpy"
