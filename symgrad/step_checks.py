"""The refusals a bound step (``binding.Guard``, both forms) makes at each call, before anything
moves: the model as bound (submodules, hyper-parameters, hooks), every mode as traced, the values the
forward read, every tensor that requires grad given its gradient, devices, static sizes, and the sizes
on meta tensors. :class:`StepChecks` reads what ``Guard._setup`` set."""

from __future__ import annotations

import torch

from .call_guards import first_changed
from .fast_checks import Snapshot, module_paths
from .generated_module import BindError, SizeChecks, name_of
from .guards import MISSING, shown
from .modes import mode_refusal
from .retrace import retrace


class StepChecks:
    """The per-call checks of :class:`symgrad.binding.Guard`, each raising its one-line refusal."""

    def _check_autocast(self, data: dict) -> None:
        """A call under the caller's autocast, where the model turns it off for a region of its own
        (``symgrad.trace.autocast_regions.autocast_region``: a rotary embedding's cos and sin in float32) or asks whether
        it is on (``autocast_read``: transformers' ``maybe_autocast``, which opens its region only then), refused
        in one line naming the first such place: the model runs the region's ops in its own precision, or takes
        another branch, and the explicit step follows the trace, made without autocast. The device in the
        guards is the one traced on, which code reading ``x.device.type`` changes with the data, so autocast on
        for the data's devices is refused too."""
        devices = dict.fromkeys(device for _, device, _ in self._autocast_guards)
        devices.update(dict.fromkeys(value.device.type for value in data.values() if isinstance(value, torch.Tensor)))
        turned_on = [device for device in devices if _autocast_on(device)]
        if not turned_on:
            return
        where, device, asks = self._autocast_guards[0]
        if asks:
            does = f'asks whether autocast is on there (torch.is_autocast_enabled("{device}")), off when traced'
            differs = "where the model may take another branch than the one traced"
        else:
            does = f'turns autocast off there (torch.autocast("{device}", enabled=False))'
            differs = "where the explicit step would run the region's ops in autocast's dtype and the model in its own"
        raise BindError(
            f"{where}: error: the model {does}, and this call of {name_of(self.generated)} runs under the caller's "
            f"{turned_on[0]} autocast, {differs} (fix: call the step outside torch.autocast, in the model's "
            "precision)"
        )

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
        elif self._snapshot.unchanged_from(self.model):  # each module reached from the model alone: guarded once
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
        for path, module, names in self._owned:
            added = [name for name in module._modules if name not in names]
            if added:
                raise BindError(
                    f"{name_of(self.generated)}: a submodule {added[0]} was added to {path or 'the model'} "
                    f"({type(module).__name__}) after bind, and the bound step runs what was traced (fix: remove "
                    f"it, or trace and generate the changed model: {retrace(self.generated, self.model)})"
                )
        changed, refreshed = first_changed(self._hypers)  # symgrad.guards: dicts, lists, partials by value
        if refreshed:  # an equal value made anew (a partial): compared as it is now from here on
            self._snapshot = Snapshot(self._children, self._hypers, self._moded, module_paths(self.model), self._owned)
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
            raise ValueError(first_line(error)) from None
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
                    f"{name_of(self.generated)} cannot take {shapes}: {first_line(error)} "
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


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def _autocast_on(device: str) -> bool:
    """Whether autocast is on for ``device`` (a device type autocast does not know: off)."""
    try:
        return torch.is_autocast_enabled(device)
    except RuntimeError:
        return False
