"""What ``symgrad.bind(..., verify=True)`` costs: ``python -m benchmarks.verify_cost``.

ResNet-50 (``examples/train_resnet.py``) and a small ViT (written here: patch embedding, 4 pre-norm blocks
of ``scaled_dot_product_attention`` and an MLP, width 64, 16 x 16 patches of 4) traced without a loss in
train mode, their modules generated; then, on the CPU, the median wall time of ``bind`` without and with
``verify=True`` (which runs one float64 forward and backward of a copy of the model at the module's
``SMALL_INPUTS`` through the bound module and through autograd), and one float32 training step of the bound
model at the traced size for scale. Prints one line per network."""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        batch, tokens, width = x.shape
        q, k, v = (
            self.qkv(self.norm1(x))
            .reshape(batch, tokens, 3, self.heads, width // self.heads)
            .permute(2, 0, 3, 1, 4)
            .unbind(0)
        )
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, tokens, width))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class SmallViT(nn.Module):
    def __init__(self, size=16, patch=4, width=64, depth=4, heads=4, classes=10):
        super().__init__()
        self.embed = nn.Conv2d(3, width, patch, stride=patch)
        self.position = nn.Parameter(torch.randn(1, (size // patch) ** 2, width) * 0.02)
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, classes)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2) + self.position
        return self.head(self.norm(self.blocks(x)).mean(1))


def measure(label: str, model: nn.Module, shape: tuple, repeats: int = 3) -> str:
    import symgrad
    from symgrad.pipeline import build_text
    from symgrad.trace import trace

    text = trace(model, {"x": shape}, wrt="parameters", name="verified", mode="train")
    folder = Path(tempfile.mkdtemp())
    path = folder / "verified.py"
    path.write_text(build_text(text, "verified.yaml", documents=False).rendered.files[path.name])
    times = {}
    for verify in (False, True):
        runs = []
        for _ in range(repeats):
            started = time.perf_counter()
            fast = symgrad.bind(path, model, verify=verify)
            runs.append(time.perf_counter() - started)
        times[verify] = statistics.median(runs)
    x, labels = torch.randn(shape), torch.randint(0, 10, (shape[0],))
    steps = []
    for _ in range(repeats):
        started = time.perf_counter()
        F.cross_entropy(fast(x), labels).backward()
        steps.append(time.perf_counter() - started)
    small = ", ".join(
        f"{key} {list(shape)}" for key, (shape, _) in (getattr(fast.generated, "SMALL_INPUTS", None) or {}).items()
    )
    return (
        f"{label}: bind {times[False] * 1e3:.0f} ms, bind(verify=True) {times[True] * 1e3:.0f} ms (the check "
        f"{(times[True] - times[False]) * 1e3:.0f} ms, at {small}); a float32 step at {list(shape)}: "
        f"{statistics.median(steps) * 1e3:.0f} ms"
    )


def main() -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    import train_resnet

    torch.manual_seed(0)
    print(measure("ResNet-50", train_resnet.ResNet50().train(), (2, 3, 64, 64)))
    print(measure("ViT (4 blocks, width 64, 16 patches)", SmallViT().train(), (8, 3, 16, 16)))


if __name__ == "__main__":
    main()
