"""Deep unfolding for the seed's operator, with the data-term gradient written out by symgrad.

The forward operator is the seed's ``k``: a 32×32 stride-32 convolution that maps a 1-channel
128×128 image to 512 channels of 4×4 (``y = k * x``). Each of ``T`` unrolled steps takes an explicit
gradient step on the data term, then applies a learned conv -> ReLU -> conv correction::

    x <- x - eta_t * grad_x ½‖k * x - y‖²       (generated/seed1_strided_conv.py: gradients(...).x)
    x <- x + c2_t * relu(c1_t * x)

The same network can take the inner gradient from ``torch.autograd.grad(..., create_graph=True)``
instead (``inner="autograd"``). Trained from the same start on the same data, the two must end with
the same parameters: this script checks that in float64 and prints both loss curves; with --plot it
also plots them.

    python examples/unrolled_deblur.py                 # about half a minute on 2 CPU cores
    python examples/unrolled_deblur.py --plot loss.png # needs pip install 'symgrad[plot]'
    python examples/unrolled_deblur.py --iterations 3  # the shortened run the tests use
    torchrun --nproc_per_node=2 examples/unrolled_deblur.py --distributed   # DDP, gloo on CPU
    torchrun --nproc_per_node=8 examples/unrolled_deblur.py --distributed --backend nccl --device cuda
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent


def _load_seed1():
    location = ROOT / "generated" / "seed1_strided_conv.py"
    spec = importlib.util.spec_from_file_location("seed1_strided_conv", location)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


seed1 = _load_seed1()


def data_gradient_explicit(x, k, y):
    """grad_x of the summed ½‖k * x − y‖², by the generated closed form (differentiable)."""
    return seed1.gradients(x=x, k=k, y=y).x


def data_gradient_autograd(x, k, y):
    """The same, by nested autograd: what the seed's asker did before."""
    if not x.requires_grad:
        x = x.requires_grad_()
    loss = seed1.forward(x=x, k=k, y=y).sum()
    (gradient,) = torch.autograd.grad(loss, x, create_graph=True)
    return gradient


class UnrolledDeblur(nn.Module):
    def __init__(self, steps: int = 4, channels: int = 8, inner: str = "explicit", dtype=torch.float64, seed: int = 0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.inner = inner
        self.log_eta = nn.Parameter(torch.full((steps,), -3.0, dtype=dtype))
        self.c1 = nn.ParameterList(
            nn.Parameter(0.1 * torch.randn(channels, 1, 3, 3, generator=generator, dtype=dtype)) for _ in range(steps)
        )
        self.c2 = nn.ParameterList(
            nn.Parameter(0.1 * torch.randn(1, channels, 3, 3, generator=generator, dtype=dtype)) for _ in range(steps)
        )

    def forward(self, x0, k, y):
        gradient = data_gradient_explicit if self.inner == "explicit" else data_gradient_autograd
        x = x0
        for step in range(len(self.c1)):
            x = x - self.log_eta[step].exp() * gradient(x, k, y)
            x = x + F.conv2d(F.relu(F.conv2d(x, self.c1[step], padding=1)), self.c2[step], padding=1)
        return x


def synthetic_data(batch: int, dtype=torch.float64, seed: int = 1):
    """Smooth random images, the seed's operator k, and noisy measurements y = k * x + noise."""
    generator = torch.Generator().manual_seed(seed)
    k = torch.randn(512, 1, 32, 32, generator=generator, dtype=dtype) / 32
    coarse = torch.randn(batch, 1, 16, 16, generator=generator, dtype=dtype)
    x_true = F.interpolate(coarse, size=(128, 128), mode="bilinear", align_corners=False)
    y = F.conv2d(x_true, k, stride=32) + 0.01 * torch.randn(batch, 512, 4, 4, generator=generator, dtype=dtype)
    x0 = F.conv_transpose2d(y, k, stride=32) / 512  # a crude back-projection to start from
    return x0, k, y, x_true


def train(
    inner: str,
    iterations: int,
    batch: int = 4,
    learning_rate: float = 5e-3,
    dtype=torch.float64,
    distributed: bool = False,
    device: str = "cpu",
):
    """Train one network; returns (loss per iteration, final parameters as a flat tensor)."""
    model = UnrolledDeblur(inner=inner, dtype=dtype).to(device)
    x0, k, y, x_true = (t.to(device) for t in synthetic_data(batch, dtype))
    if distributed:  # each rank takes its share of the batch; DDP averages the gradients
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        x0, y, x_true = (t.chunk(world)[rank] for t in (x0, y, x_true))
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    losses = []
    for _ in range(iterations):
        optimizer.zero_grad()
        loss = 0.5 * (model(x0, k, y) - x_true).pow(2).sum()
        # DDP averages gradients over ranks; scaling each rank's share of the summed loss by the
        # world size makes that average the full batch's gradient, as in one process
        (loss * torch.distributed.get_world_size() if distributed else loss).backward()
        optimizer.step()
        if distributed:
            loss = loss.detach().clone()
            torch.distributed.all_reduce(loss)
        losses.append(loss.item())
    module = model.module if distributed else model
    return losses, torch.cat([p.detach().flatten().cpu() for p in module.parameters()])


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument(
        "--plot", help="also plot the two loss curves to this PNG (needs `pip install 'symgrad[plot]'`)"
    )
    parser.add_argument("--distributed", action="store_true", help="run under torchrun with DistributedDataParallel")
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--result", help="write losses and final parameters (JSON) here")
    args = parser.parse_args(argv)
    if args.plot and not _has_matplotlib():
        print("error: --plot needs matplotlib (fix: pip install 'symgrad[plot]')", file=sys.stderr)
        return 2
    torch.set_num_threads(max(1, torch.get_num_threads()))

    if args.distributed:
        torch.distributed.init_process_group(args.backend)
        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        losses, parameters = train("explicit", args.iterations, args.batch, distributed=True, device=args.device)
        if torch.distributed.get_rank() == 0 and args.result:
            Path(args.result).write_text(json.dumps({"losses": losses, "parameters": parameters.tolist()}))
        # every rank reaches here before any tears down: a gloo peer that closes its connections
        # while the other is still busy can abort it ("terminate called without an active exception")
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
        return 0

    explicit_losses, explicit_parameters = train("explicit", args.iterations, args.batch)
    autograd_losses, autograd_parameters = train("autograd", args.iterations, args.batch)
    difference = ((explicit_parameters - autograd_parameters).norm() / autograd_parameters.norm()).item()
    print("iteration  loss (explicit inner gradient)  loss (nested autograd)")
    for index, (a, b) in enumerate(zip(explicit_losses, autograd_losses)):
        print(f"{index:9d}  {a:30.10f}  {b:22.10f}")
    print(f"final parameters, relative difference explicit vs nested autograd: {difference:.2e}")
    if args.result:
        Path(args.result).write_text(
            json.dumps(
                {
                    "losses": explicit_losses,
                    "parameters": explicit_parameters.tolist(),
                    "autograd_losses": autograd_losses,
                    "difference": difference,
                }
            )
        )
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axis = plt.subplots(figsize=(6, 3.5))
        axis.semilogy(explicit_losses, label="explicit inner gradient (symgrad)", linewidth=2)
        axis.semilogy(autograd_losses, "--", label="nested torch.autograd.grad", linewidth=2)
        axis.set_xlabel("training iteration")
        axis.set_ylabel("outer loss")
        axis.set_title("Unrolled deblurring: the two trainings coincide")
        axis.legend()
        figure.tight_layout()
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(args.plot, dpi=120)
        print(f"saved {args.plot}")
    return 0 if difference <= 1e-10 else 1


if __name__ == "__main__":
    sys.exit(main())
