"""``python -m benchmarks.trials [cpu|cuda]``: the two trials behind issue 13's layout and per-sample choices.

1. Per-sample weight gradients of seed 3's two convolutions (32 -> 32 and 32 -> 1 channels, 3x3,
   128x128) at batches 8, 32 and 64, in three forms: the grouped forward convolution symgrad wrote
   before, PyTorch's weight-gradient kernel with the batch folded into the groups (what it writes
   now), and unfold + bmm (ExpandedWeights' form from batch 32). Checked against each other in
   float64 first.
2. Seeds 2 and 3 at their spec's shapes: ``gradients`` as committed (channels_last weights) beside
   the same spec generated with the layout move turned off, and autograd.

Prints markdown tables of medians (and peak memory on CUDA, where the allocator reports it exactly).
These are trials, not the benchmark: BENCHMARKS.md comes from ``python -m benchmarks``.
"""

from __future__ import annotations

import statistics
import sys

import torch
import torch.nn.functional as F

from symgrad import generate, roles
from symgrad.check import module_from_source

from .cases import ROOT, SEEDS, load_generated, seed_shapes, seed_wrt
from .measure import peak_growth_bytes, timings


def grouped_forward_conv(x, grad, kernel, padding):
    """Before: x as [C, N, H, W] correlated with grad as an [N*O, 1, H, W] kernel, groups = N."""
    return (
        F.conv2d(x.transpose(0, 1), grad.flatten(0, 1).unsqueeze(1), padding=padding, groups=x.shape[0])
        .unflatten(1, (x.shape[0], -1))
        .permute(1, 2, 0, 3, 4)
    )


def weight_gradient_kernel(x, grad, kernel, padding):
    """Now: conv2d_weight of x as [1, N*C, H, W] and grad as [1, N*O, H, W], groups = N."""
    batch, channels, outputs = x.shape[0], x.shape[1], grad.shape[1]
    return torch.nn.grad.conv2d_weight(
        x.flatten(0, 1).unsqueeze(0),
        (batch * outputs, channels, kernel, kernel),
        grad.flatten(0, 1).unsqueeze(0),
        padding=padding,
        groups=batch,
    ).unflatten(0, (batch, outputs))


def unfold_bmm(x, grad, kernel, padding):
    """ExpandedWeights from batch 32: grad [N, O, HW] times the unfolded patches [N, HW, C*K*K]."""
    patches = F.unfold(x, kernel, padding=padding).transpose(1, 2)
    return torch.bmm(grad.flatten(2), patches).unflatten(2, (x.shape[1], kernel, kernel))


FORMS = {
    "grouped forward conv (before)": grouped_forward_conv,
    "weight-gradient kernel, groups = N (now)": weight_gradient_kernel,
    "unfold + bmm": unfold_bmm,
}


def median_ms(function, device: str, repeats: int) -> float:
    return statistics.median(timings(function, device, 3, repeats)) * 1e3


def peak_mib(function, device: str) -> str:
    """Exact on CUDA (the caching allocator's own count); on a CPU the benchmark's fresh processes measure it."""
    return f"{peak_growth_bytes(function, device) / 2**20:.1f}" if device == "cuda" else "–"


def check_forms(device: str) -> None:
    generator = torch.Generator().manual_seed(0)
    for channels, outputs in ((3, 5), (4, 1)):
        x = torch.randn(3, channels, 9, 7, dtype=torch.float64, generator=generator).to(device)
        grad = torch.randn(3, outputs, 9, 7, dtype=torch.float64, generator=generator).to(device)
        reference = torch.stack(
            [
                torch.nn.grad.conv2d_weight(x[n : n + 1], (outputs, channels, 3, 3), grad[n : n + 1], padding=1)
                for n in range(3)
            ]
        )
        for name, form in FORMS.items():
            error = (form(x, grad, 3, 1) - reference).abs().max().item()
            if error > 1e-10:
                raise SystemExit(f"error: {name} is off by {error:.1e} in float64")


def per_sample_forms(device: str) -> None:
    check_forms(device)
    repeats = 50 if device == "cuda" else 15
    print(f"\n## Per-sample weight-gradient forms on {device} (seed 3's layers, 3x3, 128x128)\n")
    print("| layer | batch | form | median ms | peak MiB |\n|---|---:|---|---:|---:|")
    for batch in (8, 32, 64):
        for channels, outputs in ((32, 32), (32, 1)):
            x = torch.randn(batch, channels, 128, 128, device=device)
            grad = torch.randn(batch, outputs, 128, 128, device=device)
            for name, form in FORMS.items():
                if device == "cpu" and batch > 32 and name == "unfold + bmm":
                    continue  # over a second a call on a small CPU, and already the slowest at batch 32
                call = lambda form=form: form(x, grad, 3, 1)  # noqa: E731
                print(
                    f"| {channels} -> {outputs} | {batch} | {name} | {median_ms(call, device, repeats):.3f} | "
                    f"{peak_mib(call, device)} |",
                    flush=True,
                )


def default_layout_code(seed: str) -> str:
    """The seed's module generated with the channels_last move turned off (the threshold out of reach)."""
    kept = roles.CHANNELS_LAST_MIN_POSITIONS
    roles.CHANNELS_LAST_MIN_POSITIONS = sys.maxsize
    try:
        return generate(ROOT / "examples" / f"{SEEDS[seed]}.yaml").code
    finally:
        roles.CHANNELS_LAST_MIN_POSITIONS = kept


def layouts(device: str) -> None:
    repeats = 60 if device == "cuda" else 15
    print(f"\n## `gradients` with channels_last weights vs the default layout on {device}\n")
    print("| seed | variant | median ms | peak MiB |\n|---|---|---:|---:|")
    for seed in ("seed2", "seed3"):
        committed = load_generated(SEEDS[seed])
        default = module_from_source(default_layout_code(seed), f"{SEEDS[seed]}_default_layout")
        generator = torch.Generator().manual_seed(0)
        inputs = {
            name: torch.randn(shape, generator=generator).to(device)
            for name, shape in seed_shapes(seed, "full").items()
        }
        wrt = seed_wrt(seed)
        leaves = {name: value.clone().requires_grad_(name in wrt) for name, value in inputs.items()}

        def autograd(committed=committed, leaves=leaves, wrt=wrt):
            loss = committed.forward(**leaves)
            return torch.autograd.grad(loss, [leaves[name] for name in wrt], torch.ones_like(loss))

        for label, function in (
            ("gradients, channels_last weights (committed)", lambda: committed.gradients(**inputs)),
            ("gradients, default layout", lambda: default.gradients(**inputs)),
            ("torch.autograd.grad", autograd),
        ):
            print(
                f"| {seed} | {label} | {median_ms(function, device, repeats):.3f} | {peak_mib(function, device)} |",
                flush=True,
            )


def main(argv: list[str]) -> int:
    device = argv[0] if argv else ("cuda" if torch.cuda.is_available() else "cpu")
    per_sample_forms(device)
    layouts(device)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
