"""``python -m benchmarks.generation``: how long ``symgrad trace`` and ``symgrad.generate`` take.

Real models (ResNet-18/50, VGG-11/19 at ImageNet size, written in ``tests/models/classic.py``) are traced at
batch 2, 224x224 and generated in this process; conv -> ReLU chains show the growth with depth. Each
time is the median of ``--repeats`` runs. ``--depth`` times only the 2-channel chains of 100, 1,000
and 10,000 layers (issue 26: generation linear in depth), once each. The table is printed and written to ``out/generation.md``;
``python -m benchmarks`` puts the same table into BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import yaml

TARGET_SECONDS = 5.0
"""Issue 11: a 175-layer ResNet-50-sized spec and a VGG-19-sized spec each generate in under 5 s."""
DEPTH_PAIRS = (50, 500, 5000)
"""conv -> ReLU pairs of the depth rows: 100, 1,000 and 10,000 spec layers."""
DEPTH_TARGETS = {1000: 20.0, 10000: 240.0}
"""Issue 26: spec layers -> seconds to generate a 2-channel chain that deep."""


def _median_seconds(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def chain_spec(length: int, channels: int = 16, batch: int = 8, size: int = 32, named: bool = True) -> str:
    """``length`` conv2d -> relu pairs (2 * length spec layers), each conv with its own 3x3 weight;
    ``named=False`` leaves the layers' default names (``conv2d_0``, ``relu_1``...), which keeps a
    10,000-layer spec under the spec's 100,000 YAML nodes."""
    inputs = {"x": {"shape": [batch, channels, size, size]}}
    layers = []
    for index in range(length):
        inputs[f"w{index}"] = {"shape": [channels, channels, 3, 3]}
        conv, relu = {"op": "conv2d", "weight": f"w{index}", "padding": 1}, {"op": "relu"}
        if named:
            conv["out"], relu["out"] = f"c{index}", f"r{index}"
        layers += [conv, relu]
    inputs["y"] = {"shape": [batch, channels, size, size]}
    return yaml.safe_dump(
        {
            "name": "chain",
            "inputs": inputs,
            "layers": layers,
            "loss": {"op": "half_sq_error", "target": "y"},
            "wrt": ["x", "w0"],
        },
        sort_keys=False,
    )


def model_rows(repeats: int) -> list[tuple[str, int, float, float]]:
    """(model, spec layers, trace seconds, generate seconds) for real models traced at 2x3x224x224."""
    from symgrad import generate
    from symgrad.trace import LossChoice, trace
    from tests.models import classic as models

    rows = []
    for label, build in [
        ("ResNet-18 (torchvision layout, CIFAR stem, width 64)", lambda: models.ResNet18(64, 1000)),
        ("ResNet-50", models.ResNet50),
        ("VGG-11", lambda: models.VGG("vgg11")),
        ("VGG-19", lambda: models.VGG("vgg19")),
    ]:
        model = build().eval()
        holder = {}

        def traced():
            holder["text"] = trace(model, {"x": (2, 3, 224, 224)}, name="traced", loss=LossChoice("cross_entropy"))

        trace_seconds = _median_seconds(traced, repeats)
        generate_seconds = _median_seconds(lambda: generate(text=holder["text"]), repeats)
        rows.append((label, holder["text"].count("op:") - 1, trace_seconds, generate_seconds))
    return rows


def chain_rows(lengths, repeats: int) -> list[tuple[int, float]]:
    from symgrad import generate

    return [(length, _median_seconds(lambda: generate(text=chain_spec(length)), repeats)) for length in lengths]


def depth_rows(pairs=DEPTH_PAIRS) -> list[tuple[int, float]]:
    """(spec layers, seconds) to generate 2-channel chains of ``pairs`` conv -> ReLU pairs, once each."""
    from symgrad import generate

    return [
        (
            2 * length,
            _median_seconds(lambda: generate(text=chain_spec(length, channels=2, batch=2, size=8, named=False)), 1),
        )
        for length in pairs
    ]


def render_depth(rows: list) -> str:
    lines = ["| conv→ReLU chain (2 channels, 2×2×8×8), layers | generate s | ms per layer |", "|---:|---:|---:|"]
    lines += [f"| {layers:,} | {seconds:.1f} | {1e3 * seconds / layers:.1f} |" for layers, seconds in rows]
    verdicts = [
        f"{layers:,} layers in {seconds:.0f} s against {DEPTH_TARGETS[layers]:.0f} s, "
        f"{'met' if seconds < DEPTH_TARGETS[layers] else 'missed'}"
        for layers, seconds in rows
        if layers in DEPTH_TARGETS
    ]
    if verdicts:
        lines += ["", "Target (issue 26): generation linear in depth: " + "; ".join(verdicts) + "."]
    return "\n".join(lines)


def render(models: list, chains: list, depth: list = ()) -> str:
    lines = [
        "### Generation time",
        "",
        "Real models traced at 2×3×224×224 (eval mode, cross-entropy) and generated in-process "
        "(derivation, the module, the test file and both documents); medians.",
        "",
        "| model | spec layers | trace s | generate s | ms per layer |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {label} | {layers} | {traced:.2f} | {generated:.2f} | {1e3 * generated / layers:.1f} |"
        for label, layers, traced, generated in models
    ]
    lines += ["", "| conv→ReLU chain, layers | generate s | ms per layer |", "|---:|---:|---:|"]
    lines += [f"| {2 * length} | {seconds:.2f} | {1e3 * seconds / (2 * length):.1f} |" for length, seconds in chains]
    if depth:
        lines += ["", render_depth(depth)]
    verdicts = [
        f"{label}: {generated:.2f} s, {'met' if generated < TARGET_SECONDS else 'missed'}"
        for label, _, _, generated in models
        if label in ("ResNet-50", "VGG-19")
    ]
    lines += [
        "",
        f"Target (issue 11): ResNet-50- and VGG-19-sized specs generate in under {TARGET_SECONDS:.0f} s: "
        + "; ".join(verdicts)
        + ". Tracing runs the model twice (the second run, at batch + 1 and doubled "
        "spatial sizes, finds sizes read from the input), so its time is two forwards at those sizes.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one repeat, short chains, no real models")
    parser.add_argument("--depth", action="store_true", help="only the 100, 1,000 and 10,000-layer 2-channel chains")
    arguments = parser.parse_args()
    if arguments.depth:
        print(render_depth(depth_rows()))
        return
    repeats = 1 if arguments.quick else arguments.repeats
    models = [] if arguments.quick else model_rows(repeats)
    chains = chain_rows((5, 25) if arguments.quick else (5, 25, 50, 100), repeats)
    text = render(models, chains)
    Path("out").mkdir(exist_ok=True)
    Path("out/generation.md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
