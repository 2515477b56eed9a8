"""The binding checked on the user's own model: ``symgrad.bind(module, model, verify=True)`` runs one float64
forward and backward of a copy of the model at small sizes (the module's ``SMALL_INPUTS``) through the bound
module and through autograd, from one seed, and compares what each left: the outputs, every parameter's
gradient (None where autograd leaves it None), every buffer (running statistics, counters) and the random
state after the call (the same masks drawn by the same calls). A difference refuses the binding, naming it.

The guards (``symgrad.guards``) check what the trace read; this checks what the binding computes, on
the model as the user has it (its modes, its submodules' classes and code as they are now), so it
catches what no guard names. It is a check at one set of sizes, of one mode (the model's at bind),
in float64 on the CPU (a CUDA model's copy too). Buffers are compared as the forward leaves them:
autograd's recomputation of a checkpointed BatchNorm moves its statistics a second time in the
backward, which the bound step does not (a limit of ``torch.utils.checkpoint``, not the model's
computation), and is not counted.

It is on by default. ``bind(..., verify=False)`` skips it; then unchecked are: a model that differs
from the trace in a way the guards and the fingerprint do not see (the code of a function reached
only through a C extension, a value read through an object the trace could not name, a generated
file edited by hand and bound with ``allow_edited=True``), which trains on the generated code's
numbers with no error. A module generated without ``SMALL_INPUTS`` (an older symgrad), one that ends
in a loss (its loss is symgrad's, not the model's), a model that cannot be copied or does not run in
float64 (a warning says so), and a model on a device other than the CPU or CUDA are not checked
here.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings

import torch

from .call_guards import traced_arguments
from .testdata import relative_errors

SEED = 0
TOLERANCE = 1e-8
"""The largest relative difference (``testdata.relative_errors``, max norm) taken as the same number: float64
rounding of two orders of the same sums is near 1e-15; a wrong formula or a stale value is off by far more."""


def verify_binding(bound) -> None:
    """Refuse ``bound`` (a :class:`symgrad.bound_model.BoundModel`) where a float64 copy of its model, run
    through it and through autograd from one seed at ``SMALL_INPUTS``, differs; see the module docstring."""
    from .generated_module import BindError, name_of

    generated, model = bound.generated, bound.model
    small = getattr(generated, "SMALL_INPUTS", None)
    if not small:
        return
    static = (getattr(generated, "GUARDS", None) or {}).get("sizes") or {}  # traced with static sizes: those alone
    small = {name: (static.get(name, shape), classes) for name, (shape, classes) in small.items()}
    tensors = [*model.parameters(), *model.buffers()]
    if any(tensor.device.type not in ("cpu", "cuda") for tensor in tensors):
        return
    # on the CPU, where the generated code draws the model's masks bit for bit (CUDA's F.dropout draws
    # with a fused kernel of its own: every model with dropout would differ there); a CUDA model's
    # tensors are copied to the CPU one by one, never twice on the GPU
    device, cuda = torch.device("cpu"), []
    shapes = ", ".join(f"{name} {list(shape)}" for name, (shape, _) in small.items())
    with torch.random.fork_rng(devices=cuda):
        try:  # one copy, run by autograd, then put back as it was and run by the bound module
            reference = _cpu_copy(model).double()
            buffers = {name: value.clone() for name, value in reference.named_buffers()}
        except Exception as error:  # noqa: BLE001 - a model copy cannot make (a handle, a lock): not checked
            warnings.warn(
                f"symgrad.bind: {type(model).__name__} could not be copied to check the binding "
                f"({type(error).__name__}: {error}); it is bound unchecked",
                stacklevel=3,
            )
            return
        data = {**_inputs(small, device), **traced_arguments(generated, model)}  # --arg values, as traced
        try:
            theirs = _run(reference, data, cuda)
        except Exception as error:  # noqa: BLE001 - the model itself does not run in float64: nothing to compare
            warnings.warn(
                f"symgrad.bind: a float64 copy of {type(model).__name__} does not run at {shapes} "
                f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); the "
                "binding is not checked on it",
                stacklevel=3,
            )
            return
        theirs["gradients"] = {
            name: None if value is None else value.clone() for name, value in theirs["gradients"].items()
        }
        theirs["after"] = {name: value.clone() for name, value in theirs["after"].items()}
        with torch.no_grad():
            for name, value in reference.named_buffers():
                value.copy_(buffers[name])
        for parameter in reference.parameters():
            parameter.grad = None
        eval_module = bound._modes[1].generated if len(bound._modes) > 1 else None
        try:
            fast = type(bound)(generated, reference, eval_module=eval_module, allow_edited=bound.allow_edited)
            ours = _run(fast, data, cuda)
        except BindError:
            raise
        except Exception as error:  # noqa: BLE001 - where the model runs, the bound one must
            problem = f"it raised {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        else:
            problem = _difference(ours, theirs)
    if problem:
        raise BindError(
            f"{name_of(generated)} does not compute what {type(model).__name__} computes: on a float64 "
            f"copy at {shapes} (seed {SEED}), {problem} (fix: trace and generate the model again, "
            f"{_retrace(generated, model)}; bind(..., verify=False) binds it unchecked)"
        )


def _cpu_copy(model: torch.nn.Module) -> torch.nn.Module:
    """``copy.deepcopy(model)`` with its parameters and buffers copied to the CPU (as Parameters
    that require grad as the model's do)."""
    memo: dict[int, object] = {}
    for parameter in model.parameters():
        memo[id(parameter)] = torch.nn.Parameter(
            parameter.detach().to("cpu", copy=True), requires_grad=parameter.requires_grad
        )
    for buffer in model.buffers():
        memo[id(buffer)] = buffer.detach().to("cpu", copy=True)
    return copy.deepcopy(model, memo)


def _inputs(small: dict, device: torch.device) -> dict:
    """The data inputs: float64 N(0, 1), an int64 one uniform below its class count, from a fixed seed."""
    generator = torch.Generator().manual_seed(SEED)
    data = {}
    for name, (shape, classes) in small.items():
        value = (
            torch.randint(0, classes, tuple(shape), generator=generator)
            if classes is not None
            else torch.randn(tuple(shape), dtype=torch.float64, generator=generator)
        )
        data[name] = value.to(device)
    return data


def _run(net, data: dict, cuda: list) -> dict:
    """One forward of ``net`` by keyword from the seed, one backward from fixed random cotangents: the
    outputs, the gradients and buffers of the model it runs, and the random state after."""
    model = getattr(net, "model", net)
    torch.manual_seed(SEED)
    outputs = _leaves(net(**data))
    moved = {name: value.clone() for name, value in model.named_buffers()}  # after the forward

    differentiable = [output for output in outputs.values() if output.requires_grad]
    generator = torch.Generator().manual_seed(SEED + 1)  # drawn apart: the random state is the model's alone
    cotangents = [
        torch.randn(output.shape, dtype=torch.float64, generator=generator).to(output) for output in differentiable
    ]
    if differentiable:
        torch.autograd.backward(differentiable, cotangents)
    state = [torch.get_rng_state()] + [torch.cuda.get_rng_state(device) for device in cuda]
    return {
        "outputs": {key: value.detach() for key, value in outputs.items()},
        "gradients": {name: value.grad for name, value in model.named_parameters()},
        "buffers": moved,
        "after": dict(model.named_buffers()),
        "random": state,
    }


def _leaves(result, prefix: str = "output") -> dict:
    """The tensors of a model's result by where they are (``output``, ``output[1]``, ``output['aux']``)."""
    if isinstance(result, torch.Tensor):
        return {prefix: result}
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        items = ((field.name, getattr(result, field.name)) for field in dataclasses.fields(result))
    elif isinstance(result, dict):
        items = result.items()
    elif isinstance(result, (tuple, list)):
        items = enumerate(result)
    else:
        return {}
    return {key: value for index, item in items for key, value in _leaves(item, f"{prefix}[{index!r}]").items()}


def _difference(ours: dict, theirs: dict) -> str | None:
    """What differs between two :func:`_run` results, in words; None where nothing does."""
    if set(ours["outputs"]) != set(theirs["outputs"]):
        return f"it returns {sorted(ours['outputs'])}, the model {sorted(theirs['outputs'])}"
    errors = _errors(ours["outputs"], theirs["outputs"])
    for name, error in errors.items():
        if not error <= TOLERANCE:
            return f"{name} differs by {error:.2g} (relative)"
    for name, expected in theirs["gradients"].items():
        actual = ours["gradients"].get(name)
        if (actual is None) != (expected is None):
            return (
                f"the gradient of {name} is "
                + ("None" if actual is None else "set")
                + ", autograd's "
                + ("None" if expected is None else "set")
            )
    present = {name: value for name, value in theirs["gradients"].items() if value is not None}
    mine = {name: ours["gradients"][name] for name in present}
    for name, error in _errors(mine, present).items():
        if not error <= TOLERANCE:
            return f"the gradient of {name} differs by {error:.2g} (relative)"
    for name, expected in theirs["buffers"].items():
        actual = ours["buffers"].get(name)
        if actual is None or actual.shape != expected.shape:
            return f"the buffer {name} is {'gone' if actual is None else list(actual.shape)}"
        if expected.is_floating_point():
            error = _errors({name: actual}, {name: expected})[name]
            if not error <= TOLERANCE:
                return f"the buffer {name} differs by {error:.2g} (relative) after the forward"
        elif not torch.equal(actual, expected):
            shown = actual.tolist() if actual.numel() < 5 else "other"
            return (
                f"the buffer {name} is {shown} after the forward, "
                f"the model's {expected.tolist() if expected.numel() < 5 else 'not'}"
            )
    # the bound backward moves no buffer; autograd's may (a checkpointed BatchNorm run again by
    # its recomputation), which is autograd's, not the model's
    for name, value in ours["after"].items():
        if (
            name in ours["buffers"]
            and not torch.equal(value, ours["buffers"][name])
            and not (name in theirs["after"] and torch.equal(value, theirs["after"][name]))
        ):
            return f"the buffer {name} moves in the backward"
    if not all(
        torch.equal(ours_state, their_state) for ours_state, their_state in zip(ours["random"], theirs["random"])
    ):
        return "the random state after the call differs (its random draws are not the model's)"
    return None


def _errors(ours: dict, theirs: dict) -> dict:
    """``testdata.relative_errors`` where the entries that are not finite (a mask's -inf, a NaN the
    model computes too) are the same in both, and measured on the finite rest; inf where they are
    not the same."""
    finite, apart = {}, set()
    for name, expected in theirs.items():
        actual = ours[name]
        if actual.shape != expected.shape:
            apart.add(name)
            continue
        wild = ~expected.isfinite()
        if bool(wild.any()) or not bool(actual.isfinite().all()):
            if not torch.equal(wild, ~actual.isfinite()) or not torch.equal(
                actual[wild].nan_to_num(), expected[wild].nan_to_num()
            ):
                apart.add(name)
                continue
            actual, expected = actual.masked_fill(wild, 0), expected.masked_fill(wild, 0)
        finite[name] = (actual, expected)
    errors = relative_errors(
        {name: pair[0] for name, pair in finite.items()}, {name: pair[1] for name, pair in finite.items()}
    )
    return {**errors, **dict.fromkeys(apart, float("inf"))}


def _retrace(generated, model) -> str:
    from .retrace import retrace

    try:
        return retrace(generated, model)
    except Exception:  # noqa: BLE001 - a spec that cannot be read: the command with what is known
        return f"symgrad trace FILE.py:{type(model).__name__} --input ... && symgrad generate SPEC"
