"""What the benchmark measures. Each case builds its inputs and a dict of variants to time."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
SEEDS = {"seed1": "seed1_strided_conv", "seed2": "seed2_conv_strided", "seed3": "seed3_conv_relu_conv"}
# the seed's shapes (batch 8, 128x128) and a small setting where per-op overhead dominates (batch 1, 32x32)
SMALL = {
    "seed1": {"x": (1, 1, 32, 32), "k": (512, 1, 32, 32), "y": (1, 512, 1, 1)},
    "seed2": {"x": (1, 32, 32, 32), "w1": (1, 32, 3, 3), "k": (512, 1, 32, 32), "y": (1, 512, 1, 1)},
    "seed3": {
        "x": (1, 32, 32, 32),
        "w1": (32, 32, 3, 3),
        "w2": (1, 32, 3, 3),
        "k": (512, 1, 32, 32),
        "y": (1, 512, 1, 1),
    },
}


def load_generated(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "generated" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def seed_shapes(seed: str, size: str) -> dict[str, tuple[int, ...]]:
    if size == "small":
        return SMALL[seed]
    from symgrad.spec import read_spec

    spec = read_spec(ROOT / "examples" / f"{SEEDS[seed]}.yaml")
    return {item.name: item.shape for item in spec.inputs}


def seed_wrt(seed: str) -> list[str]:
    from symgrad.spec import read_spec

    return [name for name, _ in read_spec(ROOT / "examples" / f"{SEEDS[seed]}.yaml").wrt]


def conv_flops(seed: str, shapes: dict[str, tuple[int, ...]]) -> int:
    """Multiply-adds x 2 of every convolution the gradient computation runs: each forward conv,
    plus one conv-sized product for each input or weight gradient it needs."""
    from symgrad.graph import build_graph
    from symgrad.spec import read_spec

    graph = build_graph(read_spec(ROOT / "examples" / f"{SEEDS[seed]}.yaml")).with_input_shapes(shapes)
    needs = graph.depends_on_wrt()
    total = 0
    for node in graph.nodes.values():
        if node.kind != "layer" or not node.rule.op.startswith("conv"):
            continue
        weight = graph.nodes[node.operands["weight"]].shape
        per_conv = 2 * node.shape[0] * node.shape[1]
        for size in node.shape[2:]:
            per_conv *= size
        for size in weight[1:]:
            per_conv *= size
        passes = 1 + (node.operands["input"] in needs) + (node.operands["weight"] in needs)
        total += passes * per_conv
    return total


def seed_variants(seed: str, size: str, device: str):
    module = load_generated(SEEDS[seed])
    shapes = seed_shapes(seed, size)
    wrt = seed_wrt(seed)
    generator = torch.Generator().manual_seed(0)
    inputs = {
        name: (
            torch.randn(shape, generator=generator) / (shape[1] * shape[-1] ** 2) ** 0.5
            if name not in ("x", "y")
            else torch.randn(shape, generator=generator)
        ).to(device)
        for name, shape in shapes.items()
    }
    autograd_inputs = {name: value.clone().requires_grad_(name in wrt) for name, value in inputs.items()}

    def autograd_grad():
        loss = module.forward(**autograd_inputs)
        return torch.autograd.grad(loss, [autograd_inputs[name] for name in wrt], torch.ones_like(loss))

    positions = [list(inputs).index(name) for name in wrt]

    def summed(*values):
        return module.forward(*values).sum()

    func_grad = torch.func.grad(summed, argnums=tuple(positions))
    ordered = list(inputs.values())

    channels_last = {
        name: (value.contiguous(memory_format=torch.channels_last) if value.dim() == 4 else value)
        .clone()
        .requires_grad_(name in wrt)
        for name, value in inputs.items()
    }

    def autograd_channels_last():
        loss = module.forward(**channels_last)
        return torch.autograd.grad(loss, [channels_last[name] for name in wrt], torch.ones_like(loss))

    channels_last_plain = {name: value.detach() for name, value in channels_last.items()}

    def backward_through(function):
        def run():
            loss = function(**autograd_inputs)
            loss.backward(torch.ones_like(loss))
            grads = [autograd_inputs[name].grad for name in wrt]
            for name in wrt:
                autograd_inputs[name].grad = None
            return grads

        return run

    variants = {
        "symgrad gradients": lambda: module.gradients(**inputs),
        "torch.autograd.grad": autograd_grad,
        "symgrad gradients, channels_last inputs": lambda: module.gradients(**channels_last_plain),
        "autograd.grad, channels_last inputs": autograd_channels_last,
        "torch.func.grad": lambda: func_grad(*ordered),
        "symgrad loss_with_explicit_backward().backward()": backward_through(module.loss_with_explicit_backward),
        "autograd loss.backward()": backward_through(module.forward),
    }
    return variants, conv_flops(seed, shapes)


def unrolled_variants(device: str):
    sys.path.insert(0, str(ROOT / "examples"))
    import unrolled_deblur

    x0, k, y, x_true = (t.float().to(device) for t in unrolled_deblur.synthetic_data(8, dtype=torch.float64))
    variants = {}
    for inner, label in (("explicit", "symgrad inner gradient"), ("autograd", "autograd.grad(create_graph=True)")):
        model = unrolled_deblur.UnrolledDeblur(steps=4, channels=8, inner=inner, dtype=torch.float32).to(device)

        def step(model=model):
            model.zero_grad(set_to_none=True)
            loss = 0.5 * (model(x0, k, y) - x_true).pow(2).sum()
            loss.backward()
            return loss

        variants[label] = step
    return variants, None


def per_sample_variants(device: str):
    """Seed 3's per-sample gradients of w1 and w2 (batch 8, 128x128): generated vs vmap(grad)."""
    module = load_generated(SEEDS["seed3"])
    generator = torch.Generator().manual_seed(0)
    shapes = seed_shapes("seed3", "full")
    inputs = {name: torch.randn(shape, generator=generator).to(device) for name, shape in shapes.items()}
    parameters, batched = ("w1", "w2"), ("x", "y")

    def one_sample_loss(parameter_values, sample_values):
        values = {
            **inputs,
            **dict(zip(parameters, parameter_values)),
            **{name: value.unsqueeze(0) for name, value in zip(batched, sample_values)},
        }
        return module.forward(**values)[0]

    per_sample_grad = torch.func.vmap(torch.func.grad(one_sample_loss), in_dims=(None, 0))
    variants = {
        "symgrad per_sample_gradients": lambda: module.per_sample_gradients(**inputs),
        "torch.func.vmap(grad)": lambda: per_sample_grad(
            tuple(inputs[n] for n in parameters), tuple(inputs[n] for n in batched)
        ),
        "unfold + einsum (Opacus)": lambda: unfold_einsum_per_sample(**inputs),
    }
    return variants, None


def unfold_einsum_per_sample(x, w1, w2, k, y):
    """Seed 3's per-sample weight gradients the way Opacus computes them: autograd gives each conv's
    output gradient, and each sample's weight gradient is that gradient times the unfolded input
    patches, one einsum per layer."""
    w1, w2 = w1.detach().requires_grad_(), w2.detach().requires_grad_()
    conv1 = F.conv2d(x, w1, padding=1)
    relu1 = F.relu(conv1)
    conv2 = F.conv2d(relu1, w2, padding=1)
    loss = 0.5 * (F.conv2d(conv2, k, stride=32) - y).pow(2).sum()
    grad_conv1, grad_conv2 = torch.autograd.grad(loss, [conv1, conv2])
    batch = x.shape[0]
    patches1 = F.unfold(x, w1.shape[2:], padding=1)
    patches2 = F.unfold(relu1.detach(), w2.shape[2:], padding=1)
    per_sample_w1 = torch.einsum("nol,npl->nop", grad_conv1.flatten(2), patches1).reshape(batch, *w1.shape)
    per_sample_w2 = torch.einsum("nol,npl->nop", grad_conv2.flatten(2), patches2).reshape(batch, *w2.shape)
    return per_sample_w1, per_sample_w2


def compiled_variants(device: str):
    """Seed 3 at its full shapes under ``torch.compile``: the generated gradients compiled, beside
    the compiled forward differentiated by autograd (AOTAutograd compiles its backward too)."""
    module = load_generated(SEEDS["seed3"])
    shapes = seed_shapes("seed3", "full")
    wrt = seed_wrt("seed3")
    generator = torch.Generator().manual_seed(0)
    inputs = {name: torch.randn(shape, generator=generator).to(device) for name, shape in shapes.items()}
    autograd_inputs = {name: value.clone().requires_grad_(name in wrt) for name, value in inputs.items()}
    compiled_gradients = torch.compile(module.gradients)
    compiled_forward = torch.compile(module.forward)

    def compiled_autograd():
        loss = compiled_forward(**autograd_inputs)
        return torch.autograd.grad(loss, [autograd_inputs[name] for name in wrt], torch.ones_like(loss))

    variants = {
        "torch.compile(symgrad gradients)": lambda: compiled_gradients(**inputs),
        "torch.compile(forward) + autograd.grad": compiled_autograd,
    }
    return variants, None


def case(name: str, device: str):
    """``seed1-full``, ``seed3-small``, ``unrolled`` -> (variants, flops)."""
    if name == "unrolled":
        return unrolled_variants(device)
    if name == "per-sample":
        return per_sample_variants(device)
    if name == "compiled":
        return compiled_variants(device)
    seed, size = name.split("-")
    return seed_variants(seed, size, device)


CASES = [
    "seed1-full",
    "seed2-full",
    "seed3-full",
    "seed1-small",
    "seed2-small",
    "seed3-small",
    "unrolled",
    "per-sample",
    "compiled",
]
