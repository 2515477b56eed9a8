"""``python -m benchmarks.casts``: the casts and copies of one training step, the bound step's against autograd's.

Each aten op a step dispatches is counted (a ``TorchDispatchMode``: the ops autocast, autograd's engine and
the generated module call, not the ones a kernel calls inside itself, so a ``_to_copy``'s own ``copy_`` is not
counted again, as the profiler counts it), for eager autograd and the bound step of each ``--keep`` policy,
one SGD step (``zero_grad``, forward, loss, backward, step: :func:`benchmarks.keep_policy.step`) after a first
one. Op counts do not depend on the machine's speed, so a small size shows them (the step's structure is the
same at any batch and image size). Each ``_to_copy`` and ``copy_`` is listed by what it casts (dtypes, shape)
and where: the generated module's line that made it, else ``engine`` (autocast inside an aten call, or
autograd's engine); a ``_to_copy`` to the meta device (``relu.to("meta")``, a layout kept, no data) is
counted apart.

    python -m benchmarks.casts                                  # ResNet-18, AMP and float32, both layouts
    python -m benchmarks.casts --networks vit unet --precisions AMP --layouts default
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import traceback
from pathlib import Path

from torch.utils._python_dispatch import TorchDispatchMode

from . import keep_policy

CASTS = ("_to_copy", "copy_")
VARIANTS = ("autograd", "symgrad.bind, keep all", "symgrad.bind, keep lean")
SMALL = {"resnet18": (2, 32, 8), "resnet50": (2, 32, 8), "unet": (2, 32, 4), "vit": (2, 32, 48), "convnext": (2, 32, 8)}
"""{network: (batch, image size, width)}: small enough for a CPU without AVX-512's bfloat16 convolutions."""


class Counting(TorchDispatchMode):
    """Every aten op dispatched inside it, by name; each cast or copy by (op, what, where)."""

    def __init__(self, files: set[str]):
        super().__init__()
        self.files = files
        self.ops: collections.Counter = collections.Counter()
        self.casts: list[tuple[str, str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name == "_to_copy" and str(kwargs.get("device", "")) == "meta":
            name = "_to_copy (to meta)"
        self.ops[name] += 1
        if name in CASTS:
            self.casts.append((name, _what(name, args, kwargs), self._where()))
        return func(*args, **kwargs)

    def _where(self) -> str:
        """The generated module's line that made it, and where that is a helper's, the line that called it."""
        frames = [frame for frame in reversed(traceback.extract_stack()) if frame.filename in self.files][:2]
        if not frames:
            return "engine"
        where = f"{Path(frames[0].filename).name}:{frames[0].lineno}: {frames[0].line}"
        return where + (f" (called at {frames[1].lineno}: {frames[1].line})" if len(frames) > 1 else "")


def _dtype(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _what(name: str, args, kwargs) -> str:
    value = args[0]
    if name == "copy_":
        return f"{_dtype(args[1].dtype)} -> {_dtype(value.dtype)} {list(value.shape)}"
    return f"{_dtype(value.dtype)} -> {_dtype(kwargs.get('dtype', value.dtype))} {list(value.shape)}"


def counted(row: tuple, variant: str, precision: str, layout: str, modules: dict) -> Counting:
    """The ops of ``variant``'s second step (the first warms what a first call makes once)."""
    function, _ = keep_policy.step(row, variant, precision, layout, modules, count_kept=False)
    function()
    counting = Counting({str(path) for path in modules.values()})
    with counting:
        function()
    return counting


def report(network: str, precision: str, layout: str, folder: Path) -> str:
    """The ops whose counts differ between the variants (and every cast), then each variant's casts
    beyond autograd's, by what they cast and the line that made them."""
    batch, size, width = SMALL[network]
    row = (network, batch, size, width)
    modules = keep_policy.write_modules(network, width, size, folder)
    found = {variant: counted(row, variant, precision, layout, modules) for variant in VARIANTS}
    lines = [f"## {network} {batch} x {size}², width {width}, {precision}, {layout}", ""]
    lines += ["| op | " + " | ".join(VARIANTS) + " |", "|---|" + "---:|" * len(VARIANTS)]
    for name in sorted(set().union(*(counting.ops for counting in found.values()))):
        counts = [found[variant].ops[name] for variant in VARIANTS]
        if len(set(counts)) > 1 or name in CASTS:
            lines.append(f"| {name} | " + " | ".join(map(str, counts)) + " |")
    eager = collections.Counter((name, what) for name, what, _ in found["autograd"].casts)
    for variant in VARIANTS[1:]:
        mine = collections.Counter((name, what) for name, what, _ in found[variant].casts)
        extra, fewer = mine - eager, eager - mine
        lines += ["", f"{variant}: {sum(extra.values())} casts beyond autograd's, {sum(fewer.values())} fewer"]
        # a cast of the same (dtypes, shape) as one of autograd's counts as the first of them: the later
        # ones (in the step's order) are the extra ones
        sites: collections.Counter = collections.Counter()
        for name, what, where in reversed(found[variant].casts):
            if extra[name, what]:
                extra[name, what] -= 1
                sites[name, what, where] += 1
        for (name, what, where), count in sorted(sites.items(), key=lambda item: item[0][2]):
            lines.append(f"- {count} x {name} {what}: {where}")
        for (name, what), count in sorted(fewer.items()):
            lines.append(f"- {count} fewer: {name} {what}")
    return "\n".join(lines + [""])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--networks", nargs="+", default=["resnet18"], choices=sorted(SMALL))
    parser.add_argument("--precisions", nargs="+", default=["AMP", "float32"], choices=keep_policy.PRECISIONS)
    parser.add_argument("--layouts", nargs="+", default=list(keep_policy.LAYOUTS), choices=keep_policy.LAYOUTS)
    parser.add_argument("--folder", help="where the generated modules are written (default: a temporary folder)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(args.folder or temporary)
        folder.mkdir(parents=True, exist_ok=True)
        for network in args.networks:
            for precision in args.precisions:
                for layout in args.layouts:
                    print(report(network, precision, layout, folder), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
