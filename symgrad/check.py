"""Verification of generated modules against ``torch.autograd``.

The reference forward here does not use the printers: it calls each op by its own
``torch.nn.functional`` (or ``torch``) name with the spec's arguments, so a printing mistake in the
generated forward cannot hide a gradient mistake.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import torch

from . import stale, testdata
from .callable_module import make_callable
from .graph import Graph
from .reference import reference_forward, seeded
from .roles import channels_last_inputs, graph_inputs
from .testdata import checked_subset, first_nonfinite, float32_acceptable, in_layout, make_inputs, relative_errors


def load_module(path: Path, name: str | None = None) -> types.ModuleType:
    """Import a generated file by path, without touching ``sys.path``."""
    name = name or f"_symgrad_generated_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return module


def module_from_source(source: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, f"<generated {name}>", "exec"), module.__dict__)
    return module


def random_inputs(
    shapes: dict[str, tuple[int, ...]], wrt, dtype=torch.float64, seed: int = 0, classes: dict[str, int] | None = None
):
    """Every float input N(0, 1), class indices for int64 inputs (``symgrad.testdata.make_inputs``
    with no roles); ``graph_inputs`` draws them by role."""
    return make_inputs(shapes, {}, wrt, dtype, seed, classes)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30)).item()


@dataclass
class Verification:
    forward_error: float
    """Generated forward vs the reference forward."""
    gradient_errors: dict[str, float]
    """Each gradient's error vs autograd on the reference forward (``symgrad.testdata``'s measure), float64."""
    problem: str | None = None
    """NaN or Inf in the forward, the reference or a result: a failure whatever the errors say."""

    def worst(self) -> float:
        return math.inf if self.problem else max([self.forward_error, *self.gradient_errors.values()])


def verify(
    graph: Graph,
    module: types.ModuleType,
    shapes: list[dict[str, tuple[int, ...]]],
    seed: int = 0,
    progress=lambda message: None,
) -> Verification:
    """Float64, random cotangent, inputs by role, at each of ``shapes`` and at shapes of at least 7x7
    spatially (:func:`symgrad.shapes.non_degenerate_shapes`: the smallest shapes alone give no kernel
    the layouts a larger map gives); ``progress`` hears each step. The gradients are computed from
    inputs that do not require grad, as a training step computes them (the fused kernels' own path)."""
    from .shapes import non_degenerate_shapes

    module = _viewed(by_name(module, graph))
    larger = non_degenerate_shapes(graph)
    if larger is not None and larger not in shapes:
        shapes = [*shapes, larger]
    for shape_set in shapes:  # a check that cannot fit says so before it starts
        require_memory(graph, shape_set, 8, "the float64 test shapes")
    forward_error, errors = 0.0, {name: 0.0 for name in graph.wrt}
    for index, shape_set in enumerate(shapes):
        progress(f"float64 against autograd at test shapes {index + 1} of {len(shapes)}")
        inputs = graph_inputs(graph, shape_set, seed=seed + index)
        reference = seeded(reference_forward, graph, inputs)  # dropout's masks: the same draws in each
        try:
            ours = seeded(module.forward, **inputs)
        except Exception as error:  # noqa: BLE001 - broken generated code is a failed check, not a crash
            return Verification(math.inf, errors, _raised("the generated forward", error))
        problem = first_nonfinite({"the reference forward (the loss)": reference, "the generated forward": ours})
        if problem:
            return Verification(math.inf, errors, problem)
        forward_error = max(forward_error, relative_errors({"loss": ours}, {"loss": reference})["loss"])
        cotangent = torch.randn(
            reference.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 100)
        )
        expected = dict(
            zip(graph.wrt, torch.autograd.grad(reference, [inputs[name] for name in graph.wrt], grad_outputs=cotangent))
        )
        try:
            actual = seeded(
                module.gradients, **{name: value.detach() for name, value in inputs.items()}, grad_loss=cotangent
            )
        except Exception as error:  # noqa: BLE001
            return Verification(forward_error, errors, _raised("the generated gradients", error))
        actual = {name: getattr(actual, name) for name in graph.wrt}
        shapes_wrong = [name for name in graph.wrt if actual[name].shape != expected[name].shape]
        if shapes_wrong:
            return Verification(
                forward_error,
                errors,
                f"the explicit gradient of {shapes_wrong[0]} has shape "
                f"{list(actual[shapes_wrong[0]].shape)}, not {list(expected[shapes_wrong[0]].shape)}",
            )
        problem = first_nonfinite(
            {
                **{f"autograd's gradient of {name}": value for name, value in expected.items()},
                **{f"the explicit gradient of {name}": value for name, value in actual.items()},
            }
        )
        if problem:
            return Verification(forward_error, errors, problem)
        for name, error in relative_errors(actual, expected).items():
            errors[name] = max(errors[name], error)
    return Verification(forward_error, errors)


def _viewed(module):
    """A module generated from a spec with ``outputs:``, seen as one ending in a loss (``outputs.LossView``)."""
    from .outputs import loss_view

    return loss_view(module)


def _raised(what: str, error: Exception) -> str:
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{what} raised {type(error).__name__}: {first[:200]}"


def through_explicit_backward(graph: Graph, module, shapes, seed: int):
    """The loss as a function of a bounded subset of the differentiated inputs (``checked_subset``),
    through ``loss_with_explicit_backward``: what gradcheck and gradgradcheck perturb, at a cost that
    does not grow with the number of weights. The other inputs are held fixed."""
    module = _viewed(by_name(module, graph))
    inputs = graph_inputs(graph, shapes, seed=seed)
    checked = checked_subset(list(graph.wrt))
    fixed = {name: value.detach() for name, value in inputs.items() if name not in checked}

    def loss(*values):
        return seeded(module.loss_with_explicit_backward, **fixed, **dict(zip(checked, values)))

    return loss, [inputs[name] for name in checked]


available_memory = testdata.available_memory  # one definition: the generated tests skip on the same estimate


def require_memory(graph: Graph, shapes: dict[str, tuple[int, ...]], bytes_per_entry: int, where: str) -> None:
    """Refuse, in one line, a check whose tensors cannot fit: every node's value and gradient, twice
    over (ours and autograd's reference), at ``bytes_per_entry`` (8 in float64, 4 in float32). The
    generated test skips its spec-shape check with the same words (``testdata.memory_shortfall``)."""
    from .errors import SymgradError

    at_shapes = graph.with_input_shapes(shapes)
    entries = sum(math.prod(node.shape) for node in at_shapes.nodes.values())
    problem = testdata.memory_shortfall(graph.spec.name, where, entries, bytes_per_entry)
    if problem:
        raise SymgradError(
            f"error: {problem} (fix: use smaller example shapes in the spec, or pass --float32-shapes small)"
        )


@dataclass
class AccuracyTable:
    rows: list[tuple[str, ...]]
    """gradient, float64 error, our float32 error, autograd's float32 error, gradcheck, gradgradcheck."""
    problems: list[str]
    """Why it failed, one line each; empty when every gradient is right."""


def accuracy_table(
    graph: Graph, module, shapes64, shapes32, progress=lambda message: None, tolerance: float = 1e-12
) -> AccuracyTable:
    """Every check of ``symgrad verify``. The float32 columns answer "does the explicit form
    accumulate more rounding error than autograd?" with numbers; see ``symgrad.testdata``."""
    require_memory(graph, shapes32, 8, "the float32 shapes")  # the exact reference is float64
    report = verify(graph, module, shapes64, progress=progress)
    problems = [report.problem] if report.problem else []
    problems += [
        f"gradient of {name}: float64 error {error:.1e} > {tolerance:.0e}"
        for name, error in report.gradient_errors.items()
        if not error <= tolerance
    ]
    progress("float32 against float64")
    inputs64 = graph_inputs(graph, shapes32, seed=21)
    inputs32 = {
        name: (value.detach().float() if value.is_floating_point() else value).requires_grad_(name in graph.wrt)
        for name, value in inputs64.items()
    }
    loss64 = seeded(reference_forward, graph, inputs64)
    cotangent = torch.rand(loss64.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(22)) + 0.5
    exact = dict(zip(graph.wrt, torch.autograd.grad(loss64, [inputs64[name] for name in graph.wrt], cotangent)))
    try:
        result = seeded(_viewed(by_name(module, graph)).gradients, **inputs32, grad_loss=cotangent.float())
        ours32 = {name: getattr(result, name) for name in graph.wrt}
        if any(ours32[name].shape != exact[name].shape for name in graph.wrt):
            raise ValueError("a gradient has the wrong shape")
    except Exception as error:  # noqa: BLE001 - broken generated code is a failed check: NaN columns
        problems.append(_raised("the generated float32 gradients", error))
        ours32 = {name: torch.full_like(exact[name], math.nan) for name in graph.wrt}
    # autograd on the kernels the generated code runs at these shapes
    moved = channels_last_inputs(graph, shapes={name: tuple(value.shape) for name, value in inputs32.items()})
    inputs32 = in_layout(inputs32, moved)
    loss32 = seeded(reference_forward, graph, inputs32)
    autograd32 = dict(
        zip(graph.wrt, torch.autograd.grad(loss32, [inputs32[name] for name in graph.wrt], cotangent.float()))
    )
    problem = first_nonfinite(
        {
            "the float64 forward": loss64,
            "the float32 forward": loss32,
            **{f"the explicit float32 gradient of {name}": value for name, value in ours32.items()},
        }
    )
    if problem:
        problems.append(problem)
    ours_error, autograd_error = relative_errors(ours32, exact, "2"), relative_errors(autograd32, exact, "2")
    problems += [
        f"gradient of {name}: float32 error {ours_error[name]:.1e}, autograd's {autograd_error[name]:.1e}"
        for name in graph.wrt
        if not float32_acceptable(ours_error[name], autograd_error[name])
    ]
    checks = {}
    for kind, check in (("gradcheck", torch.autograd.gradcheck), ("gradgradcheck", torch.autograd.gradgradcheck)):
        progress(f"{kind} of {', '.join(checked_subset(list(graph.wrt)))}")
        loss, values = through_explicit_backward(graph, module, shapes64[0], seed=23)
        try:
            with _mismatch_reported_without_slow_mode():
                checks[kind] = "pass" if check(loss, values, fast_mode=True) else "FAIL"
        except Exception as error:  # noqa: BLE001 - gradcheck raises on mismatch; broken code raises too
            checks[kind] = f"FAIL ({(str(error).splitlines() or [type(error).__name__])[0][:60]})"
        if checks[kind] != "pass":
            problems.append(f"{kind}: {checks[kind]}")
    rows = []
    for name in graph.wrt:
        rows.append(
            (
                name,
                f"{report.gradient_errors[name]:.1e}",
                f"{ours_error[name]:.1e}",
                f"{autograd_error[name]:.1e}",
                checks["gradcheck"],
                checks["gradgradcheck"],
            )
        )
    return AccuracyTable(rows, problems)


@contextlib.contextmanager
def _mismatch_reported_without_slow_mode():
    """gradcheck's fast mode, on a mismatch, recomputes both Jacobians in full only to print them (one
    forward per input entry: 100 s for the seed at its small shapes); the report keeps only the first line.
    Where torch no longer has that private step, the check is slower, never different."""
    gradcheck = importlib.import_module("torch.autograd.gradcheck")
    if not hasattr(gradcheck, "_run_slow_mode_and_get_error"):
        yield
        return
    original = gradcheck._run_slow_mode_and_get_error
    gradcheck._run_slow_mode_and_get_error = lambda *arguments: ""
    try:
        yield
    finally:
        gradcheck._run_slow_mode_and_get_error = original


class ByName:
    """A generated module called with every input by its spec name and each gradient read as an
    attribute, as the checks draw them (``symgrad verify``, ``generate --verify``): the inputs with a
    ``source:`` go in the ``params`` mapping, keyed as ``state_dict()``, the others by name."""

    def __init__(self, module, graph: Graph):
        self.module = module
        self.sources = {item.name: item.source for item in graph.spec.inputs if item.source}

    def __getattr__(self, name):  # the module's other names (Gradients, OUTPUTS, ...)
        if name == "module":
            raise AttributeError(name)
        return getattr(self.module, name)

    def _arguments(self, inputs: dict) -> dict:
        named = {name: value for name, value in inputs.items() if name not in self.sources}
        if self.sources:
            named["params"] = {self.sources[name]: inputs[name] for name in self.sources}
        return named

    def forward(self, **inputs):
        return self.module.forward(**self._arguments(inputs))

    def gradients(self, grad_loss=None, grad_outputs=None, **inputs):
        import types

        cotangent = dict(grad_loss=grad_loss) if grad_outputs is None else dict(grad_outputs=grad_outputs)
        result = self.module.gradients(**self._arguments(inputs), **cotangent)._asdict()
        params = result.pop("params", {})
        result.update({name: params[key] for name, key in self.sources.items() if key in params})
        return types.SimpleNamespace(**result)

    def loss_with_explicit_backward(self, recompute=False, **inputs):
        return self.module.loss_with_explicit_backward(**self._arguments(inputs), recompute=recompute)

    def outputs_with_explicit_backward(self, recompute=False, **inputs):
        return self.module.outputs_with_explicit_backward(**self._arguments(inputs), recompute=recompute)


def by_name(module, graph: Graph):
    """``module`` itself where its spec has no ``source:`` input (it takes every input by name), else
    a :class:`ByName` view of it (``graph``: its spec's graph, whose inputs say which come in ``params``)."""
    if isinstance(module, ByName) or not any(item.source for item in graph.spec.inputs):
        return module  # already called by name, or taking every input by name itself
    return ByName(module, graph)


make_callable(__name__, stale.check)  # symgrad.check("generated") compares generated files with their specs
