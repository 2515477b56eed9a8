"""``python -m benchmarks.generation``: how long ``symgrad trace`` and ``symgrad.generate`` take.

Real models (ResNet-18/50, VGG-11/19 at ImageNet size, written in ``tests/models.py``) are traced at
batch 2, 224x224 and generated in this process; conv -> ReLU chains show the growth with depth. Each
time is the median of ``--repeats`` runs. The table is printed and written to ``out/generation.md``;
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


def _median_seconds(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def chain_spec(length: int) -> str:
    inputs = {"x": {"shape": [8, 16, 32, 32]}}
    layers = []
    for index in range(length):
        inputs[f"w{index}"] = {"shape": [16, 16, 3, 3]}
        layers += [{"op": "conv2d", "weight": f"w{index}", "padding": 1, "out": f"c{index}"},
                   {"op": "relu", "out": f"r{index}"}]
    inputs["y"] = {"shape": [8, 16, 32, 32]}
    return yaml.safe_dump({"name": "chain", "inputs": inputs, "layers": layers,
                           "loss": {"op": "half_sq_error", "target": "y"}, "wrt": ["x", "w0"]}, sort_keys=False)


def model_rows(repeats: int) -> list[tuple[str, int, float, float]]:
    """(model, spec layers, trace seconds, generate seconds) for real models traced at 2x3x224x224."""
    from symgrad import generate
    from symgrad.trace import LossChoice, trace
    from tests import models

    rows = []
    for label, build in [("ResNet-18 (torchvision layout, CIFAR stem, width 64)", lambda: models.ResNet18(64, 1000)),
                         ("ResNet-50", models.ResNet50),
                         ("VGG-11", lambda: models.VGG("vgg11")), ("VGG-19", lambda: models.VGG("vgg19"))]:
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


def render(models: list, chains: list) -> str:
    lines = ["### Generation time", "",
             "Real models traced at 2×3×224×224 (eval mode, cross-entropy) and generated in-process "
             "(derivation, `gradients`, `gradients_fast`, the test file and both documents); medians.", "",
             "| model | spec layers | trace s | generate s | ms per layer |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {label} | {layers} | {traced:.2f} | {generated:.2f} | {1e3 * generated / layers:.1f} |"
              for label, layers, traced, generated in models]
    lines += ["", "| conv→ReLU chain, layers | generate s | ms per layer |", "|---:|---:|---:|"]
    lines += [f"| {2 * length} | {seconds:.2f} | {1e3 * seconds / (2 * length):.1f} |" for length, seconds in chains]
    verdicts = [f"{label}: {generated:.2f} s, {'met' if generated < TARGET_SECONDS else 'missed'}"
                for label, _, _, generated in models if label in ("ResNet-50", "VGG-19")]
    lines += ["", f"Target (issue 11): ResNet-50- and VGG-19-sized specs generate in under {TARGET_SECONDS:.0f} s: "
              + "; ".join(verdicts) + ". Tracing runs the model twice (the second run, at batch + 1 and doubled "
              "spatial sizes, finds sizes read from the input), so its time is two forwards at those sizes.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one repeat, short chains, no real models")
    arguments = parser.parse_args()
    repeats = 1 if arguments.quick else arguments.repeats
    models = [] if arguments.quick else model_rows(repeats)
    chains = chain_rows((5, 25) if arguments.quick else (5, 25, 50, 100), repeats)
    text = render(models, chains)
    Path("out").mkdir(exist_ok=True)
    Path("out/generation.md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
