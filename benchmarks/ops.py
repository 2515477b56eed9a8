"""One layer's gradients, family by family: ``python -m benchmarks.ops``.

Each op family a CNN is made of (convolutions, train-mode BatchNorm, GroupNorm, LayerNorm, ReLU,
pools, bilinear upsampling, a classifier's Linear with cross-entropy, and a conv-BN-ReLU block) is
one small ``nn.Module``, traced in train mode with a mean loss, generated, and timed at a CNN's
real size (batch 8, 64 channels, 56², float32): the generated ``gradients(...)`` (the layer's
forward and every gradient, the input's included) against ``torch.autograd.grad`` of the same loss
through the module, round-robin in one process (medians). Before timing, each family's float64
gradients are checked against autograd's at another size (largest relative difference at most
1e-10, else exit 1). This is where a family's fused kernel (``convolution_backward``,
``native_batch_norm_backward``, the pools' and ``upsample_bilinear2d``'s backward) or its readable
formula shows on its own. Writes a Markdown table (``--output``; with ``--output BENCHMARKS.md`` it
replaces that file's section) and saves the timings (``--json``); ``--saved`` renders a saved run.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from symgrad.check import module_from_source
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace

from .measure import round_robin
from .report import machine_description, save_run, write_report

SECTION = "## Op families: one layer's gradients"
TOLERANCE = 1e-10


class ChannelsLastLayerNorm(nn.Module):
    """ConvNeXt's LayerNorm over channels: permuted to channels-last, ``nn.LayerNorm``, back."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = nn.LayerNorm(channels)

    def forward(self, x):
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


@dataclass(frozen=True)
class Family:
    label: str
    build: object  # () -> nn.Module
    shape: tuple[int, ...]  # the input at the timed size; the check runs at a smaller one
    small: tuple[int, ...]
    loss: str = "mse_loss"


IMAGE, SMALL = (8, 64, 56, 56), (3, 8, 10, 6)
FAMILIES = [
    Family("conv 3×3, 64 → 64", lambda c=64: nn.Conv2d(c, c, 3, padding=1, bias=False), IMAGE, SMALL),
    Family("conv 1×1 stride 2, 64 → 128", lambda c=64: nn.Conv2d(c, 2 * c, 1, stride=2, bias=False), IMAGE, SMALL),
    Family("batch_norm (train)", lambda c=64: nn.BatchNorm2d(c), IMAGE, SMALL),
    Family("group_norm (8 groups)", lambda c=64: nn.GroupNorm(8, c), IMAGE, SMALL),
    Family("layer_norm over channels", lambda c=64: ChannelsLastLayerNorm(c), IMAGE, SMALL),
    Family("instance_norm (affine)", lambda c=64: nn.InstanceNorm2d(c, affine=True), IMAGE, SMALL),
    Family("relu", lambda c=64: nn.ReLU(), IMAGE, SMALL),
    Family("max_pool 3×3 stride 2", lambda c=64: nn.MaxPool2d(3, 2, 1), IMAGE, SMALL),
    Family("avg_pool 2×2", lambda c=64: nn.AvgPool2d(2), IMAGE, SMALL),
    Family("adaptive_avg_pool to 1×1", lambda c=64: nn.AdaptiveAvgPool2d(1), IMAGE, SMALL),
    Family("bilinear upsample ×2", lambda c=64: nn.Upsample(scale_factor=2, mode="bilinear"), IMAGE, SMALL),
    Family("linear 512 → 1000 + cross_entropy", lambda c=512: nn.Linear(c, 1000), (256, 512), (5, 8), "cross_entropy"),
    Family(
        "conv 3×3 + batch_norm + relu",
        lambda c=64: nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True)),
        IMAGE,
        SMALL,
    ),
]


def variants(family: Family, shape: tuple[int, ...], dtype=torch.float32):
    """{"gradients": ..., "autograd": ...}, each returning the input's and every parameter's gradient."""
    torch.manual_seed(0)
    model = family.build(shape[1]).to(dtype).train()
    classes = family.loss == "cross_entropy"
    loss = LossChoice(family.loss, "labels" if classes else "target")
    traced = (2, *shape[1:]) if len(shape) == 4 else (2, shape[1])
    argument = next(iter(inspect.signature(model.forward).parameters))  # nn.Conv2d's is `input`
    text = trace(model, {argument: traced}, name="layer", loss=loss, mode="train")
    built = build_text(text, "layer.yaml")
    generated = module_from_source(built.rendered.files["layer.py"], "layer")
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=generator, dtype=dtype)
    with torch.no_grad():
        output_shape = model(x).shape
    target = (
        torch.randint(output_shape[1], (shape[0],), generator=generator)
        if classes
        else torch.randn(output_shape, generator=generator, dtype=dtype)
    )
    keys = {item.name: item.source for item in built.graph.spec.inputs if item.source}  # in `params`
    state = dict(model.state_dict())
    own = {name: state[key] for name, key in keys.items()}
    parameters = [
        (name, value)
        for name, value in own.items()
        if value.is_floating_point() and dict(model.named_parameters()).get(keys[name]) is not None
    ]
    target_name = "labels" if classes else "target"

    def gradients():
        params = {keys[name]: value for name, value in own.items()}
        grads = generated.gradients(**{argument: x, target_name: target}, **({"params": params} if keys else {}))
        return [getattr(grads, argument), *(grads.params[keys[name]] for name, _ in parameters)]

    leaf = x.clone().requires_grad_()
    module_parameters = [dict(model.named_parameters())[keys[name]] for name, _ in parameters]

    def autograd():
        value = getattr(F, family.loss)(model(leaf), target)
        return list(torch.autograd.grad(value, [leaf, *module_parameters]))

    return {"gradients": gradients, "autograd": autograd}


def float64_agreement(family: Family) -> float:
    """Largest relative difference (2-norm per gradient) of ``gradients`` against autograd, float64."""
    functions = variants(family, family.small, torch.float64)
    ours, theirs = functions["gradients"](), functions["autograd"]()
    return max(float((a - b).norm() / b.norm().clamp_min(1e-300)) for a, b in zip(ours, theirs))


def render(saved: dict) -> str:
    lines = [
        SECTION,
        "",
        f"Machine: {saved['machine']}. Run on {saved['date']}; `python -m benchmarks.ops` (medians of "
        f"{saved['repeats']} round-robin repeats in one process). Each family is one `nn.Module`, traced in train "
        "mode with a mean loss and generated; `gradients` (the layer's forward and every gradient, the input's "
        "included) against `torch.autograd.grad` of the same loss through the module, float32. Float64 "
        "gradients agree with autograd's at another size before timing (largest relative difference).",
        "",
        "| family | input | gradients ms | autograd ms | speed vs autograd | float64 agreement |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in saved["rows"]:
        ours, theirs = statistics.median(row["gradients"]), statistics.median(row["autograd"])
        lines.append(
            f"| {row['family']} | {' × '.join(map(str, row['shape']))} | {ours * 1e3:.2f} | "
            f"{theirs * 1e3:.2f} | {theirs / ours:.2f}× | {row['agreement']:.1e} |"
        )
    slower = [
        row["family"]
        for row in saved["rows"]
        if statistics.median(row["autograd"]) < statistics.median(row["gradients"])
    ]
    lines += ["", "Slower than autograd by median: " + (", ".join(slower) if slower else "none") + "."]
    if saved.get("note"):
        lines += ["", saved["note"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--quick", action="store_true", help="the check sizes, 3 repeats: a smoke run")
    parser.add_argument("--output", default="out/BENCHMARKS-ops.md")
    parser.add_argument("--json", default="out/ops-cpu.json", help="where the timings are saved")
    parser.add_argument("--saved", help="render again from this saved JSON, without measuring")
    args = parser.parse_args(argv)
    if args.saved:
        saved = json.loads(Path(args.saved).read_text())
    else:
        repeats = 3 if args.quick else args.repeats
        rows = []
        for family in FAMILIES:
            agreement = float64_agreement(family)
            if not agreement <= TOLERANCE:
                print(f"{family.label}: float64 gradients differ from autograd's by {agreement:.1e}", file=sys.stderr)
                return 1
            shape = family.small if args.quick else family.shape
            samples = round_robin(variants(family, shape), repeats)
            rows.append({"family": family.label, "shape": list(shape), "agreement": agreement, **samples})
            print(
                f"{family.label:36s} gradients {statistics.median(samples['gradients']) * 1e3:8.2f} ms  "
                f"autograd {statistics.median(samples['autograd']) * 1e3:8.2f} ms",
                flush=True,
            )
        saved = {
            "machine": machine_description("cpu"),
            "date": datetime.date.today().isoformat(),
            "load_average": os.getloadavg(),
            "repeats": repeats,
            "rows": rows,
        }
        save_run(saved, args.json)
    write_report(args.output, render(saved), SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())
