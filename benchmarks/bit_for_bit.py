"""Whether a bound training step's parameter gradients are autograd's bit for bit, per network of
``benchmarks.keep_policy`` (narrowed: width 16, the U-Net 8; 3 x 40², the ViT 32²), traced flat and as
blocks, ``--keep all``: float32 and CPU bfloat16 autocast, the model and input in the default layout and
in channels_last; each row the parameters whose .grad is torch.equal to autograd's through the original
model, and the worst relative difference of the others.

    python -m benchmarks.bit_for_bit [--networks resnet18 vit ...] > benchmarks/results/bit-for-bit-cpu.txt
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from . import keep_policy

NETWORKS = ("resnet18", "resnet50", "unet", "efficientnet", "vit", "convnext")
WIDTHS = {"unet": 8, "vit": 48}


def rows(network: str, blocks: bool) -> list[str]:
    """One line per precision and layout: ``network`` traced flat or as blocks."""
    import symgrad
    from symgrad.pipeline import build_text
    from symgrad.trace import trace

    example = keep_policy._example()
    torch.manual_seed(0)
    model = keep_policy._model(network, WIDTHS.get(network, 16), 32).train()
    unet = network == "unet"
    loss = example.LossChoice("mse_loss", "target") if unet else example.LossChoice("cross_entropy", "labels")
    text = trace(
        model, keep_policy._traced(network, 32), wrt="parameters", name="net", loss=loss, mode="train", blocks=blocks
    )
    path = Path(tempfile.mkdtemp()) / "net.py"
    path.write_text(build_text(text, "net.yaml", documents=False, tests=False).rendered.files["net.py"])
    lines = []
    for amp in (False, True):
        for layout in (torch.contiguous_format, torch.channels_last):
            torch.manual_seed(1)
            reference, ours = (copy.deepcopy(model).to(memory_format=layout) for _ in range(2))
            data = keep_policy._data(network, 3, 32 if network == "vit" else 40)
            data["x"] = data["x"].contiguous(memory_format=layout)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                out = reference(data["x"])
                (F.mse_loss(out, data["target"]) if unet else F.cross_entropy(out, data["labels"])).backward()
                bound = symgrad.bind(path, ours)(**data)
            bound.backward()
            pairs = [(a.grad, b.grad) for a, b in zip(reference.parameters(), ours.parameters())]
            same = sum(torch.equal(a, b) for a, b in pairs)
            worst = max(((a - b).abs().max() / a.abs().max().clamp_min(1e-30)).item() for a, b in pairs)
            form, precision = "blocks" if blocks else "flat", "AMP" if amp else "float32"
            lines.append(
                f"{network:12} {form:6} {precision:7} {str(layout)[6:]:17} {same:3}/{len(pairs)} bit for bit,"
                f" worst relative {worst:.1e}"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=NETWORKS)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for network in args.networks:
        for blocks in (False, True):
            for line in rows(network, blocks):
                print(line, flush=True)


if __name__ == "__main__":
    main()
