"""One training step of real networks, explicit gradients against autograd, side by side.

``python -m benchmarks.training`` traces each network of ``examples/train_resnet.py``
(torchvision-style ResNet-18 and ResNet-50, a U-Net), generates its gradient module and times one
training step (zero_grad, forward, backward, SGD step) three ways, round-robin in one process with
the order rotated each round:

- ``symgrad.bind``: ``step(x=..., labels=...).backward()``, the explicit backward;
- ``symgrad.bind, channels_last``: the same with the model and its input in channels_last;
- ``autograd``: ``loss.backward()`` on the model as it is;
- ``autograd, channels_last``: the model and its input in channels_last, autograd's best layout
  on a CPU for convolutions;
- ``autograd, torch.compile``: the model compiled by ``torch.compile`` (Inductor; its backward
  compiled by AOTAutograd), compiled before timing; ``autograd, torch.compile max-autotune`` the same
  with ``mode="max-autotune-no-cudagraphs"`` (in :data:`COMPILED_ROWS`);
- ``symgrad.bind, torch.compile``: the bound model of the module traced without the loss (the outputs
  form, whose step compiles whole: ``torch.compile(fast, fullgraph=True)``), the loss after it in
  autograd (in :data:`COMPILED_ROWS`: each compiles for minutes on 2 cores);
- on CUDA alone, ``symgrad.bind, CUDA graph`` (``bind(..., cuda_graph=True)``: the step captured once,
  replayed) and ``autograd, torch.compile reduce-overhead`` (``mode="reduce-overhead"``: Inductor's CUDA
  graphs), the peer it is fairest against;

and, with ``, AMP`` after the name, the first three under ``torch.autocast("cpu", dtype=torch.bfloat16)``
(the forward under autocast, the backward outside it, as PyTorch's AMP recipe runs them). Each
variant is compared with the best autograd variant of its own precision.

The same steps are timed again at ``QUICK_ROWS``' sizes, where the kernels cost little: what each
pays around its kernels (Python, dispatch, autograd's engine), the bound step against autograd in its
layout and precision. Each variant's peak memory is measured alone, in a fresh process (``--memory``), as the growth of
the peak resident set size over one step after a first one, large blocks mapped and unmapped. Writes a Markdown table and saves the measurements (``--json``);
with ``--output BENCHMARKS.md`` it replaces that file's "Real networks" section, and ``--rows
benchmarks/results/training-cpu.json`` renders the committed run again without measuring.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import gc
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
from .report import machine_description, save_run, write_report, write_section

MEMORY_ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": "65536"}
"""For the peak-memory processes alone (as ``python -m benchmarks``): large blocks are mapped and
unmapped, so the resident set follows what is allocated rather than what glibc keeps."""

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = (
    "symgrad.bind",
    "symgrad.bind, channels_last",
    "autograd",
    "autograd, channels_last",
    "autograd, torch.compile",
    "symgrad.bind, torch.compile",
    "autograd, torch.compile max-autotune",
    "symgrad.bind, AMP",
    "symgrad.bind, channels_last, AMP",
    "autograd, AMP",
    "autograd, channels_last, AMP",
)
CUDA_VARIANTS = (
    "symgrad.bind, CUDA graph",
    "symgrad.bind, channels_last, CUDA graph",
    "autograd, torch.compile reduce-overhead",
    "autograd, channels_last, torch.compile reduce-overhead",
    "symgrad.bind, CUDA graph, AMP",
    "symgrad.bind, channels_last, CUDA graph, AMP",
)
"""Timed on CUDA alone (after :data:`VARIANTS`): the step replayed as CUDA graphs, in both layouts, and
its fairest peer, Inductor's CUDA graphs (``mode="reduce-overhead"``)."""
GRAPHED = ("CUDA graph", "reduce-overhead")
"""The variants whose step replays CUDA graphs: a replay allocates nothing, so the memory its graphs
hold is measured apart (:func:`measure_row`)."""
COMPILED = ("symgrad.bind, torch.compile", "autograd, torch.compile max-autotune")
"""Timed in :data:`COMPILED_ROWS` alone: compiling a whole step takes minutes on 2 CPU cores."""
AMP = ", AMP"
ROWS = [  # (network, batch, image size, width): CPU-sized; the scale rows grow the image and the depth
    ("resnet18", 8, 64, 64),
    ("resnet18", 8, 112, 64),
    ("resnet18", 8, 224, 64),
    ("resnet50", 4, 112, 64),
    ("unet", 4, 128, 32),
    ("convnext", 4, 64, 24),
    ("efficientnet", 8, 64, 0),
    ("mobilenetv3", 8, 64, 0),
]
COMPILED_ROWS = {("resnet18", 8, 112, 64), ("unet", 4, 128, 32)}
"""The CPU rows that time :data:`COMPILED` too (on CUDA: the first :data:`CUDA_COMPILED` rows)."""
NETWORKS = {
    "convnext": "ConvNeXt-T's depths (3, 3, 9, 3), widths WIDTH × (1, 2, 4, 8) (tests/models/zoo.py)",
    "efficientnet": "EfficientNet-B0's first three stages, narrowed: SiLU, depthwise MBConv, SE (tests/models/zoo_nets.py)",
    "mobilenetv3": "torchvision's MobileNetV3 blocks, small: hardswish, depthwise, SE (tests/models/classic.py)",
}
"""The networks beside examples/train_resnet.py's, from the suite's model zoo, as their authors write them."""
CUDA_ROWS = [  # the sizes: ResNet-18 and -50 at 32 x 224², a U-Net of width 64 at 8 x 256²; then scale
    ("resnet18", 32, 224, 64),
    ("unet", 8, 256, 64),
    ("resnet50", 32, 224, 64),
    ("resnet18", 32, 64, 64),
    ("resnet18", 32, 112, 64),
    ("convnext", 32, 224, 96),
    ("efficientnet", 64, 224, 0),
    ("mobilenetv3", 64, 224, 0),
]
CUDA_COMPILED = 3
"""On a GPU ``torch.compile`` is timed in the first rows alone (the target rows): compiling each
network's step takes most of a minute there, and the scale rows keep the lease short."""
QUICK_ROWS = [("resnet18", 2, 32, 8), ("unet", 2, 32, 4)]
SECTION = "## Real networks: one training step"
FAILURES: list[str] = []
"""The variants that raised in this run, one line each (saved and rendered with the rows)."""
SECTIONS = {"cpu": SECTION, "cuda": "## Real networks on a GPU: one training step"}


def _example():
    sys.path.insert(0, str(ROOT / "examples"))
    import train_resnet

    return train_resnet


def step_variants(network: str, batch: int, size: int, width: int, folder: Path, names=VARIANTS, device: str = "cpu"):
    """The training steps ``names`` of ``network`` at ``batch`` x ``size``² on ``device``, each with its
    own model copy (the module is traced and generated on the CPU, as a user generates it once)."""
    example = _example()
    torch.manual_seed(0)
    model = _network(network, width).train()
    classify = network != "unet"
    channels = 3 if classify else 1
    traced = (2, channels, 32, 32) if classify else (2, channels, 16, 16)
    loss = example.LossChoice("cross_entropy", "labels") if classify else example.LossChoice("mse_loss", "target")
    generated = example.generated_module(model, f"{network}_step", {"x": traced}, loss, folder)
    outputs_form = None  # the module traced without the loss, for the compiled bound model
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(batch, channels, size, size, generator=generator)
    target = (
        torch.randint(0, 10, (batch,), generator=generator)
        if classify
        else torch.randn(batch, 1, size, size, generator=generator)
    )
    x, target = x.to(device), target.to(device)
    data = {"x": x, "labels" if classify else "target": target}

    def autograd_loss(net, inputs):
        prediction = net(inputs)
        return F.cross_entropy(prediction, target) if classify else F.mse_loss(prediction, target)

    variants = {}
    for variant in names:
        kind, amp = variant.removesuffix(AMP), variant.endswith(AMP)
        bound = None
        net = copy.deepcopy(model).to(device)
        optimizer = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
        inputs = x
        if "channels_last" in kind:
            net = net.to(memory_format=torch.channels_last)
            inputs = x.contiguous(memory_format=torch.channels_last)
        arguments = {**data, "x": inputs}
        if kind == "symgrad.bind, torch.compile":
            outputs_form = outputs_form or _outputs_module(model, network, traced, folder)
            runner = torch.compile(example.symgrad.bind(outputs_form, net), fullgraph=True)
            compute = lambda runner=runner, inputs=inputs: autograd_loss(runner, inputs)
        elif kind.startswith("symgrad.bind"):
            bound = example.symgrad.bind(generated, net, cuda_graph=kind.endswith("CUDA graph"))
            compute = lambda bound=bound, arguments=arguments: bound(**arguments)
        else:
            mode = kind.partition("torch.compile")[2].strip()
            runner = (
                torch.compile(net, mode={"max-autotune": "max-autotune-no-cudagraphs"}.get(mode, mode) or None)
                if "torch.compile" in kind
                else net
            )
            compute = lambda runner=runner, inputs=inputs: autograd_loss(runner, inputs)

        def one_step(compute=compute, optimizer=optimizer, amp=amp):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
                value = compute()
            value.backward()
            optimizer.step()
            return value.detach()

        one_step.graphed = bound if "CUDA graph" in kind else None  # its graphs captured again to measure them
        # for step_pieces and captured_backward
        one_step.compute, one_step.optimizer, one_step.bound, one_step.arguments = compute, optimizer, bound, arguments
        variants[variant] = one_step
    return variants


def _network(network: str, width: int) -> torch.nn.Module:
    """``network`` at ``width`` (its first stage's channels; the zoo's EfficientNet and MobileNetV3 are
    of one width), with 10 classes."""
    example = _example()
    if network in ("resnet18", "resnet50", "unet"):
        return {
            "resnet18": example.ResNet18,
            "resnet50": example.ResNet50,
            "unet": lambda width: example.UNet(1, width),
        }[network](width)
    sys.path.insert(0, str(ROOT))
    if network == "convnext":
        from tests.models.zoo import ConvNeXt

        return ConvNeXt(
            num_classes=10,
            depths=(3, 3, 9, 3),
            dims=(width, 2 * width, 4 * width, 8 * width),
            layer_scale_init_value=1e-6,
        )
    if network == "efficientnet":
        from tests.models.zoo_nets import EfficientNet

        return EfficientNet(num_classes=10)
    from tests.models.classic import MobileNetV3

    return MobileNetV3(classes=10)


def _outputs_module(model, network: str, traced: tuple, folder: Path) -> Path:
    """The module of ``model`` traced without a loss (the bound model's outputs form), written into
    ``folder``: its path (``torch.compile`` finds a module bound by path again)."""
    from symgrad.pipeline import build_text
    from symgrad.trace import trace

    name = f"{network}_outputs"
    path = folder / f"{name}.py"
    path.write_text(
        build_text(
            trace(model, {"x": traced}, wrt="parameters", name=name, mode="train"), f"{name}.yaml"
        ).rendered.files[f"{name}.py"]
    )
    return path


def peer_of(variant: str) -> str:
    """The autograd variant of the same layout and precision as a bound-step variant."""
    return variant.replace("symgrad.bind", "autograd").replace(", CUDA graph", "")


RUN = 5
"""Steps in a row per variant and round in the around-the-kernels table's second timing (the first
of each run left out): each step then follows one of its own, as in a training loop."""


def measure_overhead(repeats: int, names=VARIANTS, device: str = "cpu") -> list[dict]:
    """Each variant but torch.compile's at :data:`QUICK_ROWS`' sizes, where the kernels cost little:
    the times are mostly what each step pays around them (Python, dispatch, autograd's engine). Timed
    twice: one step per variant and round, as the rows are (each step follows another variant's), and
    in runs of :data:`RUN` steps (each follows its own: ``median_in_run``)."""
    names = [name for name in names if "torch.compile" not in name]
    results = []
    for network, batch, size, width in QUICK_ROWS:
        with tempfile.TemporaryDirectory() as folder:
            functions = step_variants(network, batch, size, width, Path(folder), names, device)
            samples = round_robin(functions, repeats, device=device)
            in_runs = round_robin(functions, max(repeats // 2, 3), warmup=0, device=device, run=RUN)
        results += [
            {
                "network": network,
                "batch": batch,
                "size": size,
                "width": width,
                "variant": name,
                "median": statistics.median(values),
                "min": min(values),
                "median_in_run": statistics.median(in_runs[name]),
            }
            for name, values in samples.items()
        ]
    return results


def render_overhead(rows: list[dict]) -> list[str]:
    """The table of :func:`measure_overhead`: each bound step against autograd in its layout and precision."""
    found = {(row["network"], row["variant"]): row for row in rows}
    lines = [
        "Around the kernels: the same steps at the sizes where the kernels cost little ("
        + ", ".join(
            dict.fromkeys(
                f"{row['network']} of width {row['width']} at {row['batch']} × {row['size']}²" for row in rows
            )
        )
        + "), so the times are mostly what each step pays around them (Python, dispatch, autograd's engine). "
        "Ratio: autograd's median in the same layout and precision over the bound step's. Timed twice: one "
        "step of each variant per round, as the rows above (each step follows another variant's, which "
        "left its own objects and memory in the caches), and, where the run has them, in runs of "
        f"{RUN} steps per variant and round, the first of each left out (each step follows one of its "
        "own, as in a training loop).",
        "",
    ]
    in_runs = all("median_in_run" in row for row in rows)
    head = "| network | variant | median ms | min ms | autograd's median ms | speed vs autograd |"
    lines += (
        [
            head + " median ms in runs | autograd's in runs | speed vs autograd in runs |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        if in_runs
        else [head, "|---|---|---:|---:|---:|---:|"]
    )
    for row in rows:
        peer = found.get((row["network"], peer_of(row["variant"])))
        if row["variant"].startswith("symgrad") and peer:
            line = (
                f"| {row['network']} | {row['variant']} | {row['median'] * 1e3:.2f} | {row['min'] * 1e3:.2f} | "
                f"{peer['median'] * 1e3:.2f} | {peer['median'] / row['median']:.2f}× |"
            )
            if in_runs:
                line += (
                    f" {row['median_in_run'] * 1e3:.2f} | {peer['median_in_run'] * 1e3:.2f} | "
                    f"{peer['median_in_run'] / row['median_in_run']:.2f}× |"
                )
            lines.append(line)
    return lines + [""]


def measure_row(row, repeats: int, names=VARIANTS, device: str = "cpu") -> list[dict]:
    """Every variant of one row, timed round-robin; the peak memory of each, on the CPU in a fresh
    process, on a GPU in this one (``torch.cuda.max_memory_allocated`` counts each step's own)."""
    network, batch, size, width = row
    peaks = {}
    with tempfile.TemporaryDirectory() as folder:
        functions = step_variants(network, batch, size, width, Path(folder), names, device)
        for name, function in list(functions.items()):  # a variant that fails is reported, not timed
            try:
                function()
            except Exception as error:  # noqa: BLE001 - the run goes on and the failure is its row
                print(f"{network} {batch}x{size} {name} failed: {type(error).__name__}: {error}", file=sys.stderr)
                FAILURES.append(
                    f"{network} {batch} × {size}², {name}: {type(error).__name__}: "
                    f"{str(error).splitlines()[0] if str(error) else ''}"
                )
                del functions[name]
        # warm-up calls first: the first compiles (torch.compile) and picks cuDNN's algorithms
        samples = round_robin(functions, repeats, warmup=3 if device == "cuda" else 2, device=device)
        if device == "cuda":
            peaks = {
                name: graphed_peak_bytes(function) if function.graphed else peak_growth_bytes(function, device)
                for name, function in functions.items()
            }
    results = []
    for name, values in samples.items():
        if name not in peaks:
            peaks[name] = json.loads(
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "benchmarks.training",
                        "--memory",
                        json.dumps([network, batch, size, width, name]),
                    ],
                    cwd=ROOT,
                    check=True,
                    capture_output=True,
                    text=True,
                    env={**os.environ, **MEMORY_ENVIRONMENT},
                ).stdout
            )["peak_bytes"]
        results.append(
            {
                "network": network,
                "batch": batch,
                "size": size,
                "width": width,
                "variant": name,
                "median": statistics.median(values),
                "min": min(values),
                "max": max(values),
                "peak_bytes": peaks[name],
                **({"pool_uncounted": True} if device == "cuda" and "reduce-overhead" in name else {}),
            }
        )
    return results


def graphed_peak_bytes(function) -> int:
    """The peak memory of a step bound with ``cuda_graph=True``, its graphs included: they are dropped
    and captured again inside the measured step (warm-up, capture and the first replay), since a replay
    allocates nothing and its graphs' memory pool is held from the capture on."""
    function.graphed._graphs.clear()
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return peak_growth_bytes(function, "cuda")


WHY_CPU = (
    "*Why the targets are missed on this CPU.* Run of 2026-11-29, 03:40-04:00, at commit 3b0f727 (a "
    "max pool's argmax indices kept in int16, symgrad/kept.py; under AMP a product's input gradient cast "
    "back to its input's dtype), the machine about 1.7x as slow as in the run before (eager autograd on "
    "ResNet-18 at 8 x 112²: 140.6 ms against 79.6 at d0057a8), load below 1 but for the run's own processes: "
    "one of sixteen rows meets the target (ResNet-50 under AMP in channels_last, 1.01x the speed and 0.86x "
    "the memory). Memory meets it layout for layout everywhere (the bound step keeps 0.79-0.87x autograd's "
    "peak on ResNet-18, 0.95x on ResNet-50 and 0.89-0.90x on the U-Net in float32), but the rows judge the "
    "faster layout against the leanest autograd step, and speed misses by a few per cent: layout for layout "
    "the bound step ran 0.94-1.00x autograd's speed in float32 on the ResNets and the U-Net, 0.96-1.01x under "
    "AMP, and 0.86-1.02x on the ConvNeXt, EfficientNet and MobileNetV3 rows (small steps, 10-40 ms at 64²); "
    "rows move by several per cent between runs on this shared machine (the run before, at d0057a8, read "
    "0.95-1.00x, 0.92-0.98x and 0.90-0.98x). "
    "Speed: in the same layout the bound step and autograd run the same convolution, normalisation, "
    "activation, pool and upsample kernels. "
    "Under AMP the bound step casts each convolution weight to bfloat16 twice a step (autocast's cast in the "
    "forward, `_convolution_backward`'s in the backward) where autograd keeps the forward's copy. Casting "
    "each weight once, as autograd does, was tried twice (2026-11-27 in the forward, 2026-11-28 in the "
    "autograd.Function's forward, the copies handed to the backward): the step then makes 20 fewer copies on "
    "ResNet-18 and its kernels take 3.4 ms less of a 27 ms step at 4 x 32² under the profiler, but timed in "
    "three processes, each alternating the two modules and autograd, it ran 0.84x, 0.78x and 0.94x the "
    "module without it in one step per round and 0.86x, 0.78x and 1.05x in runs of four (the 20 copies, "
    "made together and held across the step, land on fresh pages under glibc's allocator); both one-off "
    "comparisons with code that is not committed, so it is not built. Around the kernels (the table above) "
    "the bound step runs 0.84-0.92x autograd's speed one step per round, and 0.86-0.93x in runs of five "
    "(0.86-0.91x and 0.87-0.96x in the run before), "
    "where each step follows its own as in a training loop: the gap is not only the caches the other "
    "variants' steps evict. Timed piece by piece in runs of steps (a one-off script, not a committed "
    "command) on ResNet-18 of width 8 at 2 x 32² in float32: the bound forward took 1.48 ms against "
    "autograd's 1.67 (the guard about 120 us of it, the batch count 60 us, which autograd's BatchNorms pay "
    "too) and the backward 2.59 ms against 2.19: its body alone, the same `convolution_backward`, "
    "`native_batch_norm_backward` and `threshold_backward` calls autograd makes (151 aten calls against "
    "160), took 2.34 ms, more than autograd's whole backward, engine and gradient accumulation included, "
    "each kernel called from Python where autograd's engine calls it from C++; run alone on the same "
    "arguments the 20 convolution backwards took as long as autograd's (1.63 against 1.68 ms), so what "
    "differs is the Python between them and the state they find. A C++ or compiled backward node would "
    "remove that Python; neither is built. The compiled bound model ran 1.08x compiled autograd's speed on "
    "ResNet-18 at 112² (150.2 against 162.8 ms) and 0.92x on the U-Net (343.4 against 315.1 ms), with "
    "1.03x and 1.00x its memory (61.8 against 60.2 MiB, 134.5 against 134.3); at d0057a8, when the saving "
    "forward still made its masks while torch.compile traced it, 0.91x and 0.81x (since d81b528 it keeps the "
    "ReLU output itself there: Inductor's partitioner decides what its graph keeps, and a mask is one more "
    "value its graphs carry). Both compiled steps are slower than the eager ones on 2 cores "
    "(`torch.compile`'s CPU convolutions are oneDNN's too). Memory: layout for layout the bound step keeps "
    "0.79-0.95x autograd's peak in float32 for the ResNets and the U-Net (the stem's and the encoder's ReLU "
    "outputs kept as a byte mask and a layout, the decoder's before an upsampling as a mask, the max pools' "
    "argmax indices in int16: ResNet-18 at 8 x 224² 137.9 -> 128.7 MiB, the U-Net 165.8 -> 161.6, one-off "
    "before and this run after) and 0.57-0.90x under AMP (bfloat16 values where autograd's casts keep "
    "float32 copies); where a ResNet or U-Net row misses on memory, its faster layout, channels_last, is set "
    "against autograd's leaner default layout (ResNet-18 at 112²: 36.9 against 36.8 MiB), whose kernels keep "
    "more scratch outside the tensors (the peak of autograd's step's tensors, counted by a dispatch mode on "
    "ResNet-18 at 8 x 112², is 51.0 MiB in both layouts; a one-off count), or against `torch.compile`, the "
    "leanest step for the U-Net and the zoo networks (it recomputes batch norms and activations in its "
    "backward: 134.3 MiB against eager's 163.3 in channels_last for the U-Net, 3.4 against eager's 6.4 for "
    "ConvNeXt). Against eager autograd in the same layout ConvNeXt's bound step keeps 0.47-0.95x, "
    "EfficientNet's 0.75-0.85x and MobileNetV3's 0.76-0.87x (cheap activations computed again in the "
    "backward)."
)
WHY_CUDA = (
    "*Why the targets are missed on this GPU.* Run of 2026-11-27 on an H100 lease (torch 2.11.0+cu130), "
    "at commit ba662f5 with this run's benchmark changes (the bound step's CUDA graphs in both layouts, their "
    "memory measured over a capture); the compiled bound model in `compiled run 2` at fb0b435 (`compiled run "
    "1` shows it failing on torch 2.11 before that fix). Fifteen minutes of device time held the rows above: "
    "ResNet-18 at 32 × 112², ConvNeXt-T, EfficientNet-B0 and MobileNetV3 at 224² and the around-the-kernels "
    "table were cut off by their time limits and are not measured on a GPU. Speed: as CUDA graphs "
    "(`bind(..., cuda_graph=True)`) the bound step runs without its Python: 1.65x the best eager autograd "
    "step on ResNet-18 at 32 × 224² (6.3 against 10.4 ms), 1.72x on ResNet-50 (17.6 against 30.2 ms), "
    "2.41x and 2.67x under AMP, 3.4x on ResNet-18 at 32 × 64², and 1.00x on the U-Net at 8 × 256² (16.1 "
    "against 16.0 ms: its kernels, not its host, bound it); against Inductor's CUDA graphs "
    '(`torch.compile(mode="reduce-overhead")`, the fairest peer: both replay a captured step) it is 0.98x '
    "(6.7 against 6.6 ms channels_last, 1.01x against its default layout's 6.8 ms). Eager, layout for layout, "
    "the bound step is 0.91-1.08x autograd's (its Python, a few hundred statements, costs about what "
    "autograd's engine does at these sizes; the U-Net's default layout 1.29-1.41x, as the generated code runs "
    "its convolutions in channels_last there). Memory: at the target sizes the eager bound step keeps "
    "autograd's peak (0.99-1.00x "
    "in float32 channels_last, 0.95-0.99x under AMP for the ResNets), but the fastest, graphed step needs "
    "1.00-1.19x in float32 and 1.10-1.29x under AMP at the target sizes (3.2-4.8x at 32 × 64², where activations are "
    "small): `torch.cuda.make_graphed_callables` keeps a static gradient buffer for every parameter, which "
    "AccumulateGrad then copies into `.grad`, a static copy of each input, and the capture's own pool (about "
    "one parameter copy plus the input: 43 + 18 MiB for ResNet-18). Inductor's graphs are not comparable "
    "here (†: its pool is not counted by `max_memory_allocated` over a replay). The U-Net's AMP miss is "
    "CUDA's autocast policy: bilinear upsampling runs in float32 and a concatenation promotes to its widest "
    "input (`python -m benchmarks.autocast_policy`), so the convolutions after the concatenations read "
    "float32 tensors, which the generated forward saves where autograd saves the convolution's bfloat16 "
    "copy (1907 against 1623 MiB); the generated forward keeps that copy since this run (a value only a "
    "convolution's backward reads, kept in the dtype the convolution ran in: `_saved_as_autocast_casts`), "
    "not yet measured on a GPU. The compiled bound model ran 0.91x compiled "
    "autograd (13.9 against 12.6 ms, 1.01x its memory), and both were slower than eager channels_last "
    "autograd (10.4 ms)."
)
WHY = {"cpu": WHY_CPU, "cuda": WHY_CUDA}
"""Each device's reasons for its misses, written from its own committed run."""


def render(saved: dict) -> str:
    device = saved.get("device", "cpu")
    networks = {row["network"] for row in saved["rows"]}
    memory = (
        "each peak memory in a fresh process"
        if device == "cpu"
        else "each peak memory from `torch.cuda.max_memory_allocated` over one step, after the timing; a step "
        "bound with `cuda_graph=True` measured over its graphs' capture (warm-up, capture, first replay), "
        "since a replay allocates nothing; † marks a peak that leaves out the memory held by "
        "Inductor's CUDA graphs (not counted in the ratios); "
        "`torch.backends.cudnn.benchmark` on for every variant, TF32 convolutions as PyTorch's default; "
        f"`torch.compile` timed in the first {CUDA_COMPILED} networks' rows"
    )
    lines = [
        SECTIONS[device],
        "",
        f"Machine: {saved['machine']}. Run on {saved['date']}; `python -m benchmarks.training"
        f"{'' if device == 'cpu' else ' --device ' + device}` (medians of "
        f"{saved['repeats']} round-robin repeats in one process; {memory}). The run "
        "drawn, from ResNet-18 at 64² to 224² and to ResNet-50: "
        f"![training step](docs/images/training-{device}.png) (`--plot`).",
        "",
        "One step = `zero_grad`, forward, backward, SGD step, train mode (BatchNorm statistics updated), "
        "networks of `examples/train_resnet.py`"
        + "".join(f"; {name}: {text}" for name, text in NETWORKS.items() if name in networks)
        + (", " if networks & set(NETWORKS) else " ")
        + "traced at a small size and run at the size shown; float32, and "
        f'AMP (the forward under `torch.autocast("{device}", dtype=torch.bfloat16)`). Ratios are against the '
        "best autograd variant of the same precision (the fastest for speed, the leanest for memory): the "
        "default layout, channels_last and, in float32, `torch.compile`.",
        "",
        "| network | batch × image | variant | median ms | min ms | max ms | peak memory | speed vs best autograd "
        "| memory vs best autograd |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    groups: dict[tuple, dict[str, dict]] = {}
    for row in saved["rows"]:
        groups.setdefault((row["network"], row["batch"], row["size"], row.get("tag", "")), {})[row["variant"]] = row
    verdicts = []
    for (network, batch, size, tag), variants in groups.items():
        for amp in (False, True):
            own = {name: row for name, row in variants.items() if name.endswith(AMP) == amp}
            peers = [row for name, row in own.items() if not name.startswith("symgrad")]
            ours_names = [name for name in own if name.startswith("symgrad")]
            if not peers:
                continue
            fastest = min(row["median"] for row in peers)
            # a peak that leaves out a graph pool is never the leanest; none counted: no memory ratio
            leanest = min((row["peak_bytes"] for row in peers if not row.get("pool_uncounted")), default=float("nan"))
            for name, row in own.items():
                mark = " †" if row.get("pool_uncounted") else ""
                lines.append(
                    f"| {network} | {batch} × {size}²{tag and f' ({tag})'} | {name} | {row['median'] * 1e3:.1f} | "
                    f"{row['min'] * 1e3:.1f} | {row['max'] * 1e3:.1f} | {row['peak_bytes'] / 2**20:.1f} MiB{mark} | "
                    f"{fastest / row['median']:.2f}× | {row['peak_bytes'] / leanest:.2f}× |"
                )
            if ours_names:  # symgrad in its best layout, as autograd is
                best = min(ours_names, key=lambda name: own[name]["median"])
                ours = own[best]
                speed, memory = fastest / ours["median"], ours["peak_bytes"] / leanest
                met = speed >= 1.0 and memory <= 1.0
                verdicts.append(
                    f"| {network} {batch} × {size}²{tag and f' ({tag})'}, {'AMP' if amp else 'float32'} | "
                    f"{best} | {speed:.2f}× | "
                    f"{memory:.2f}× | {'met' if met else 'missed'} |"
                )
    lines += [
        "",
        "Target: the bound explicit step, in its faster layout, ≥1.0× the best autograd step's speed and "
        "≤1.0× its memory.",
        "",
        "| row | faster bound step | speed | memory | verdict |",
        "|---|---|---:|---:|---|",
        *verdicts,
        "",
    ]
    if saved.get("failures"):
        lines += ["Variants that raised (not timed):", "", *(f"- {line}" for line in saved["failures"]), ""]
    if saved.get("overhead"):
        lines += render_overhead(saved["overhead"])
    if any(verdict.endswith("| missed |") for verdict in verdicts):
        lines += [WHY[device], ""]
    return "\n".join(lines)


def plot(saved: dict, path: Path) -> None:
    """Time per step and peak memory of every variant, row by row: how each grows from ResNet-18 at
    64² to 224² and to ResNet-50, side by side with autograd's variants."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(dict.fromkeys((row["network"], row["batch"], row["size"]) for row in saved["rows"]))
    names = list(dict.fromkeys(row["variant"] for row in saved["rows"]))
    by_key = {(row["network"], row["batch"], row["size"], row["variant"]): row for row in saved["rows"]}
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(names)
    for index, name in enumerate(names):
        positions = [position + (index - (len(names) - 1) / 2) * width for position in range(len(rows))]
        found = [by_key.get((*row, name)) for row in rows]
        for axis, value in ((axes[0], lambda r: r["median"] * 1e3), (axes[1], lambda r: r["peak_bytes"] / 2**20)):
            axis.bar([p for p, r in zip(positions, found) if r], [value(r) for r in found if r], width, label=name)
    for axis, label in ((axes[0], "median ms per step (log)"), (axes[1], "peak memory, MiB (log)")):
        axis.set_xticks(range(len(rows)), [f"{network}\n{batch} × {size}²" for network, batch, size in rows])
        axis.set_yscale("log")
        axis.set_ylabel(label)
    axes[0].legend(fontsize=7)
    figure.suptitle(f"One training step, {saved['machine']}, {saved['date']}", fontsize=9)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)


def quick_rows_command(argv, doc: str, slug: str, section: str, measure, render, line) -> int:
    """The command of a benchmark timed at :data:`QUICK_ROWS`' sizes in both layouts (``benchmarks.step_pieces``,
    ``benchmarks.captured_backward``): ``measure(network, batch, size, width, layout, rounds)`` makes each row,
    ``line(row)`` says it on stdout, ``render(saved)`` the report's ``section``; the run is saved as JSON
    (``--json``), and ``--rows FILE`` renders a saved run again."""
    layouts = ("default", "channels_last")
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--layouts", nargs="*", default=list(layouts), choices=layouts)
    parser.add_argument("--networks", nargs="*", help="these networks of QUICK_ROWS alone (default: all)")
    parser.add_argument("--output", default=f"out/BENCHMARKS-{slug}.md")
    parser.add_argument("--json", default=f"out/{slug}-cpu.json")
    parser.add_argument("--rows", help="render this saved JSON run again, without measuring")
    args = parser.parse_args(argv)
    if args.rows:
        saved = json.loads(Path(args.rows).read_text())
    else:
        saved = {
            "machine": machine_description("cpu"),
            "date": datetime.date.today().isoformat(),
            "rounds": args.rounds,
            "rows": [],
        }
        for row in QUICK_ROWS:
            if args.networks and row[0] not in args.networks:
                continue
            for layout in args.layouts:
                result = measure(*row, layout, args.rounds)
                print(f"{row[0]:9s} {layout:13s} {line(result)}", flush=True)
                saved["rows"].append(result)
        save_run(saved, args.json)
    write_report(args.output, render(saved), section)
    return 0


def merged(runs: list[dict]) -> dict:
    """Runs of one session as one: the first's description, every run's rows and failures, the last
    around-the-kernels table measured."""
    if len({run.get("device", "cpu") for run in runs}) > 1:
        raise SystemExit("error: the runs are of more than one device (fix: render one device's runs at a time)")
    overheads = [run["overhead"] for run in runs if run.get("overhead")]
    return {
        **runs[0],
        "rows": [row for run in runs for row in run["rows"]],
        "failures": [line for run in runs for line in run.get("failures", [])],
        "overhead": overheads[-1] if overheads else [],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--quick", action="store_true", help="tiny networks and sizes, 3 repeats: a smoke run")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--output", default="out/BENCHMARKS-training.md")
    parser.add_argument(
        "--json",
        help="where the measurements are saved, after each row (default "
        "out/training-DEVICE.json; benchmarks/results/training-DEVICE.json is the committed run)",
    )
    parser.add_argument(
        "--rows",
        nargs="+",
        help="render again from these saved JSON files (runs of one "
        "session, merged: rows, failures, the last around-the-kernels table), without measuring",
    )
    parser.add_argument(
        "--variants",
        nargs="*",
        default=list(VARIANTS + CUDA_VARIANTS),
        choices=VARIANTS + CUDA_VARIANTS,
        metavar="VARIANT",
        help="the variants to time (default: all: " + "; ".join(VARIANTS + CUDA_VARIANTS) + ")",
    )
    parser.add_argument("--networks", nargs="*", help="time these networks' rows alone (default: every row)")
    parser.add_argument("--limit", type=int, help="time the first LIMIT rows alone (after --networks)")
    parser.add_argument(
        "--tag",
        default="",
        help="a label for this run's rows, rendered beside their size "
        "(rows of a separate run, such as the compiled one, kept apart when merged)",
    )
    parser.add_argument("--skip-overhead", action="store_true", help="leave out the around-the-kernels table")
    parser.add_argument("--overhead-only", action="store_true", help="the around-the-kernels table alone, no rows")
    parser.add_argument("--plot", help="also draw the run as a PNG here (matplotlib)")
    parser.add_argument("--memory", help=argparse.SUPPRESS)  # one variant's peak, in this fresh process
    args = parser.parse_args(argv)
    if args.memory:
        network, batch, size, width, variant = json.loads(args.memory)
        with tempfile.TemporaryDirectory() as folder:
            function = step_variants(network, batch, size, width, Path(folder), [variant])[variant]
            function()  # first call: lazy initialisation and optimizer state are not what we measure
            print(json.dumps({"peak_bytes": peak_growth_bytes(function, "cpu")}))
        return 0
    output = Path(args.output)
    if args.rows:
        saved = merged([json.loads(Path(name).read_text()) for name in args.rows])
    else:
        if args.device == "cuda":
            torch.backends.cudnn.benchmark = True  # autograd's best configuration for fixed sizes, for every variant
        repeats = 3 if args.quick else args.repeats
        saved = {
            "machine": machine_description(args.device),
            "device": args.device,
            "date": datetime.date.today().isoformat(),
            "repeats": repeats,
            "rows": [],
            "overhead": [],
        }
        path = Path(args.json or f"out/training-{args.device}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        table = QUICK_ROWS if args.quick else CUDA_ROWS if args.device == "cuda" else ROWS
        table = [row for row in table if not args.networks or row[0] in args.networks][: args.limit]
        table = [] if args.overhead_only else table
        variants = [name for name in args.variants if name not in CUDA_VARIANTS or args.device == "cuda"]
        for index, row in enumerate(table):
            compiled = row in COMPILED_ROWS if args.device == "cpu" else index < CUDA_COMPILED
            names = [
                name
                for name in variants
                if (name not in COMPILED or compiled)
                and ("torch.compile" not in name or args.device == "cpu" or compiled)
            ]
            results = [
                {**result, **({"tag": args.tag} if args.tag else {})}
                for result in measure_row(row, repeats, names, args.device)
            ]
            for result in results:
                print(
                    f"{result['network']:9s} {result['batch']}x{result['size']:<4d} {result['variant']:24s} "
                    f"median {result['median'] * 1e3:8.1f} ms  peak {result['peak_bytes'] / 2**20:7.1f} MiB",
                    flush=True,
                )
            saved["rows"] += results
            saved["failures"] = [line + (f" ({args.tag})" if args.tag else "") for line in FAILURES]
            path.write_text(json.dumps(saved, indent=1))  # a run cut short keeps the rows it measured
        if not args.skip_overhead:
            saved["overhead"] = measure_overhead(3 if args.quick else max(args.repeats, 21), variants, args.device)
        path.write_text(json.dumps(saved, indent=1))
    write_section(output, render(saved), SECTIONS[saved.get("device", "cpu")])
    if args.plot:
        plot(saved, Path(args.plot))
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
