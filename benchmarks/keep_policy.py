"""``python -m benchmarks.keep_policy``: the run that decides ``--keep``'s default (issue 65 items 1-2).

The bound training step with ``--keep all`` and ``--keep lean`` beside eager autograd and
``torch.compile(model)``, for every network the issue's targets name (:data:`ROWS`: ResNet-18 and
ResNet-50 of ``examples/train_resnet.py``, its U-Net, the zoo's ConvNeXt-T and EfficientNet-B0 stages, a
ViT-Ti/16; ``--large``: ResNet-50 at 224² too), in float32 and AMP (the forward under
``torch.autocast("cpu", dtype=torch.bfloat16)``), in the default layout and channels_last. One SGD step (``zero_grad``, forward, loss, backward, step) per call.

- Time: medians of round-robin repeats in one process (the compiled model's too with ``--time-compiled``;
  compiling a network takes minutes on 2 cores, so by default only its peak is measured).
- Peak memory: each variant's step in a fresh process (``--memory``), the growth of the peak resident set
  over one step after two (the compiled model's first call compiles), as ``benchmarks.training`` measures
  it; the generated modules are written once by this process and imported there.
- Kept: the distinct storages of the saving forward's list (what the bound step holds for its backward).

Ratios are in-run: speed against eager autograd's median, memory against eager autograd's peak, in the same
precision and layout; the verdict table judges ``--keep lean`` in its faster layout against the best autograd
variant of its precision (the fastest eager layout; the leanest eager layout; ``torch.compile``'s peak where
measured) by :data:`TARGETS`.

    python -m benchmarks.keep_policy                      # every row (the run BENCHMARKS.md's section reads)
    python -m benchmarks.keep_policy --networks resnet18 --precisions float32 --layouts default --repeats 3
    python -m benchmarks.keep_policy --smoke              # every network, tiny: the script works
    python -m benchmarks.keep_policy --rows out/keep-policy-cpu.json   # render a saved run again
    python -m benchmarks.keep_policy --precisions float32 --json out/f32.json     # the run in two halves,
    python -m benchmarks.keep_policy --precisions AMP --json out/amp.json         # rendered as one:
    python -m benchmarks.keep_policy --rows out/f32.json out/amp.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from .measure import peak_growth_bytes, round_robin
from .report import machine_description, save_run, write_report
from .training import MEMORY_ENVIRONMENT, ROOT, _example, _network

KEEPS = ("all", "lean")
VARIANTS = ("symgrad.bind, keep all", "symgrad.bind, keep lean", "autograd", "autograd, torch.compile")
EAGER = "autograd"
COMPILED = "autograd, torch.compile"
ROWS = [  # (network, batch, image size, width): the networks at 112², the ResNets at 224² too
    ("resnet18", 4, 112, 64),
    ("resnet50", 4, 112, 64),
    ("unet", 4, 112, 32),
    ("convnext", 4, 112, 32),
    ("efficientnet", 8, 112, 0),
    ("vit", 8, 112, 192),
    ("resnet18", 4, 224, 64),
]
LARGE_ROWS = [("resnet50", 4, 224, 64)]
"""With ``--large`` alone: ResNet-50 at 224² takes about as long as every other row together on 2 cores."""
SMOKE_ROWS = [
    (network, 2, 32, {"resnet18": 8, "resnet50": 8, "unet": 4, "convnext": 8, "vit": 48}.get(network, 0))
    for network in dict.fromkeys(row[0] for row in ROWS)
]
"""Every network, tiny (``--smoke``): that the script runs end to end, not a measurement."""
COMPILED_NETWORKS = ("resnet50", "unet")
"""The networks whose ``torch.compile(model)`` peak is measured (the targets compare with it): in the rows at
112², in both precisions, in the default layout (``--compiled-layouts`` for more)."""
PRECISIONS = ("float32", "AMP")
LAYOUTS = ("default", "channels_last")
TARGETS = {"resnet50": (0.70, 0.95, True), "unet": (0.70, 0.95, True)}
"""{network: (memory at most, speed at least, also at most torch.compile's peak)}: issue 65 item 2; every
other network (0.80, 0.95, False)."""
OTHER_TARGET = (0.80, 0.95, False)


def _model(network: str, width: int, size: int) -> torch.nn.Module:
    """``network`` with 10 classes (the ViT: ViT-Ti/16 of ``width`` at ``size``², its position embedding
    fixing the size; depth 12, 3 heads, no layer scale)."""
    if network != "vit":
        return _network(network, width)
    sys.path.insert(0, str(ROOT))
    from tests.models.zoo_attention import VisionTransformer

    return VisionTransformer(
        img_size=size,
        patch_size=16,
        num_classes=10,
        embed_dim=width,
        depth=12,
        num_heads=3,
        mlp_ratio=4.0,
        init_values=None,
    )


def _traced(network: str, size: int) -> dict:
    """The input size each network is traced at (the ViT at its own image size)."""
    if network == "unet":
        return {"x": (2, 1, 16, 16)}
    return {"x": (2, 3, size, size) if network == "vit" else (2, 3, 32, 32)}


def write_modules(network: str, width: int, size: int, folder: Path) -> dict:
    """{keep: path}: ``network``'s training step traced once and generated with each keep policy into
    ``folder`` (written once, read again by each peak process)."""
    from symgrad.pipeline import build_text
    from symgrad.trace import trace

    example = _example()
    paths = {keep: folder / f"{network}_{width}_{size}_{keep}.py" for keep in KEEPS}
    if all(path.exists() for path in paths.values()):
        return paths
    torch.manual_seed(0)
    model = _model(network, width, size).train()
    loss = (
        example.LossChoice("mse_loss", "target") if network == "unet" else example.LossChoice("cross_entropy", "labels")
    )
    name = f"{network}_step"
    text = trace(model, _traced(network, size), wrt="parameters", name=name, loss=loss, mode="train")
    for keep, path in paths.items():
        built = build_text(text, f"{name}.yaml", documents=False, tests=False, keep=keep)
        path.write_text(built.rendered.files[f"{name}.py"])
    return paths


def _data(network: str, batch: int, size: int) -> dict:
    generator = torch.Generator().manual_seed(1)
    if network == "unet":
        return {
            "x": torch.randn(batch, 1, size, size, generator=generator),
            "target": torch.randn(batch, 1, size, size, generator=generator),
        }
    x = torch.randn(batch, 3, size, size, generator=generator)
    return {"x": x, "labels": torch.randint(0, 10, (batch,), generator=generator)}


def step(row: tuple, variant: str, precision: str, layout: str, modules: dict, count_kept: bool = True):
    """One SGD step of ``variant`` (its own model, seeded as every other variant's), and the bytes its saving
    forward keeps (None for autograd's, or not ``count_kept``)."""
    network, batch, size, width = row
    example = _example()
    torch.manual_seed(0)
    net = _model(network, width, size).train()
    data = _data(network, batch, size)
    if layout == "channels_last":
        net = net.to(memory_format=torch.channels_last)
        data["x"] = data["x"].contiguous(memory_format=torch.channels_last)
    amp = precision == "AMP"
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    kept = None
    if variant.startswith("symgrad"):
        bound = example.symgrad.bind(modules[variant.rpartition(" ")[2]], net)
        compute = lambda: bound(**data)  # noqa: E731
        if count_kept:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                kept = _saved_bytes(bound, net, data)
    else:
        runner = torch.compile(net) if variant == COMPILED else net
        loss = F.mse_loss if network == "unet" else F.cross_entropy
        target = data["target" if network == "unet" else "labels"]
        compute = lambda: loss(runner(data["x"]), target)  # noqa: E731

    def one_step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            value = compute()
        value.backward()
        optimizer.step()
        return value.detach()

    return one_step, kept


def _saved_bytes(bound, net, data: dict) -> int:
    """The bytes of the distinct storages the bound module's saving forward keeps for the backward (not
    the parameters' own, which it may list: a convolution's weight outside autocast, kept_casts.py)."""
    module = bound.generated if hasattr(bound, "generated") else bound.module
    params = {key: value.detach().clone() for key, value in net.state_dict().items() if value.is_floating_point()}
    with torch.no_grad():
        _, *kept = module._forward_saving(*data.values(), params)
    own = {value.untyped_storage().data_ptr() for value in params.values()}
    storages = {}

    def visit(value):
        if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() not in own:
            storages[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
        elif isinstance(value, (list, tuple)):
            for part in value:
                visit(part)

    visit(kept)
    return sum(storages.values())


def _memory(arguments: list) -> None:
    """A fresh process's peak growth over one step of one variant (after two warm-up steps)."""
    row, variant, precision, layout, folder = arguments
    modules = write_modules(row[0], row[3], row[2], Path(folder))
    function, _ = step(tuple(row), variant, precision, layout, modules, count_kept=False)
    function(), function()
    print(json.dumps({"peak_bytes": peak_growth_bytes(function, "cpu")}))


def peak(row: tuple, variant: str, precision: str, layout: str, folder: Path) -> int:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.keep_policy",
            "--memory",
            json.dumps([list(row), variant, precision, layout, str(folder)]),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **MEMORY_ENVIRONMENT},
    )
    return json.loads(result.stdout.splitlines()[-1])["peak_bytes"]


def _counting_faults(function, faults: list):
    """``function``, each call's minor page faults appended to ``faults`` (pages the step touched first:
    glibc hands the top of its heap back to the kernel once more than its trim threshold is free there
    (twice the largest block it ever mapped, 2 x 9 MiB for ResNet-18's 512 x 512 x 3 x 3 weight
    gradient), and the next step that grows the heap again takes one fault per 4 KiB page)."""

    def call():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        result = function()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        return result

    return call


def measure(row: tuple, precision: str, layout: str, args, folder: Path) -> list[dict]:
    """Every variant of one row in one precision and layout: times (round-robin; with ``--run`` N each
    variant's steps N in a row, the first left out, as a training loop's steps follow their own), the
    median minor page faults of its steps, peaks, bytes kept."""
    network, batch, size, width = row
    modules = write_modules(network, width, size, folder)
    compiled = network in args.compiled and layout in args.compiled_layouts and (size == 112 or args.smoke)
    names = [name for name in VARIANTS if name != COMPILED or compiled]
    functions, kept, faults = {}, {}, {}
    for name in names:
        if name == COMPILED and not args.time_compiled:
            continue
        function, kept[name] = step(row, name, precision, layout, modules)
        functions[name] = _counting_faults(function, faults.setdefault(name, []))
    warmup = 2
    samples = round_robin(functions, args.repeats, warmup=warmup, run=args.run)
    results = []
    for name in names:
        values = samples.get(name)
        # the timed steps' faults, as round_robin times them: with run > 1 the first of each run left out
        counted = [
            count for index, count in enumerate(faults.get(name, [])[warmup:]) if args.run == 1 or index % args.run
        ]
        results.append(
            {
                "network": network,
                "batch": batch,
                "size": size,
                "width": width,
                "precision": precision,
                "layout": layout,
                "variant": name,
                "median": statistics.median(values) if values else None,
                "peak_bytes": peak(row, name, precision, layout, folder),
                "kept_bytes": kept.get(name),
                "page_faults": statistics.median(counted) if counted else None,
            }
        )
    return results


def _mib(value) -> str:
    return "" if value is None else f"{value / 2**20:.1f}"


def _count(value) -> str:
    return "" if value is None else f"{value:.0f}"


def render(saved: dict) -> str:
    """The rows table (ratios against eager autograd in the same precision and layout) and the verdicts."""
    lines = [
        "## Keeping less: `--keep lean` against autograd and `torch.compile`",
        "",
        f"Machine: {saved['machine']}. Run on {saved['date']}; `{saved['command']}` (medians of "
        f"{saved['repeats']} round-robin repeats in one process"
        + (f", each variant's steps {saved['run']} in a row, the first left out" if saved.get("run", 1) > 1 else "")
        + "; each peak in a fresh process; page faults: the median minor faults of a timed step).",
        "",
        "| network | batch × image | precision | layout | variant | median ms | speed vs autograd | peak MiB "
        "| memory vs autograd | kept for the backward MiB | page faults per step |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    groups: dict[tuple, dict] = {}
    for row in saved["rows"]:
        key = (row["network"], row["batch"], row["size"], row["precision"], row["layout"])
        groups.setdefault(key, {})[row["variant"]] = row
    for (network, batch, size, precision, layout), variants in groups.items():
        eager = variants.get(EAGER)
        for name, row in variants.items():
            speed = f"{eager['median'] / row['median']:.2f}×" if eager and row["median"] and eager["median"] else ""
            memory = f"{row['peak_bytes'] / max(eager['peak_bytes'], 1):.2f}×" if eager else ""
            median = "" if row["median"] is None else f"{row['median'] * 1e3:.1f}"
            lines.append(
                f"| {network} | {batch} × {size}² | {precision} | {layout} | {name} | {median} | {speed} | "
                f"{_mib(row['peak_bytes'])} | {memory} | {_mib(row['kept_bytes'])} | "
                f"{_count(row.get('page_faults'))} |"
            )
    lines += [
        "",
        "Verdicts (issue 65 item 2): `--keep lean` and `--keep all` in their faster layout against the fastest "
        "eager autograd layout (speed) and the leanest (memory), and against `torch.compile(model)`'s leanest "
        "peak where measured.",
        "",
        "| network | batch × image | precision | keep | layout | speed | memory | memory vs torch.compile "
        "| target | verdict |",
        "|---|---|---|---|---|---:|---:|---:|---|---|",
    ]
    rows: dict[tuple, list] = {}
    for row in saved["rows"]:
        rows.setdefault((row["network"], row["batch"], row["size"], row["precision"]), []).append(row)
    for (network, batch, size, precision), found in rows.items():
        eager = [row for row in found if row["variant"] == EAGER]
        compiled = [row["peak_bytes"] for row in found if row["variant"] == COMPILED]
        if not eager:
            continue
        fastest = min(row["median"] for row in eager)
        leanest = min(row["peak_bytes"] for row in eager)
        memory_at_most, speed_at_least, against_compiled = TARGETS.get(network, OTHER_TARGET)
        for keep in KEEPS:
            ours = [row for row in found if row["variant"] == f"symgrad.bind, keep {keep}"]
            if not ours:
                continue
            best = min(ours, key=lambda row: row["median"])
            # max(..., 1): a --smoke run's eager peak can measure 0 bytes
            speed, memory = fastest / best["median"], best["peak_bytes"] / max(leanest, 1)
            versus = best["peak_bytes"] / min(compiled) if compiled else None
            met = speed >= speed_at_least and memory <= memory_at_most
            met = met and (not against_compiled or (versus is not None and versus <= 1.0))
            target = f"≤ {memory_at_most:.2f}× memory at ≥ {speed_at_least:.2f}×" + (
                ", ≤ torch.compile's" if against_compiled else ""
            )
            lines.append(
                f"| {network} | {batch} × {size}² | {precision} | {keep} | {best['layout']} | {speed:.2f}× | "
                f"{memory:.2f}× | {'' if versus is None else f'{versus:.2f}×'} | {target} | "
                f"{'met' if met else 'missed'} |"
            )
    return "\n".join(lines + [""])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--networks", nargs="+", help="these networks' rows alone (default: every row)")
    parser.add_argument("--sizes", nargs="+", type=int, help="these image sizes' rows alone")
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=LAYOUTS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--run",
        type=int,
        default=1,
        help="each variant's steps this many in a row per round, the first left out (a training loop's order: "
        "each step finds the allocator as its own previous step left it)",
    )
    parser.add_argument(
        "--compiled",
        nargs="*",
        default=list(COMPILED_NETWORKS),
        help="networks whose torch.compile(model) peak is measured (at 112²)",
    )
    parser.add_argument("--compiled-layouts", nargs="*", default=["default"], choices=LAYOUTS)
    parser.add_argument(
        "--time-compiled",
        action="store_true",
        help="time torch.compile(model) too (compiles it in this process as well)",
    )
    parser.add_argument("--large", action="store_true", help="ResNet-50 at 224² too (LARGE_ROWS)")
    parser.add_argument("--smoke", action="store_true", help="every network tiny, 1 repeat: the script runs")
    parser.add_argument("--json", default="out/keep-policy-cpu.json")
    parser.add_argument("--output", default="out/BENCHMARKS-keep-policy.md")
    parser.add_argument(
        "--rows", nargs="+", help="render these saved JSON runs again as one (their rows joined), without measuring"
    )
    parser.add_argument("--memory", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory:
        _memory(json.loads(args.memory))
        return 0
    if args.rows:
        runs = [json.loads(Path(name).read_text()) for name in args.rows]
        saved = {**runs[0], "rows": [row for run in runs for row in run["rows"]]}
        saved["command"] = "; ".join(dict.fromkeys(run["command"] for run in runs))
    else:
        table = SMOKE_ROWS if args.smoke else ROWS + (LARGE_ROWS if args.large else [])
        table = [row for row in table if not args.networks or row[0] in args.networks]
        table = [row for row in table if not args.sizes or row[2] in args.sizes]
        args.repeats = 1 if args.smoke else args.repeats
        saved = {
            "machine": machine_description("cpu"),
            "date": datetime.date.today().isoformat(),
            "command": "python -m benchmarks.keep_policy " + " ".join(argv if argv is not None else sys.argv[1:]),
            "repeats": args.repeats,
            "run": args.run,
            "rows": [],
        }
        with tempfile.TemporaryDirectory() as folder:
            for row in table:
                for precision in args.precisions:
                    for layout in args.layouts:
                        for result in measure(row, precision, layout, args, Path(folder)):
                            median = "" if result["median"] is None else f"{result['median'] * 1e3:8.1f} ms"
                            faults = result["page_faults"]
                            print(
                                f"{row[0]:12s} {row[1]}x{row[2]:<4d} {precision:7s} {layout:13s} "
                                f"{result['variant']:24s} {median:>11s}  peak {_mib(result['peak_bytes']):>7s} MiB"
                                + ("" if faults is None else f"  page faults per step {faults:.0f}"),
                                flush=True,
                            )
                            saved["rows"].append(result)
                        save_run(saved, args.json)  # a run cut short keeps the rows it measured
    write_report(args.output, render(saved), "## Keeping less: `--keep lean` against autograd and `torch.compile`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
