"""``python -m benchmarks.compiled_parity``: the bound model under ``torch.compile`` against the model under
``torch.compile`` with autograd (issue 65 item 3), one training step each (zero_grad, forward, loss, backward,
SGD step), alternating in one process.

- ``autograd, torch.compile``: ``torch.compile(model)``, the loss and ``.backward()`` after it (AOTAutograd
  compiles the backward);
- ``symgrad.bind, torch.compile``: ``torch.compile(symgrad.bind(outputs_module, model), fullgraph=True)``, the
  module traced without the loss (the bound model's outputs form), the loss after it in autograd;
- ``autograd`` and ``symgrad.bind``: the same two eager, for scale.

Each variant's first step (Dynamo, AOTAutograd and Inductor compiling its forward and backward, into a cache
folder of its own: no variant reuses the C++ kernels another built) is timed apart and reported as the
first-compile time, with the part of it Dynamo spent tracing Python (``bytecode_tracing``) and Dynamo's graph,
graph-break and recompile counts for that variant; then ``--repeats`` rounds of one step of each, the order
rotated every round (medians). Ratio: ``torch.compile(model)``'s median over the compiled bound model's (> 1:
the bound model is faster).

    OMP_NUM_THREADS=1 python -m benchmarks.compiled_parity     # ResNet-18, ResNet-50, ViT, U-Net, ConvNeXt
    OMP_NUM_THREADS=1 python -m benchmarks.compiled_parity --networks vit --repeats 11
    python -m benchmarks.compiled_parity --graphs --networks resnet18   # the ops that differ, no timing
    OMP_NUM_THREADS=1 python -m benchmarks.compiled_parity --guards --networks resnet18   # Dynamo's guard check alone
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .measure import round_robin
from .training import ROOT, _example, _network

ROWS = {  # network: (batch, image size, width); small CPU sizes (each compile takes minutes on 2 cores)
    "resnet18": (4, 64, 64),
    "vit": (4, 64, 128),
    "unet": (4, 64, 32),
    "convnext": (4, 64, 24),
    "resnet50": (4, 64, 64),
}
VARIANTS = ("autograd, torch.compile", "symgrad.bind, torch.compile", "autograd", "symgrad.bind")


def _model(network: str, width: int, size: int) -> torch.nn.Module:
    if network != "vit":
        return _network(network, width)
    sys.path.insert(0, str(ROOT))
    from tests.models.zoo_attention import VisionTransformer

    # ViT-Tiny-like at a CPU size: 8x8 patches, 4 blocks of 4 heads (the position embedding fixes the image size)
    return VisionTransformer(
        img_size=size, patch_size=8, num_classes=10, embed_dim=width, depth=4, num_heads=4, mlp_ratio=4.0
    )


def _outputs_module(model, network: str, traced: tuple, folder: Path, keep: str | None) -> Path:
    """``model`` traced without a loss (the bound model's outputs form) and generated into ``folder``."""
    from symgrad.pipeline import build_text
    from symgrad.trace import trace

    name = f"{network}_outputs"
    path = folder / f"{name}.py"
    text = trace(model, {"x": traced}, wrt="parameters", name=name, mode="train")
    path.write_text(
        build_text(text, f"{name}.yaml", documents=False, tests=False, keep=keep).rendered.files[f"{name}.py"]
    )
    return path


def steps(network: str, folder: Path, keep: str | None = None, names=VARIANTS) -> dict:
    """{variant: one SGD step} of ``network`` at its :data:`ROWS` size, each variant with its own model copy."""
    example = _example()
    batch, size, width = ROWS[network]
    torch.manual_seed(0)
    model = _model(network, width, size).train()
    classify = network != "unet"
    channels = 3 if classify else 1
    traced = (2, channels, size, size) if network == "vit" else (2, channels, 32, 32)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(batch, channels, size, size, generator=generator)
    target = (
        torch.randint(0, 10, (batch,), generator=generator)
        if classify
        else torch.randn(batch, 1, size, size, generator=generator)
    )
    module = None

    def loss_of(net):
        prediction = net(x)
        return F.cross_entropy(prediction, target) if classify else F.mse_loss(prediction, target)

    variants = {}
    for variant in names:
        net = copy.deepcopy(model)
        optimizer = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
        if variant.startswith("symgrad"):
            module = module or _outputs_module(model, network, traced, folder, keep)
            runner = example.symgrad.bind(module, net, verify=False)
            if "torch.compile" in variant:
                runner = torch.compile(runner, fullgraph=True)
        else:
            runner = torch.compile(net) if "torch.compile" in variant else net

        def one_step(runner=runner, optimizer=optimizer):
            optimizer.zero_grad(set_to_none=True)
            value = loss_of(runner)
            value.backward()
            optimizer.step()
            return value.detach()

        one_step.runner, one_step.x = runner, x  # for guard_costs
        variants[variant] = one_step
    return variants


def _warm_up() -> None:
    """Compile a tiny step once, so that what any first compile in a process pays (imports, the compile
    workers) falls on no variant; Inductor's caches off, so each first step compiles from nothing."""
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    weight = torch.randn(4, 4, requires_grad=True)
    torch.compile(lambda x: (x @ weight).relu().sum())(torch.randn(2, 4)).backward()


def first_steps(functions: dict, folder: Path) -> dict:
    """{variant: (seconds of its first step, Dynamo's counters it added)}; the first step of a compiled
    variant compiles it, each into its own Inductor cache folder under ``folder`` (Inductor's in-memory
    caches cleared): no variant loads the C++ kernels another built."""
    from torch._dynamo.utils import compilation_time_metrics, counters
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    _warm_up()

    found = {}
    for index, (name, function) in enumerate(functions.items()):
        before = {key: sum(values.values()) for key, values in counters.items()}
        graphs = counters["stats"]["unique_graphs"]
        traced = sum(compilation_time_metrics.get("bytecode_tracing", []))
        (folder / f"inductor-{index}").mkdir()
        with temporary_cache_dir(str(folder / f"inductor-{index}")):
            start = time.perf_counter()
            function()
            seconds = time.perf_counter() - start
        after = {key: sum(values.values()) for key, values in counters.items()}
        found[name] = (
            seconds,
            {
                "graphs": counters["stats"]["unique_graphs"] - graphs,
                "graph breaks": after.get("graph_break", 0) - before.get("graph_break", 0),
                "recompiles": after.get("recompiles", 0) - before.get("recompiles", 0),
                "tracing s": sum(compilation_time_metrics.get("bytecode_tracing", [])) - traced,
            },
        )
    return found


def graph_differences(network: str, folder: Path, keep: str | None = None) -> list[str]:
    """The ops whose counts differ between the two compiled steps' forward and backward graphs, as
    AOTAutograd hands them to Inductor (Inductor's decompositions, its min-cut partitioner), without
    compiling them (a few seconds): one line per graph and per op that differs."""
    import collections

    import torch._inductor.lowering  # noqa: F401 - the decompositions below look it up
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    found = {}

    def backend(variant):
        def compiler(kind):
            def compile_graph(module, inputs):
                nodes = module.graph.nodes
                found[variant, kind] = collections.Counter(
                    str(node.target) for node in nodes if node.op == "call_function"
                )
                return torch._functorch.aot_autograd.make_boxed_func(module)

            return compile_graph

        return lambda module, inputs: aot_module_simplified(
            module, inputs, fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
            partition_fn=min_cut_rematerialization_partition, decompositions=select_decomp_table(),
        )  # fmt: skip

    compile_as = torch.compile
    try:
        torch.compile = lambda function, **options: compile_as(
            function, backend=backend("symgrad.bind" if options else "autograd"), **options
        )
        for function in steps(network, folder, keep, names=VARIANTS[:2]).values():
            function()
    finally:
        torch.compile = compile_as
    lines = []
    for kind in ("forward", "backward"):
        ours, theirs = found["symgrad.bind", kind], found["autograd", kind]
        lines.append(f"{network} {kind}: {sum(theirs.values())} ops (autograd), {sum(ours.values())} (symgrad.bind)")
        lines += [f"    {op}: {theirs[op]} (autograd), {ours[op]} (symgrad.bind)"
                  for op in sorted(set(ours) | set(theirs)) if ours[op] != theirs[op]]  # fmt: skip
    return lines


def guard_costs(network: str, folder: Path, keep: str | None = None, rounds: int = 5, calls: int = 200) -> dict:
    """{variant: (µs per call of Dynamo's guard check, guards, Python lambda guards)} of the two compiled steps'
    frames (compiled with the ``eager`` backend: the guards are Dynamo's, whatever the backend): the check
    timed alone, the least of ``rounds`` loops of ``calls``, as it runs at every call of the compiled model."""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

    compile_as = torch.compile
    try:
        torch.compile = lambda function, **options: compile_as(function, backend="eager", **options)
        functions = steps(network, folder, keep, names=VARIANTS[:2])
        for function in functions.values():
            function()
    finally:
        torch.compile = compile_as
    found = {}
    for name, function in functions.items():
        module = function.runner._orig_mod
        frame = {"self": module, "x": function.x, "args": (function.x,), "kwargs": {}}
        entries = _debug_get_cache_entry_list(type(module).forward.__code__)  # the entry this model's call runs
        manager = next(entry.guard_manager for entry in entries if entry.guard_manager.check(frame))
        best = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(calls):
                manager.check(frame)
            best = min(best, (time.perf_counter() - start) / calls)
        text = str(manager)
        found[name] = (best * 1e6, len(re.findall(r"\+- [A-Z_]+:", text)), text.count("LAMBDA_GUARD"))
    return found


def _load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--networks", nargs="+", default=["resnet18", "resnet50", "vit", "unet", "convnext"], choices=list(ROWS)
    )
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument(
        "--keep", choices=("all", "lean"), help="the bound module's keep policy (default: the generator's)"
    )
    parser.add_argument("--output", help="also append the table to this Markdown file")
    parser.add_argument(
        "--graphs", action="store_true", help="print the ops whose counts differ between the two compiled "
        "steps' forward and backward graphs (compiled by AOTAutograd alone), and time nothing",
    )  # fmt: skip
    parser.add_argument(
        "--guards", action="store_true", help="time Dynamo's guard check of each compiled step's frame alone, "
        "and count its guards (compiled with the eager backend), and time nothing else",
    )  # fmt: skip
    arguments = parser.parse_args(argv)
    if arguments.guards:
        print(f"load average {_load()}; guard check: least of 5 loops of 200 calls")
        for network in arguments.networks:
            with tempfile.TemporaryDirectory() as folder:
                for name, (micros, count, python) in guard_costs(network, Path(folder), arguments.keep).items():
                    print(f"{network} {name}: {micros:.0f} µs per call, {count} guards, {python} in Python", flush=True)
        return 0
    if arguments.graphs:
        for network in arguments.networks:
            with tempfile.TemporaryDirectory() as folder:
                print("\n".join(graph_differences(network, Path(folder), arguments.keep)), flush=True)
        return 0
    commit = (
        subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        or "(no git)"
    )
    now = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}"
    lines = [
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, float32, "
        f"commit {commit}, keep {arguments.keep or 'default'}; {now} UTC, load average {_load()}; "
        f"medians of {arguments.repeats} alternating rounds",
        "",
        "| network | batch × size² | variant | first step s | Dynamo tracing s | graphs / breaks / "
        "recompiles | median ms | speed vs torch.compile(model) |",
        "|---|---|---|---:|---:|---|---:|---:|",
    ]
    print("\n".join(lines), flush=True)
    for network in arguments.networks:
        batch, size, _ = ROWS[network]
        with tempfile.TemporaryDirectory() as folder:
            functions = steps(network, Path(folder), arguments.keep)
            first = first_steps(functions, Path(folder))
            samples = round_robin(functions, arguments.repeats, warmup=1)
        medians = {name: statistics.median(values) for name, values in samples.items()}
        peer = medians["autograd, torch.compile"]
        for name in functions:
            seconds, counted = first[name]
            compiled = "torch.compile" in name
            tracing = f"{counted.pop('tracing s'):.1f}" if compiled else ""
            counts = " / ".join(str(value) for value in counted.values()) if compiled else ""
            line = (
                f"| {network} | {batch} × {size}² | {name} | {seconds:.1f} | {tracing} | {counts} | "
                f"{medians[name] * 1e3:.1f} | {peer / medians[name]:.2f}× |"
            )
            lines.append(line)
            print(line, flush=True)
    lines.append(f"\nload average at the end: {_load()}")
    print(lines[-1])
    if arguments.output:
        with open(arguments.output, "a") as file:
            file.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
