"""Blocks against the flat form: lines of the generated module and of its derivation, generation
time, agreement, and the speed of ``gradients``, for real networks traced as ``symgrad trace`` does.

    python -m benchmarks.structure [--only LABEL ...] [--speed] [--output FILE]

Each network is traced twice in train mode at 64² (the command line's default, one block per repeated
submodule class, and ``--flat``), both modules are generated, their float64 gradients compared at
another batch and size (≤1e-12), and with ``--speed`` their float32 ``gradients`` timed side by side in
one process, alternating, median and minimum of ``--repeats`` (default 15), at batch 8 and 112².
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def networks() -> dict:
    sys.path[:0] = [str(ROOT), str(ROOT / "examples")]
    import train_resnet

    from tests.models import classic as models, zoo_nets

    return {
        "ResNet-18": (lambda: train_resnet.ResNet18(), 3, "cross_entropy"),
        "ResNet-50": (lambda: train_resnet.ResNet50(), 3, "cross_entropy"),
        "VGG-16-BN": (
            lambda: models.VGG("vgg16", batch_norm=True, classes=10, width=16, hidden=256, dropout=0.0),
            3,
            "cross_entropy",
        ),
        "U-Net": (lambda: train_resnet.UNet(1, 64), 1, "mse_loss"),
        "MobileNetV2": (
            lambda: zoo_nets.MobileNetV2(10, 1.0, inverted_residual_setting=MOBILENET_V2, last_channel=1280),
            3,
            "cross_entropy",
        ),
        "DenseNet-121-style": (lambda: zoo_nets.DenseNet(), 3, "cross_entropy"),
    }


MOBILENET_V2 = [
    [1, 16, 1, 1],
    [6, 24, 2, 2],
    [6, 32, 3, 2],
    [6, 64, 4, 2],
    [6, 96, 3, 1],
    [6, 160, 3, 2],
    [6, 320, 1, 1],
]
"""torchvision's MobileNetV2 stages (t, c, n, s): 17 inverted residual blocks."""


def _arguments(module, spec_inputs: dict, values: dict) -> dict:
    sources = {name: entry["source"] for name, entry in spec_inputs.items() if "source" in entry}
    if not sources:  # every input by name
        return values
    return {
        **{name: value for name, value in values.items() if name not in sources},
        "params": {sources[name]: values[name] for name in sources},
    }


def _by_name(result, spec_inputs: dict, wrt: list[str]) -> dict:
    fields = result._asdict()
    sources = {name: entry["source"] for name, entry in spec_inputs.items() if "source" in entry}
    return {
        name: fields["params"][sources[name]] if "params" in fields and name in sources else fields[name]
        for name in wrt
    }


def run(label: str, make, channels: int, loss: str, speed: bool, repeats: int = 15) -> dict:
    import yaml

    from symgrad.check import module_from_source
    from symgrad.pipeline import build_text
    from symgrad.trace import LossChoice, trace
    from symgrad.trace.run_once import source_name

    torch.manual_seed(0)
    model = make().double().train()
    row, modules = {"label": label}, {}
    target = "labels" if loss == "cross_entropy" else "target"
    for form in ("flat", "blocks"):
        text = trace(
            model,
            {"x": (2, channels, 64, 64)},
            name=f"net_{form}",
            loss=LossChoice(loss, target),
            mode="train",
            blocks=form == "blocks",
        )
        start = time.perf_counter()
        files = build_text(text, f"{label}.yaml").rendered.files
        row[f"{form} generate s"] = time.perf_counter() - start
        source = files[f"net_{form}.py"]
        row[f"{form} lines"] = source.count("\n")
        row[f"{form} widest"] = max(len(line) for line in source.splitlines())
        row[f"{form} md lines"] = files[f"net_{form}.md"].count("\n")
        row["blocks"] = text.count("\n  - {block:") if form == "blocks" else 0
        modules[form] = (module_from_source(source, f"net_{form}"), yaml.safe_load(text))
    spec = modules["flat"][1]
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(3, channels, 48, 40, dtype=torch.float64, generator=generator)
    with torch.no_grad():
        prediction = model(x)
    labels = (
        torch.randint(prediction.shape[1], (3,), generator=generator)
        if loss == "cross_entropy"
        else torch.randn(prediction.shape, dtype=torch.float64, generator=generator)
    )
    named = {source_name("", path, model): value for path, value in [*model.named_parameters(), *model.named_buffers()]}
    values = {key: x if key == "x" else labels if key == target else named[key] for key in spec["inputs"]}
    state = {key: value.clone() for key, value in model.state_dict().items()}
    results = {}
    for form, (module, form_spec) in modules.items():
        model.load_state_dict(state)
        results[form] = _by_name(
            module.gradients(**_arguments(module, form_spec["inputs"], values)), form_spec["inputs"], spec["wrt"]
        )
    # relative to the largest gradient entry: a gradient zero in exact arithmetic (a conv bias before a
    # train-mode batch_norm) is rounding noise in both forms, with no scale of its own
    scale = max(results["flat"][name].abs().max().item() for name in spec["wrt"])
    row["agreement"] = (
        max((results["blocks"][name] - results["flat"][name]).abs().max().item() for name in spec["wrt"]) / scale
    )
    model.load_state_dict(state)
    if speed:
        row.update(_speed(model.float(), modules, channels, target, loss, repeats))
    return row


def _speed(model, modules, channels, target, loss, repeats: int) -> dict:
    from symgrad.trace.run_once import source_name

    torch.manual_seed(1)
    x = torch.randn(8, channels, 112, 112)
    with torch.no_grad():
        prediction = model(x)
    labels = torch.randint(prediction.shape[1], (8,)) if loss == "cross_entropy" else torch.randn(prediction.shape)
    named = {source_name("", path, model): value for path, value in [*model.named_parameters(), *model.named_buffers()]}
    calls = {}
    for form, (module, spec) in modules.items():
        values = {key: x if key == "x" else labels if key == target else named[key] for key in spec["inputs"]}
        arguments = _arguments(module, spec["inputs"], values)
        calls[form] = lambda module=module, arguments=arguments: module.gradients(**arguments)
    times = {form: [] for form in calls}
    for form in calls:  # warm up
        calls[form]()
    for repeat in range(repeats):
        for form in list(calls) if repeat % 2 == 0 else list(calls)[::-1]:
            start = time.perf_counter()
            calls[form]()
            times[form].append(time.perf_counter() - start)
    flat, blocks = statistics.median(times["flat"]), statistics.median(times["blocks"])
    return {
        "flat ms": 1e3 * flat,
        "blocks ms": 1e3 * blocks,
        "speed": flat / blocks,
        "flat min ms": 1e3 * min(times["flat"]),
        "blocks min ms": 1e3 * min(times["blocks"]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--speed", action="store_true", help="also time gradients, batch 8, 112², float32")
    parser.add_argument("--repeats", type=int, default=15, help="timed calls of each form (with --speed)")
    parser.add_argument("--output", type=Path)
    arguments = parser.parse_args()
    rows = []
    for label, (make, channels, loss) in networks().items():
        if arguments.only and label not in arguments.only:
            continue
        rows.append(run(label, make, channels, loss, arguments.speed, arguments.repeats))
        print(rows[-1], file=sys.stderr, flush=True)
    header = (
        "| network | block instances | module lines, flat → blocks | widest line | derivation lines, flat → "
        "blocks | generate s, flat → blocks | blocks vs flat, float64, by the largest entry |"
    )
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(
            f"| {row['label']} | {row['blocks']} | {row['flat lines']:,} → {row['blocks lines']:,} | "
            f"{row['blocks widest']} | {row['flat md lines']:,} → {row['blocks md lines']:,} | "
            f"{row['flat generate s']:.1f} → {row['blocks generate s']:.1f} | {row['agreement']:.0e} |"
        )
    if arguments.speed:
        lines += [
            "",
            "| network | `gradients` flat ms, median (min) | blocks ms, median (min) | blocks speed vs "
            "flat, by medians | by minimums |",
            "|---|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {row['label']} | {row['flat ms']:.1f} ({row['flat min ms']:.1f}) | {row['blocks ms']:.1f} "
            f"({row['blocks min ms']:.1f}) | {row['speed']:.3f}× | "
            f"{row['flat min ms'] / row['blocks min ms']:.3f}× |"
            for row in rows
        ]
    table = "\n".join(lines) + "\n"
    print(table)
    if arguments.output:
        arguments.output.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
