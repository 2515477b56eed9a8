"""``python -m benchmarks.keep_policy``: the bound training step with ``--keep all`` and ``--keep lean``
beside autograd (issue 65 item 1): step time (medians of round-robin repeats in one process) and peak
memory (each variant's step in a fresh process, as ``benchmarks.training`` measures it), and the bytes
the saving forward keeps for the backward (distinct storages of ``_forward_saving``'s list).

    python -m benchmarks.keep_policy                                  # ResNet-18 and -50 at 4 x 112²
    python -m benchmarks.keep_policy --networks resnet50 --repeats 7 --channels-last
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from .measure import peak_growth_bytes, round_robin
from .training import MEMORY_ENVIRONMENT, ROOT, _example, _network

KEEPS = ("all", "lean")


def steps(network: str, batch: int, size: int, width: int, folder: Path, channels_last: bool = False) -> dict:
    """{variant: one SGD step}: the bound step of each keep policy's module, and autograd's, each with its
    own copy of the model; also ``saved_bytes``: {variant: bytes its saving forward keeps}."""
    from symgrad.pipeline import build_text
    from symgrad.trace import trace

    example = _example()
    torch.manual_seed(0)
    model = _network(network, width).train()
    loss = example.LossChoice("cross_entropy", "labels")
    text = trace(model, {"x": (2, 3, 32, 32)}, wrt="parameters", name=f"{network}_step", loss=loss, mode="train")
    modules = {}
    for keep in KEEPS:
        name = f"{network}_{keep}"
        path = folder / f"{name}.py"
        path.write_text(
            build_text(text, f"{name}.yaml", documents=False, tests=False, keep=keep).rendered.files[
                f"{network}_step.py"
            ]
        )
        modules[keep] = path
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, size, size, generator=generator)
    labels = torch.randint(0, 10, (batch,), generator=generator)
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    variants, saved = {}, {}
    for variant in [f"symgrad.bind, keep {keep}" for keep in KEEPS] + ["autograd"]:
        net = copy.deepcopy(model)
        optimizer = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
        if variant.startswith("symgrad"):
            keep = variant.rpartition(" ")[2]
            bound = example.symgrad.bind(modules[keep], net)
            compute = lambda bound=bound: bound(x=x, labels=labels)
            saved[variant] = _saved_bytes(bound, net, x, labels)
        else:
            compute = lambda net=net: F.cross_entropy(net(x), labels)

        def one_step(compute=compute, optimizer=optimizer):
            optimizer.zero_grad(set_to_none=True)
            value = compute()
            value.backward()
            optimizer.step()
            return value.detach()

        variants[variant] = one_step
    return variants, saved


def _saved_bytes(bound, net, x, labels) -> int:
    """The bytes of the distinct storages the bound module's saving forward keeps for the backward."""
    module = bound.generated if hasattr(bound, "generated") else bound.module
    params = {key: value.detach().clone() for key, value in net.state_dict().items() if value.is_floating_point()}
    with torch.no_grad():
        _, *kept = module._forward_saving(x, labels, params)
    storages = {}

    def visit(value):
        if isinstance(value, torch.Tensor):
            storages[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
        elif isinstance(value, (list, tuple)):
            for part in value:
                visit(part)

    visit(kept)
    return sum(storages.values())


def _memory(arguments: list) -> None:
    """A fresh process's peak growth over one step of one variant (after two warm-up steps)."""
    network, batch, size, width, channels_last, variant = arguments
    with tempfile.TemporaryDirectory() as folder:
        functions, _ = steps(network, batch, size, width, Path(folder), channels_last)
        function = functions[variant]
        function(), function()
        print(json.dumps({"peak_bytes": peak_growth_bytes(function, "cpu")}))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--networks", nargs="+", default=["resnet18", "resnet50"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--size", type=int, default=112)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--memory", help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.memory:
        _memory(json.loads(arguments.memory))
        return 0
    torch.manual_seed(0)
    layout = "channels_last" if arguments.channels_last else "default layout"
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs; float32, "
        f"{layout}, batch {arguments.batch} x {arguments.size}², medians of {arguments.repeats} round-robin repeats"
    )
    print(
        "| network | variant | median ms | speed vs autograd | peak MiB | memory vs autograd | kept for the "
        "backward MiB |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for network in arguments.networks:
        with tempfile.TemporaryDirectory() as folder:
            functions, saved = steps(
                network, arguments.batch, arguments.size, arguments.width, Path(folder), arguments.channels_last
            )
            samples = round_robin(functions, arguments.repeats)
        medians = {name: statistics.median(values) for name, values in samples.items()}
        peaks = {
            name: json.loads(
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "benchmarks.keep_policy",
                        "--memory",
                        json.dumps(
                            [network, arguments.batch, arguments.size, arguments.width, arguments.channels_last, name]
                        ),
                    ],
                    cwd=ROOT,
                    check=True,
                    capture_output=True,
                    text=True,
                    env={**os.environ, **MEMORY_ENVIRONMENT},
                ).stdout.splitlines()[-1]
            )["peak_bytes"]
            for name in functions
        }
        for name in functions:
            kept = f"{saved[name] / 2**20:.1f}" if name in saved else ""
            print(
                f"| {network} | {name} | {medians[name] * 1e3:.1f} | {medians['autograd'] / medians[name]:.2f}× | "
                f"{peaks[name] / 2**20:.1f} | {peaks[name] / max(peaks['autograd'], 1):.2f}× | {kept} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
