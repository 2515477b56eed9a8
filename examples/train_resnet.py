"""Train a torchvision-style ResNet-18 and a U-Net with symgrad's explicit gradients, and with autograd.

Each model is traced from this file (``symgrad.trace``), its gradient module generated into a
temporary folder, bound to the model (``symgrad.bind``) and trained for a few steps of SGD with
momentum on synthetic data; a copy of the same model is trained with plain autograd. The script
prints both loss curves and the largest relative difference of the parameters and buffers at the
end (float64: at most 1e-10, else exit 1)::

    python examples/train_resnet.py                               # both models, float64, CPU, < 1 min
    python examples/train_resnet.py --plot curves.png             # also plot the curves (matplotlib)
    python examples/train_resnet.py --device cuda --amp --dtype float32 --width 64 --size 224 --batch 32
    torchrun --nproc_per_node=2 examples/train_resnet.py --distributed   # DDP, gloo on CPU

Under ``--distributed`` each rank trains on its share of every batch and DistributedDataParallel
averages the gradients, for the bound step and for the autograd model alike (BatchNorm statistics
stay per rank, as without symgrad); rank 0 compares the two.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import symgrad
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """torchvision's ResNet layout: 7x7 stem, max-pool, four stages of blocks, average pool, linear."""

    def __init__(self, block, layers, width=64, num_classes=10):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(block, width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(block, width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8 * block.expansion, num_classes)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.inplanes, planes))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def ResNet18(width=64, num_classes=10):
    return ResNet(BasicBlock, [2, 2, 2, 2], width, num_classes)


def ResNet50(width=64, num_classes=10):
    return ResNet(Bottleneck, [3, 4, 6, 3], width, num_classes)


class DoubleConv(nn.Sequential):
    def __init__(self, in_channels, out_channels):
        super().__init__(
            nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
        )


class UNet(nn.Module):
    """A two-level U-Net for restoration: max-pool down, bilinear up, skips concatenated."""

    def __init__(self, channels=1, width=64):
        super().__init__()
        self.inc = DoubleConv(channels, width)
        self.down1 = nn.Sequential(nn.MaxPool2d(2), DoubleConv(width, 2 * width))
        self.down2 = nn.Sequential(nn.MaxPool2d(2), DoubleConv(2 * width, 4 * width))
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.conv_up1 = DoubleConv(6 * width, 2 * width)
        self.conv_up2 = DoubleConv(3 * width, width)
        self.outc = nn.Conv2d(width, channels, kernel_size=1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x = self.conv_up1(torch.cat([x2, self.up(x3)], dim=1))
        x = self.conv_up2(torch.cat([x1, self.up(x)], dim=1))
        return self.outc(x)


def generated_module(model: nn.Module, name: str, shapes: dict, loss: LossChoice, folder: Path):
    """Trace ``model`` (in train mode), generate its gradient module into ``folder`` and import it."""
    # a training step needs the parameters' gradients only: none of the input is computed
    built = build_text(
        trace(model, shapes, wrt="parameters", name=name, loss=loss, mode="train"), f"{name}.yaml", documents=False
    )  # the module alone: the derivation's pages are for reading
    path = folder / f"{name}.py"
    path.write_text(built.rendered.files[f"{name}.py"])
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def batches(kind: str, steps: int, batch: int, size: int, dtype, device, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        if kind == "resnet18":
            images = torch.randn(batch, 3, size, size, generator=generator, dtype=dtype)
            yield {"x": images.to(device), "labels": torch.randint(0, 10, (batch,), generator=generator).to(device)}
        else:  # denoising: the clean image is a smooth field, the input a noisy copy of it
            clean = F.avg_pool2d(torch.randn(batch, 1, size, size, generator=generator, dtype=dtype), 5, 1, 2)
            noisy = clean + 0.1 * torch.randn(clean.shape, generator=generator, dtype=dtype)
            yield {"x": noisy.to(device), "target": clean.to(device)}


def train(kind: str, args, folder: Path) -> tuple[list[float], list[float], float]:
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = (ResNet18(args.width) if kind == "resnet18" else UNet(1, args.width)).to(dtype)
    traced_size = 32 if kind == "resnet18" else 16  # traced small; trained at --size: the code is shape-generic
    shapes = {"x": (2, 3, traced_size, traced_size) if kind == "resnet18" else (2, 1, traced_size, traced_size)}
    loss = LossChoice("cross_entropy", "labels") if kind == "resnet18" else LossChoice("mse_loss", "target")
    generated = generated_module(model, f"{kind}_gradients", shapes, loss, folder)
    reference = copy.deepcopy(model).to(args.device)
    model = model.to(args.device)
    step = symgrad.bind(generated, model)
    plain = reference
    if args.distributed:  # DDP averages the gradients of both, as it would without symgrad
        step = nn.parallel.DistributedDataParallel(step)
        plain = nn.parallel.DistributedDataParallel(reference)
    autograd_step = (
        (lambda x, labels: F.cross_entropy(plain(x), labels))
        if kind == "resnet18"
        else (lambda x, target: F.mse_loss(plain(x), target))
    )
    optimizers = [torch.optim.SGD(m.parameters(), lr=args.lr, momentum=0.9) for m in (model, reference)]
    scalers = [torch.amp.GradScaler(args.device, enabled=args.amp and args.device == "cuda") for _ in range(2)]
    curves: tuple[list[float], list[float]] = ([], [])
    rank, world = (torch.distributed.get_rank(), torch.distributed.get_world_size()) if args.distributed else (0, 1)
    for data in batches(kind, args.steps, args.batch, args.size, dtype, args.device):
        data = {key: value.chunk(world)[rank] for key, value in data.items()}  # each rank its share
        for curve, function, optimizer, scaler in zip(curves, (step, autograd_step), optimizers, scalers):
            optimizer.zero_grad()
            with torch.autocast(args.device, enabled=args.amp, dtype=torch.bfloat16 if args.device == "cpu" else None):
                value = function(**data)
            scaler.scale(value).backward()
            scaler.step(optimizer)
            scaler.update()
            curve.append(value.item())
    trained = model.state_dict()
    difference = 0.0
    for key, expected in reference.state_dict().items():
        if expected.is_floating_point():
            scale = expected.abs().max().item() or 1.0
            difference = max(difference, (trained[key] - expected).abs().max().item() / scale)
        elif not torch.equal(trained[key], expected):
            difference = float("inf")
    return curves[0], curves[1], difference


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("resnet18", "unet", "both"), default="both")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--size", type=int, default=40, help="image size to train at (the trace uses a small one)")
    parser.add_argument("--width", type=int, default=4, help="channels of the first stage (torchvision: 64)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--amp", action="store_true", help="autocast: bfloat16 on the CPU, float16 (+ GradScaler) on CUDA"
    )
    parser.add_argument("--distributed", action="store_true", help="run under torchrun with DistributedDataParallel")
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--plot", help="write the loss curves to this image file (needs matplotlib)")
    args = parser.parse_args(argv)
    if args.distributed:
        torch.distributed.init_process_group(args.backend)
    kinds = ("resnet18", "unet") if args.model == "both" else (args.model,)
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for kind in kinds:
            results[kind] = train(kind, args, Path(folder))
    if args.distributed:
        torch.distributed.destroy_process_group()
    failed = False
    tolerance = 1e-10 if args.dtype == "float64" and not args.amp else None
    for kind, (explicit, autograd, difference) in results.items():
        verdict = "" if tolerance is None else (" [ok]" if difference <= tolerance else f" [above {tolerance}]")
        # one write per model: under torchrun the ranks share stdout, and their lines must not interleave
        sys.stdout.write(
            f"{kind}: loss with symgrad.bind  "
            + " ".join(f"{value:.6f}" for value in explicit)
            + "\n"
            + f"{kind}: loss with autograd      "
            + " ".join(f"{value:.6f}" for value in autograd)
            + "\n"
            + f"{kind}: largest relative difference of parameters and buffers after {args.steps} steps: "
            f"{difference:.2e}{verdict}\n"
        )
        sys.stdout.flush()
        failed |= tolerance is not None and difference > tolerance
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.5), squeeze=False)
        for axis, (kind, (explicit, autograd, _)) in zip(axes[0], results.items()):
            axis.plot(explicit, "o-", label="symgrad.bind (explicit backward)")
            axis.plot(autograd, "x--", label="autograd")
            axis.set(title=kind, xlabel="step", ylabel="loss")
            axis.legend()
        figure.tight_layout()
        figure.savefig(args.plot, dpi=100)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
