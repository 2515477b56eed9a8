"""Train a small residual CNN on scikit-learn's handwritten digits with symgrad's explicit gradients,
and the same network from the same seed with autograd.

The digits (1,797 grey 8x8 images, bundled with scikit-learn: nothing is downloaded) are split into
1,437 training and 360 test images. The network has a stem, two residual blocks with BatchNorm (the
second downsamples), global average pooling, dropout and a linear head. It is traced once without a
loss (``symgrad.trace_modes``: its train and eval modes), generated into a temporary folder and bound
(``symgrad.bind``): the bound model returns the logits, and the loss (cross-entropy with label
smoothing), the optimizer and the evaluation are plain PyTorch. A deep copy of the model trains with
autograd, each step drawing its dropout masks from the same seed. The script prints both loss curves,
the test accuracy of each after every epoch, and the largest relative difference of the parameters at
the end; in float64 the two runs must agree to 1e-10, else it exits 1::

    python examples/train_digits.py                      # float64, 8 epochs: about 2 min of CPU time (`time`)
    python examples/train_digits.py --dtype float32      # the curves agree to rounding
    python examples/train_digits.py --epochs 1 --steps 4 # a quick check of the agreement
    python examples/train_digits.py --plot digits.png    # both curves and the accuracy (pip install matplotlib)
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import symgrad


class ResidualBlock(nn.Module):
    def __init__(self, in_channels, out_channels, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class DigitsNet(nn.Module):
    def __init__(self, width=16, classes=10, dropout=0.2):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)
        )
        self.block1 = ResidualBlock(width, width)
        self.block2 = ResidualBlock(width, 2 * width, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = self.block2(self.block1(self.stem(x)))
        return self.head(self.dropout(torch.flatten(self.pool(x), 1)))


def digits(dtype):
    """scikit-learn's bundled digits as [N, 1, 8, 8] images scaled to [0, 1], split 1437 / 360."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        sys.exit("error: this example reads scikit-learn's bundled digits (fix: pip install scikit-learn)")
    data = load_digits()
    images = torch.tensor(data.images, dtype=dtype).unsqueeze(1) / 16.0
    labels = torch.tensor(data.target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    images, labels = images[order], labels[order]
    return (images[:1437], labels[:1437]), (images[1437:], labels[1437:])


def bound_copy(model: nn.Module, folder: Path) -> nn.Module:
    """``model`` traced in both modes (no loss: its forward returns the logits), generated into
    ``folder`` and bound."""
    train_spec, eval_spec = symgrad.trace_modes(model, {"x": (4, 1, 8, 8)}, wrt="parameters", name="digits_net")
    for text in (train_spec, eval_spec):
        if text is not None:
            symgrad.generate(text=text, label="digits_net.yaml").write(folder)
    return symgrad.bind(folder / "digits_net.py", model)


def accuracy(model: nn.Module, images, labels) -> float:
    model.eval()
    with torch.no_grad():
        correct = (model(images).argmax(dim=1) == labels).sum().item()
    return correct / len(labels)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=None, help="stop each epoch after this many steps (a quick check)")
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    parser.add_argument("--plot", default=None, help="write both loss curves and the accuracy to this PNG")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    (train_x, train_y), (test_x, test_y) = digits(dtype)

    torch.manual_seed(0)
    model = DigitsNet().to(dtype)
    reference = copy.deepcopy(model)  # trained with autograd from the same weights
    with tempfile.TemporaryDirectory() as folder:
        fast = bound_copy(model, Path(folder))
        runs = {"symgrad": (fast, model), "autograd": (reference, reference)}
        optimizers = {
            name: torch.optim.SGD(trained.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
            for name, (_, trained) in runs.items()
        }
        curves = {name: [] for name in runs}
        accuracies = {name: [] for name in runs}
        step = 0
        for epoch in range(args.epochs):
            order = torch.randperm(len(train_y), generator=torch.Generator().manual_seed(epoch + 1))
            for start in range(0, len(order), args.batch)[: args.steps]:
                batch = order[start : start + args.batch]
                for name, (runner, trained) in runs.items():
                    trained.train()
                    torch.manual_seed(1000 + step)  # the same dropout masks for both
                    logits = runner(train_x[batch])
                    loss = F.cross_entropy(logits, train_y[batch], label_smoothing=0.1)
                    optimizers[name].zero_grad()
                    loss.backward()
                    optimizers[name].step()
                    curves[name].append(loss.item())
                step += 1
            for name, (runner, _) in runs.items():
                accuracies[name].append(accuracy(runner, test_x, test_y))
            print(
                f"epoch {epoch + 1}: loss symgrad {curves['symgrad'][-1]:.6f} autograd {curves['autograd'][-1]:.6f}"
                f"  test accuracy symgrad {accuracies['symgrad'][-1]:.3f} autograd {accuracies['autograd'][-1]:.3f}"
            )

    difference = max(
        ((p - q).abs().max() / q.abs().max().clamp_min(1e-30)).item()
        for p, q in zip(model.state_dict().values(), reference.state_dict().values())
        if p.is_floating_point()
    )
    curve_difference = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(curves["symgrad"], curves["autograd"]))
    print(f"largest relative difference: parameters and buffers {difference:.2e}, loss curve {curve_difference:.2e}")
    print(f"test accuracy: symgrad {accuracies['symgrad'][-1]:.3f}, autograd {accuracies['autograd'][-1]:.3f}")
    if args.plot:
        plot(curves, accuracies, args.plot)
    if dtype == torch.float64 and max(difference, curve_difference) > 1e-10:
        print("error: the two trainings differ by more than 1e-10 in float64", file=sys.stderr)
        return 1
    return 0


def plot(curves: dict, accuracies: dict, path: str) -> None:
    try:
        import matplotlib
    except ImportError:
        sys.exit("error: --plot needs matplotlib (fix: pip install matplotlib, or pip install 'symgrad[plot]')")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, style in (("autograd", dict(lw=3, alpha=0.4)), ("symgrad", dict(lw=1, ls="--"))):
        left.plot(curves[name], label=name, **style)
        right.plot(range(1, len(accuracies[name]) + 1), accuracies[name], marker="o", label=name, **style)
    left.set(xlabel="step", ylabel="training loss (cross-entropy, label smoothing 0.1)", yscale="log")
    right.set(xlabel="epoch", ylabel="test accuracy", ylim=(0.8, 1.0))
    for axes in (left, right):
        axes.legend()
        axes.grid(alpha=0.3)
    figure.suptitle("DigitsNet on scikit-learn's digits: symgrad.bind against autograd, same seed")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
