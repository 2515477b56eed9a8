"""``python -m benchmarks.autocast_policy``: the dtype autocast gives the U-Net's ops, per device.

BENCHMARKS.md explains the U-Net's AMP memory on the GPU by CUDA's autocast policy: bilinear
upsampling runs in float32 and a concatenation promotes to its widest input, so the convolutions
after the U-Net's concatenations read float32 tensors (their backward keeps what they read). This
prints, for the CPU's autocast and for CUDA's, the dtype of each such op's output given bfloat16
inputs. CUDA's is read on fake CUDA tensors (``FakeTensorMode``: shapes and dtypes, no GPU), so it
runs on any machine; CPU autocast keeps all of them in bfloat16.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

OPS = {
    "conv2d": lambda x, skip, weight: F.conv2d(x, weight, padding=1),
    "interpolate (bilinear ×2)": lambda x, skip, weight: F.interpolate(x, scale_factor=2, mode="bilinear"),
    "max_pool2d": lambda x, skip, weight: F.max_pool2d(x, 2),
    "batch_norm (train)": lambda x, skip, weight: F.batch_norm(x, None, None, training=True),
    "cat (bfloat16 skip, upsampled)": lambda x, skip, weight: torch.cat(
        [skip, F.interpolate(x, scale_factor=2, mode="bilinear")], dim=1
    ),
}


def dtypes(device: str) -> dict[str, torch.dtype]:
    """{op: its output's dtype} under ``device``'s autocast to bfloat16, the inputs in bfloat16."""

    def run():
        x = torch.empty(2, 4, 8, 8, device=device, dtype=torch.bfloat16)
        skip = torch.empty(2, 4, 16, 16, device=device, dtype=torch.bfloat16)
        weight = torch.empty(4, 4, 3, 3, device=device)
        return {name: op(x, skip, weight).dtype for name, op in OPS.items()}

    if device == "cpu":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return run()
    # torch.autocast("cuda") turns itself off without a GPU; the dispatcher's own switches do not
    enabled, dtype = torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)
    with FakeTensorMode():
        torch.set_autocast_enabled(device, True)
        torch.set_autocast_dtype(device, torch.bfloat16)
        try:
            return run()
        finally:
            torch.set_autocast_enabled(device, enabled)
            torch.set_autocast_dtype(device, dtype)


def main() -> int:
    cpu, cuda = dtypes("cpu"), dtypes("cuda")
    print("| op, bfloat16 inputs | CPU autocast | CUDA autocast |\n|---|---|---|")
    for name in OPS:
        print(f"| {name} | {str(cpu[name])[6:]} | {str(cuda[name])[6:]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
