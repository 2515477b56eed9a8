"""``python -m benchmarks.saved_values``: what autograd keeps for the backward of a training step, by who reads it.

Issue 39 asks for a training step at ≤ 0.9× autograd's peak memory on ResNet-50 and the U-Net, or a measured
account of which saved values the derivative forbids dropping. This is that account. After the forward of
``examples/train_resnet.py``'s networks in train mode, it walks autograd's graph from the loss and sums the bytes
of every distinct tensor a backward node keeps (its ``_saved_*`` attributes, each storage counted once, parameters
left out: they live for the whole step either way), grouped by node and attribute, and says which derivative
formula reads each (PyTorch's ``derivatives.yaml``) and whether an exact explicit backward could do without it.

    python -m benchmarks.saved_values                     # ResNet-50 4 × 112², U-Net 4 × 128² (the benchmark's rows)
    python -m benchmarks.saved_values --output out/saved.md
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
ROWS = (("resnet50", 4, 112, 64), ("unet", 4, 128, 32))
"""The rows of ``benchmarks/training.py`` whose memory target is 0.9×."""

WHY = {
    ("ConvolutionBackward0", "input"): "the weight's gradient, a correlation of this input with the output's "
    "gradient: needed exactly",
    (
        "NativeBatchNormBackward0",
        "input",
    ): "train-mode x̂ = (input − mean)·invstd: needed exactly (rebuilding it from the output divides by γ, "
    "as InPlace-ABN does: inexact, undefined at γ = 0, and a ReLU after it loses the negative half)",
    ("ReluBackward0", "result"): "the ReLU's mask, output > 0 (kept alone, a bool mask would do: 1 byte, not 4)",
    ("MaxPool2DWithIndicesBackward0", "self"): "the pool's input, read for its shape and layout only",
    ("MaxPool2DWithIndicesBackward0", "result1"): "the argmax indices, int64 as the kernel requires (or a "
    "second pool forward in the backward)",
    ("AddmmBackward0", "mat1"): "the weight's gradient, grad.T @ input: needed exactly",
}
"""Which derivative formula (``derivatives.yaml``) reads each saved value, and what an exact explicit
backward could keep instead. Values of a few numbers (batch statistics, the loss's inputs) have none."""


def networks():
    sys.path.insert(0, str(ROOT / "examples"))
    import train_resnet  # noqa: E402  (the benchmark's own networks)

    return {"resnet50": lambda width: train_resnet.ResNet50(width), "unet": lambda width: train_resnet.UNet(1, width)}


def saved_by_reader(model: torch.nn.Module, x: torch.Tensor, target: torch.Tensor) -> tuple[dict, int]:
    """Bytes of every distinct non-parameter storage autograd keeps, keyed by the (node, attribute) pairs
    that keep it: one storage kept by two nodes (an in-place ReLU's result that the next convolution saves as
    its input) is counted once, under both."""
    model.train()
    output = model(x)
    loss = F.cross_entropy(output, target) if output.dim() == 2 else F.mse_loss(output, target)
    parameters = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    readers, sizes, seen_nodes = defaultdict(set), {}, set()
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen_nodes:
            continue
        seen_nodes.add(node)
        for attribute in (name for name in dir(node) if name.startswith("_saved_")):
            value = getattr(node, attribute)
            for tensor in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in parameters:
                    key = tensor.untyped_storage().data_ptr()
                    readers[key].add((type(node).__name__, attribute[len("_saved_") :]))
                    sizes[key] = tensor.untyped_storage().nbytes()
        stack.extend(next_node for next_node, _ in node.next_functions)
    by_readers = defaultdict(int)
    for key, nbytes in sizes.items():
        by_readers[tuple(sorted(readers[key]))] += nbytes
    return dict(by_readers), sum(sizes.values())


def table(label: str, batch: int, size: int, by_readers: dict, total: int) -> list[str]:
    lines = [
        f"### {label}, {batch} × {size}², float32, train mode",
        "",
        f"Saved for the backward: **{total / 2**20:.1f} MiB** in distinct storages (parameters and "
        "buffers not counted).",
        "",
        "| kept by (node: saved value) | MiB | share | what reads it |",
        "|---|---:|---:|---|",
    ]
    for readers, nbytes in sorted(by_readers.items(), key=lambda item: -item[1]):
        why = "; ".join(WHY[reader] for reader in readers if WHY.get(reader))
        keepers = " + ".join(f"{node}: {attribute}" for node, attribute in readers)
        share = nbytes / total if total else 0.0
        lines.append(f"| {keepers} | {nbytes / 2**20:.2f} | {share:.0%} | {why} |")
    return lines + [""]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="out/saved-values.md")
    parser.add_argument("--quick", action="store_true", help="width 4 at 2 × 32²: a smoke run")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    build = networks()
    lines = [
        "# What autograd saves for a training step's backward",
        "",
        f"`python -m benchmarks.saved_values`, torch {torch.__version__}.",
        "",
    ]
    for label, batch, size, width in ROWS:
        if args.quick:
            batch, size, width = 2, 32, 4
        model = build[label](width)
        channels = 3 if label.startswith("resnet") else 1
        x = torch.randn(batch, channels, size, size)
        target = torch.randint(0, 10, (batch,)) if label.startswith("resnet") else torch.randn(batch, 1, size, size)
        by_reader, total = saved_by_reader(model, x, target)
        lines += table(label, batch, size, by_reader, total)
    text = "\n".join(lines)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
