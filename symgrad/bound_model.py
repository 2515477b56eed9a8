"""The model itself, run by its generated explicit gradients: ``fast = symgrad.bind(module, model)``.

For a module generated from a spec that ends in outputs (``symgrad trace model.py:Net --input ...``
without ``--loss``), ``bind`` returns a :class:`BoundModel`: an ``nn.Module`` called as the model is
called, returning what ``model.forward`` returns (a tensor, a tuple, a list, a dict, a namedtuple or a
``ModelOutput``-like dict subclass: :mod:`symgrad.output_types`), computed by the
generated forward. Its backward is one ``autograd.Function`` (``outputs_with_explicit_backward``)
whose backward runs the generated explicit backward from the outputs' cotangents and fills the
model's ``.grad``. Everything after the outputs is the user's, in plain autograd::

    fast = symgrad.bind(net_gradients, model)
    logits, aux = fast(images)
    loss = F.cross_entropy(logits, labels, label_smoothing=0.1) + 0.4 * F.cross_entropy(aux, labels)
    loss.backward()                      # explicit backward from d loss / d outputs
    optimizer.step()

It follows the model's modes at every call: where the model was traced in both modes (the generated
module names its eval-mode sibling in ``EVAL_MODULE``), ``model.eval()`` runs the sibling
(BatchNorm's running statistics, no dropout, the eval-mode outputs), and the model in the modes it
was traced in (``model.train(); model.backbone.eval()``: a frozen backbone) runs the train-mode
module; any other combination of submodule modes is refused, naming the submodules whose mode
differs. In training mode BatchNorm's running statistics and ``num_batches_tracked`` move exactly as
the model's own forward moves them.

Every call makes the checks of the loss-ending form (:class:`symgrad.binding.Bound`, shared through
``binding.Guard``), against the module that serves the model's current mode: the model as bound
(submodules, hyper-parameters), each BatchNorm and dropout in the mode that module was traced in, an
input outside wrt or a parameter frozen when traced that requires grad (refused: it would get no
gradient), devices, and the sizes on meta tensors first, so a call the model refuses (PyTorch's own
ValueError for one value per channel) moves no buffer; ``num_batches_tracked`` moves once the forward
ran. Under ``torch.compile`` the meta-tensor size check is skipped (dynamo cannot trace its dispatch
mode). ``copy.deepcopy``, ``pickle`` and ``torch.save`` work: the generated modules are kept by file
or import name, and bound again, with every check, when unpickled.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import warnings
from pathlib import Path
from types import ModuleType

import torch

from .binding import CHECKPOINT_STOP, Bound, Guard
from .call_guards import ArgumentGuard
from .fingerprint import forward_hooks
from .generated_module import BindError, generated_reference, load_generated, name_of
from .output_types import rebuilder
from .retrace import retrace


class _Mode(Guard):
    """One generated module (of one mode) bound to the model's tensors, with the checks of
    :class:`symgrad.binding.Bound` at every call (``Guard``)."""

    _ENTRY = "outputs_with_explicit_backward"

    def __init__(self, generated: ModuleType, model: torch.nn.Module, allow_edited: bool = False):
        self.model = model
        self.allow_edited = allow_edited
        self._setup(generated)
        self.arguments = ArgumentGuard(
            (getattr(generated, "GUARDS", None) or {}).get("arguments", {}),
            inspect.signature(model.forward),
            self.data_arguments,
        )
        """The forward's non-tensor arguments as traced, and its optional tensors (``symgrad.guards``)."""
        traced = {training for _, _, training in self._modes}  # no BatchNorm: its dropouts' mode, as traced
        self.training = self._traced_training if self._traced_training is not None or len(traced) != 1 else traced.pop()
        """The BatchNorm mode it was traced in; None: it has no BatchNorm, and serves either mode."""
        self.watches_modes = self._snapshot.watches_modes
        try:
            guards = getattr(generated, "GUARDS", None) or {}
            self.container = rebuilder(guards.get("output"), model, name_of(generated))
        except LookupError as error:
            raise BindError(str(error)) from None
        """The model's own container of the outputs (a list, a namedtuple, a ModelOutput), or None."""

    def serves(self) -> bool:
        """Whether the model is in the modes this module was traced in: each submodule that reads its mode
        in the mode it was traced in (the fingerprint's), else the root in the traced BatchNorm mode."""
        if self.watches_modes:
            return self._snapshot.modes_unchanged(self.model)
        return self.training is None or self.training == self.model.training

    def __call__(self, data: dict[str, torch.Tensor]):
        arguments, params, previous = self._checked_arguments(data)
        # under torch.inference_mode nothing is differentiated, and its tensors have no version
        # counter for the autograd Function to keep: the plain forward computes (and moves) the same
        # (asked outside torch.compile alone: dynamo cannot trace the question, a graph break)
        inference = not torch.compiler.is_compiling() and torch.is_inference_mode_enabled()
        entry = self.generated.forward if inference else self.generated.outputs_with_explicit_backward
        try:
            outputs = entry(**data, params=params)
        except CHECKPOINT_STOP:  # checkpoint's recomputation stopped early: the forward ran whole
            self._moved(arguments, previous)
            raise
        self._moved(arguments, previous)  # as nn.BatchNorm's forward moves its buffers, once the forward ran
        kind, keys = self.generated.OUTPUTS_KIND, self.generated.OUTPUTS
        if self.container is not None and kind != "tensor":
            return self.container(kind, outputs, keys)
        if kind == "tensor":
            return outputs[0]
        if kind == "dict":
            return dict(zip(keys, outputs))
        return tuple(outputs)


class BoundModel(torch.nn.Module):
    """``model`` run by its generated explicit gradients, returning what ``model.forward`` returns;
    see :mod:`symgrad.bound_model`."""

    def __init__(
        self,
        generated: ModuleType,
        model: torch.nn.Module,
        eval_module: ModuleType | None = None,
        allow_edited: bool = False,
    ):
        super().__init__()
        self.model = model
        self.allow_edited = allow_edited
        self._build(generated, eval_module)
        self._references = [generated_reference(mode.generated) for mode in self._modes]
        self._signature = inspect.signature(model.forward)
        self._positional = _positional(self._signature)

    def _build(self, generated: ModuleType, eval_module: ModuleType | None = None) -> None:
        """Each mode's module bound to the model, with every check (run again when unpickled)."""
        model, allow_edited = self.model, self.allow_edited
        self.generated = generated
        modes = [_Mode(generated, model, allow_edited)]
        eval_name = getattr(generated, "EVAL_MODULE", None)
        if eval_module is None and eval_name is not None:
            where = getattr(generated, "__file__", None)
            path = Path(where).with_name(f"{eval_name}.py") if where else None
            if path is None or not path.is_file():
                raise BindError(
                    f"{name_of(generated)} names its eval-mode module {eval_name}, and there is no "
                    f"{path or eval_name + '.py'} beside it (fix: symgrad generate the eval spec that "
                    "symgrad trace wrote beside the train spec into the same folder, and bind by path)"
                )
            eval_module = load_generated(path, allow_edited)
        if eval_module is not None:
            modes.append(_Mode(eval_module, model, allow_edited))
            modes[0].training, modes[1].training = True, False
        self._modes = modes

    def __getstate__(self):
        for mode, reference in zip(self._modes, self._references):
            if reference is None:
                raise BindError(
                    f"{name_of(mode.generated)} was not loaded from a file, so a copy of the bound model "
                    "cannot find it again (fix: bind the generated file's path, "
                    "symgrad.bind('generated/NAME.py', model))"
                )
        state = dict(self.__dict__)
        state["generated"] = state["_modes"] = state["_signature"] = None
        return state

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)
        modules = [
            load_generated(Path(where), self.allow_edited) if kind == "path" else importlib.import_module(where)
            for kind, where in self._references
        ]
        self._build(modules[0], modules[1] if len(modules) > 1 else None)
        self._signature = inspect.signature(self.model.forward)
        self._positional = _positional(self._signature)

    def __deepcopy__(self, memo):
        for mode in self._modes:  # a module is shared, as copy.deepcopy shares functions
            memo[id(mode.generated)] = mode.generated
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        copied.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return copied

    def forward(self, *args, **kwargs):
        """What ``model(*args, **kwargs)`` returns, computed by the generated forward of the model's
        current mode; a backward through it runs the explicit gradients."""
        fast = self._positional is not None and not kwargs and len(args) == len(self._positional)
        arguments = dict(zip(self._positional, args)) if fast else None
        mode = None if arguments is None else self._mode()  # the common call, fast(images): by position alone
        if mode is None or any(name not in arguments for name in mode.data_arguments):
            try:
                bound = self._signature.bind(*args, **kwargs)
            except TypeError as error:
                raise TypeError(f"{type(self.model).__name__}.forward: {error}") from None
            bound.apply_defaults()
            arguments, mode = bound.arguments, self._mode()
        missing = [name for name in mode.data_arguments if name not in arguments]
        if missing:
            raise TypeError(
                f"{name_of(mode.generated)} takes the data arguments {', '.join(mode.data_arguments)}; "
                f"missing: {', '.join(missing)}"
            )
        problem = mode.arguments.problem(arguments)
        if problem:  # the generated code computes what was traced: another argument would be ignored
            text, change = problem
            again = (
                f", or trace and generate it so: {retrace(mode.generated, self.model, change=change)}" if change else ""
            )
            raise BindError(f"{name_of(mode.generated)}: {text}{again})")
        return mode({name: arguments[name] for name in mode.data_arguments})

    def check_unchanged(self) -> None:
        """The checks a replayed CUDA graph (:mod:`symgrad.cuda_graph`) does not run, for the model's current mode."""
        self._mode().check_unchanged()

    def serving(self) -> int:
        """Which generated module serves the model's modes now (:meth:`_mode`), by its place: a CUDA graph's
        key, as two combinations of modes with the root in one mode may run two modules."""
        return self._modes.index(self._mode())

    def _mode(self) -> _Mode:
        """The module whose traced modes the model's submodules are in now (a frozen backbone in a training
        model: the train-mode module traced so); where none is, the one its checks refuse with, naming the
        submodules whose mode differs: the module of the root's mode, or the one module that records modes."""
        training = self.model.training
        for mode in self._modes:  # the root's mode's module first: most calls look at one
            if (mode.training is None or mode.training == training) and mode.serves():
                return mode
        for mode in self._modes:
            if mode.serves():
                return mode
        for mode in self._modes:
            if mode.training is None or mode.training == training:
                return mode
        if len(self._modes) == 1 and self._modes[0].watches_modes:
            return self._modes[0]
        traced = "train" if self._modes[0].training else "eval"
        raise BindError(
            f"{name_of(self.generated)} was traced in {traced} mode only, and the model is now in "
            f"{'train' if training else 'eval'} mode (fix: call model.{traced}(), or trace without "
            "--eval/--train so that symgrad traces both modes)"
        )


def _positional(signature: inspect.Signature) -> tuple[str, ...] | None:
    """The names of the parameters ``signature`` takes by position: a call that gives each of them by
    position and nothing by keyword names its arguments as ``Signature.bind`` would, without its
    cost (1.4 µs against 0.2 for a one-argument forward, measured on this 2-core machine). None where
    a keyword-only parameter has no default: a call by position alone must fail there, as bind does."""
    parameters = signature.parameters.values()
    if any(
        parameter.kind is parameter.KEYWORD_ONLY and parameter.default is parameter.empty for parameter in parameters
    ):
        return None
    return tuple(
        parameter.name
        for parameter in parameters
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
    )


def bind(
    generated: ModuleType | str | Path,
    model: torch.nn.Module,
    *,
    allow_edited: bool = False,
    cuda_graph: bool = False,
    verify: bool = True,
) -> torch.nn.Module:
    """The training step of ``model`` with the explicit gradients of ``generated`` (the module written
    by ``symgrad generate`` for a spec ``symgrad trace`` made from this model's class, or its path).

    Returns an ``nn.Module``: call it with the data arguments by keyword (``step(x=images,
    target=labels)``) to get the loss; ``.backward()`` fills ``.grad`` of the model's parameters.
    Raises :class:`BindError` when the model differs from the one traced (its submodules' classes,
    code, hyper-parameters, parameter names and shapes: the module's ``FINGERPRINT``), and when the
    generated file was edited by hand (its header's hash; ``allow_edited=True`` binds it anyway, and
    a module without a fingerprint unchecked). ``cuda_graph=True``: on CUDA, each set of data shapes is
    captured once and replayed as CUDA graphs (:mod:`symgrad.cuda_graph`); elsewhere it runs as without.
    ``verify=True``, the default (a module that ends in outputs): a float64 copy of the model is run
    once through the bound module and through autograd at small sizes, from one seed, and a
    difference in its outputs, gradients, buffers or random state refuses (:mod:`symgrad.verify`).
    It costs one small float64 step of the model (``BENCHMARKS.md``). ``verify=False`` skips it: a
    model that differs from the trace where no guard looks (a function reached only through a C
    extension, a value read through an object the trace could not name, a file edited by hand and
    bound with ``allow_edited``) then trains unchecked.

    Here, above both bound forms: a module that ends in outputs binds as :class:`BoundModel`, one that
    ends in a loss as :class:`symgrad.binding.Bound`.
    """
    if isinstance(generated, (str, Path)):
        generated = load_generated(Path(generated), allow_edited)
    if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        raise BindError(
            f"bind the model itself, then wrap the result: {type(model).__name__}(symgrad.bind(module, model))"
        )
    if hasattr(generated, "OUTPUTS"):  # a spec that ends in outputs: the model itself (symgrad.bound_model)
        bound = BoundModel(generated, model, allow_edited=allow_edited)
        if verify:
            from .verify import verify_binding

            verify_binding(bound)
    else:
        bound = Bound(generated, model, allow_edited)
    hooked = [path for path, module in model.named_modules() if forward_hooks(module)]
    if hooked:
        warnings.warn(
            f"symgrad.bind: {', '.join(hooked[:3])}{' and others' if len(hooked) > 3 else ''} ran forward "
            "hooks when traced: the bound step runs what they computed then, not the hooks (their side "
            "effects, such as storing an output, do not happen)",
            stacklevel=2,
        )
    if cuda_graph:
        from .cuda_graph import GraphedStep

        return GraphedStep(bound)
    return bound
