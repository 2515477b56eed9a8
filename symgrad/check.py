"""Verification of generated modules against ``torch.autograd``.

The reference forward here does not use the printers: it calls each op by its own
``torch.nn.functional`` (or ``torch``) name with the spec's arguments, so a printing mistake in the
generated forward cannot hide a gradient mistake.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import types
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .graph import Graph


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


def reference_forward(graph: Graph, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The spec's loss, computed op by op by PyTorch's own functions."""
    return reference_values(graph, inputs)["loss"]


def reference_values(graph: Graph, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every node's value, computed op by op by PyTorch's own functions (never the printers)."""
    values = dict(inputs)
    for node in graph.nodes.values():
        if node.kind == "input":
            continue
        arguments = {operand: values[source] for operand, source in node.operands.items()}
        arguments.update({operand.name: None for operand in node.rule.operands  # absent optional tensors
                          if operand.optional and operand.name not in arguments})
        arguments.update({name: float(value) for name, value in node.constants.items()})
        if node.kind == "loss":
            prediction, target = arguments["input"], arguments["target"]
            params = {key: float(value) for key, value in node.params.items() if key != "reduction"}
            if getattr(node.rule, "class_targets", False):
                per_element = getattr(F, node.rule.op)(prediction, target, reduction="none")
            elif node.rule.op == "half_sq_error":
                per_element = 0.5 * (prediction - target) ** 2
            else:  # PyTorch's own loss, unreduced
                per_element = getattr(F, node.rule.op)(prediction, target, reduction="none", **params)
            reduction = node.params["reduction"]
            if reduction == "per_sample":
                values[node.name] = per_element.flatten(1).sum(1) if per_element.dim() > 1 else per_element
            else:
                values[node.name] = getattr(per_element, reduction)()
            continue
        function = getattr(F, node.rule.op, None) or getattr(torch, node.rule.op)
        params = {key: float(value) if hasattr(value, "is_number") else value
                  for key, value in node.rule.reference_params(node.params).items()
                  if value is not None}  # unset options (divisor_override) stay implicit
        with warnings.catch_warnings():  # PyTorch's note that asymmetric 'same' copies the input: known, and fine
            warnings.filterwarnings("ignore", message="Using padding='same'")
            values[node.name] = function(**arguments, **params) if node.rule.op not in METHODS else \
                METHODS[node.rule.op](**arguments, **params)
    return values


# ops that PyTorch spells as tensor methods, called here with their spec argument names
METHODS = {"reshape": lambda input, shape: input.reshape(shape), "permute": lambda input, dims: input.permute(dims),
           "cat": lambda dim, **tensors: torch.cat([tensors[f"tensors_{i}"] for i in range(len(tensors))], dim=dim)}


def random_inputs(shapes: dict[str, tuple[int, ...]], wrt, dtype=torch.float64, seed: int = 0,
                  classes: dict[str, int] | None = None):
    """Normal random floats; class indices below ``classes[name]`` for int64 inputs."""
    generator = torch.Generator().manual_seed(seed)
    classes = classes or {}
    return {name: (torch.randint(0, classes[name], shape, generator=generator) if name in classes
                   else torch.randn(shape, dtype=dtype, generator=generator).requires_grad_(name in wrt))
            for name, shape in shapes.items()}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30)).item()


@dataclass
class Verification:
    forward_error: float
    """Generated forward vs the reference forward."""
    gradient_errors: dict[str, float]
    """Max relative error of each gradient vs autograd on the reference forward, float64, random cotangent."""

    def worst(self) -> float:
        return max([self.forward_error, *self.gradient_errors.values()])


def verify(graph: Graph, module: types.ModuleType, shapes: list[dict[str, tuple[int, ...]]], seed: int = 0) -> Verification:
    forward_error, errors = 0.0, {name: 0.0 for name in graph.wrt}
    for index, shape_set in enumerate(shapes):
        require_memory(graph, shape_set, 8, "the float64 test shapes")
        inputs = random_inputs(shape_set, graph.wrt, seed=seed + index, classes=graph.class_counts(shape_set))
        reference = reference_forward(graph, inputs)
        forward_error = max(forward_error, relative_error(module.forward(**inputs), reference))
        cotangent = torch.randn(reference.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 100))
        expected = torch.autograd.grad(reference, [inputs[name] for name in graph.wrt], grad_outputs=cotangent)
        actual = module.gradients(**inputs, grad_loss=cotangent)
        for name, reference_gradient in zip(graph.wrt, expected):
            errors[name] = max(errors[name], relative_error(getattr(actual, name), reference_gradient))
    return Verification(forward_error, errors)


def _through_explicit_backward(graph: Graph, module, shapes, seed: int):
    inputs = random_inputs(shapes, graph.wrt, seed=seed, classes=graph.class_counts(shapes))
    fixed = {name: value.detach() for name, value in inputs.items() if name not in graph.wrt}

    def loss(*values):
        return module.loss_with_explicit_backward(**fixed, **dict(zip(graph.wrt, values)))

    return loss, [inputs[name] for name in graph.wrt]


def available_memory() -> int:
    """Bytes this process can still allocate: MemAvailable on Linux, else the physical memory."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def require_memory(graph: Graph, shapes: dict[str, tuple[int, ...]], bytes_per_entry: int, where: str) -> None:
    """Refuse, in one line, a check whose tensors cannot fit: every node's value and gradient, twice
    over (ours and autograd's reference), at ``bytes_per_entry`` (8 in float64, 4 in float32)."""
    from .errors import SymgradError

    at_shapes = graph.with_input_shapes(shapes)
    entries = sum(math.prod(node.shape) for node in at_shapes.nodes.values())
    needed = 4 * entries * bytes_per_entry
    free = available_memory()
    if needed > free:
        raise SymgradError(f"error: checking {graph.spec.name} at {where} needs about {needed / 2**30:.1f} GiB, "
                           f"and {free / 2**30:.1f} GiB is available (fix: use smaller example shapes in the spec, "
                           "or pass --float32-shapes small)")


def accuracy_table(graph: Graph, module, shapes64, shapes32) -> list[tuple[str, ...]]:
    """Rows of: gradient, float64 error vs autograd, our float32 error vs float64, autograd's float32
    error vs float64, gradcheck, gradgradcheck. The float32 columns answer "does the explicit form
    accumulate more rounding error than autograd?" with numbers."""
    report = verify(graph, module, shapes64)
    require_memory(graph, shapes32, 8, "the float32 shapes")  # the exact reference is float64
    inputs64 = random_inputs(shapes32, graph.wrt, seed=21, classes=graph.class_counts(shapes32))
    inputs32 = {name: (value.detach().float() if value.is_floating_point() else value).requires_grad_(name in graph.wrt)
                for name, value in inputs64.items()}
    loss64 = reference_forward(graph, inputs64)
    cotangent = torch.rand(loss64.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(22)) + 0.5
    exact = torch.autograd.grad(loss64, [inputs64[name] for name in graph.wrt], cotangent)
    ours32 = module.gradients(**inputs32, grad_loss=cotangent.float())
    autograd32 = torch.autograd.grad(reference_forward(graph, inputs32), [inputs32[name] for name in graph.wrt],
                                     cotangent.float())
    checks = {}
    for kind, check in (("gradcheck", torch.autograd.gradcheck), ("gradgradcheck", torch.autograd.gradgradcheck)):
        loss, values = _through_explicit_backward(graph, module, shapes64[0], seed=23)
        try:
            checks[kind] = "pass" if check(loss, values, fast_mode=True) else "FAIL"
        except RuntimeError as error:  # gradcheck raises on mismatch
            checks[kind] = f"FAIL ({str(error).splitlines()[0][:60]})"

    def norm_error(actual, expected):
        return ((actual.double() - expected).norm() / expected.norm().clamp_min(1e-300)).item()

    rows = []
    for index, name in enumerate(graph.wrt):
        rows.append((name, f"{report.gradient_errors[name]:.1e}", f"{norm_error(getattr(ours32, name), exact[index]):.1e}",
                     f"{norm_error(autograd32[index], exact[index]):.1e}", checks["gradcheck"], checks["gradgradcheck"]))
    return rows
