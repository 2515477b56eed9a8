"""Where a bound training step's time goes around its kernels, beside autograd's.

``python -m benchmarks.step_pieces`` traces and generates each network of
:data:`benchmarks.training.QUICK_ROWS` as ``python -m benchmarks.training`` does (ResNet-18 of width 8,
a U-Net of width 4, at 2 × 32², where the kernels cost little), binds it, and times the step in runs
of :data:`RUN` steps (the first of each left out), alternating with autograd's step of a copy of the
model in the same layout, over ``--rounds`` rounds in one process. A step is ``zero_grad``, the
forward and ``.backward()`` (no optimizer: both would pay the same). The bound step's pieces are
timed by a clock around the function that does each, set on this bound model and this module alone:

- *checks*: ``Guard._checked_arguments``, the per-call checks (model, modes, hooks, sizes, devices)
  and the read of the model's tensors;
- *saving forward*: the generated ``_forward_saving``;
- *batch counts*: ``Guard._moved`` (``num_batches_tracked``; autograd's BatchNorms count in their forward);
- *forward, rest*: the forward less those three (``autograd.Function.apply`` and its ``forward``
  around the saving forward, the argument checks of the call);
- *backward body*: the generated ``_backward_from_saved``;
- *backward, rest*: the backward less its body (the Function's ``backward`` around it, autograd's
  engine, the AccumulateGrad of each parameter, which autograd's backward runs too).

Writes a Markdown table (``--output BENCHMARKS.md`` replaces that file's section of this name) and the
medians as JSON (``--json``); ``--rows FILE`` renders a saved run again. The clocks cost about a
microsecond each, a few per step.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from torch.utils._python_dispatch import TorchDispatchMode

from .training import quick_rows_command, step_variants

SECTION = "## Around the kernels: where a bound step's time goes"
RUN = 6
"""Steps in a row per variant and round; the first of each run is left out (it follows the other's)."""
PIECES = ("checks", "saving forward", "batch counts", "backward body")


def _clocked(function, samples: list):
    """``function``, its every call's duration appended to ``samples``."""

    def clocked(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            samples.append(time.perf_counter() - start)

    return clocked


class _KernelCount(TorchDispatchMode):
    """How many aten calls reach the kernels under it (views and factories included), by phase."""

    def __init__(self):
        super().__init__()
        self.phase, self.counts = "forward", {"forward": 0, "backward": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[self.phase] += 1
        return func(*args, **(kwargs or {}))


def kernel_calls(compute, optimizer) -> dict:
    """The aten calls of one forward ``compute()`` and its backward, from gradients set to None as a
    step's are (on the CPU autograd's engine runs the backward in the calling thread, so the mode sees
    its kernels too)."""
    optimizer.zero_grad(set_to_none=True)
    counting = _KernelCount()
    with counting:
        loss = compute()
        counting.phase = "backward"
        loss.backward()
    return counting.counts


def _steps(network: str, batch: int, size: int, width: int, layout: str, folder: Path):
    """The bound and the autograd step of ``network`` in ``layout``, each as ``(name, step, samples,
    optimizer, compute)``: ``step()`` runs zero_grad, the forward and the backward, and appends the forward's and
    the backward's durations (and the bound step's pieces) to ``samples``, a dict of lists."""
    suffix = ", channels_last" if layout == "channels_last" else ""
    variants = step_variants(network, batch, size, width, folder, ("symgrad.bind" + suffix, "autograd" + suffix))
    made = []
    for name, variant in variants.items():
        compute, optimizer, bound = variant.compute, variant.optimizer, variant.bound
        samples = {key: [] for key in ("forward", "backward", *PIECES)}
        if bound is not None:
            generated = bound.generated
            bound._checked_arguments = _clocked(bound._checked_arguments, samples["checks"])
            bound._moved = _clocked(bound._moved, samples["batch counts"])
            generated._forward_saving = _clocked(generated._forward_saving, samples["saving forward"])
            generated._backward_from_saved = _clocked(generated._backward_from_saved, samples["backward body"])

        def step(compute=compute, optimizer=optimizer, samples=samples):
            optimizer.zero_grad(set_to_none=True)
            start = time.perf_counter()
            loss = compute()
            middle = time.perf_counter()
            loss.backward()
            samples["forward"].append(middle - start)
            samples["backward"].append(time.perf_counter() - middle)

        made.append((name, step, samples, optimizer, compute))
    return made


def measure(network: str, batch: int, size: int, width: int, layout: str, rounds: int) -> dict:
    """The medians (seconds) of each piece of the bound step and of autograd's forward and backward."""
    with tempfile.TemporaryDirectory() as folder:
        steps = _steps(network, batch, size, width, layout, Path(folder))
        calls = []
        for _, step, samples, optimizer, compute in steps:  # warm-up and a count of the kernels, then forget them
            for _ in range(3):
                step()
            calls.append(kernel_calls(compute, optimizer))
            for values in samples.values():
                values.clear()
        for index in range(rounds):
            for _, step, samples, _, _ in steps if index % 2 else steps[::-1]:
                marks = {key: len(values) for key, values in samples.items()}
                for _ in range(RUN):
                    step()
                for key, values in samples.items():  # the run's first step follows the other variant's
                    if len(values) > marks[key]:
                        del values[marks[key]]
    (_, _, bound, _, _), (_, _, autograd, _, _) = steps
    result = {
        "network": network,
        "batch": batch,
        "size": size,
        "width": width,
        "layout": layout,
        "bound calls": calls[0],
        "autograd calls": calls[1],
    }
    for key, values in bound.items():
        result[f"bound {key}"] = statistics.median(values)
    for key in ("forward", "backward"):
        result[f"autograd {key}"] = statistics.median(autograd[key])
    result["bound step"] = statistics.median(map(sum, zip(bound["forward"], bound["backward"])))
    result["autograd step"] = statistics.median(map(sum, zip(autograd["forward"], autograd["backward"])))
    return result


def render(saved: dict) -> str:
    lines = [
        SECTION,
        "",
        f"Machine: {saved['machine']}. Run on {saved['date']}; `python -m benchmarks.step_pieces` "
        f"({saved['rounds']} rounds of {RUN} steps per variant, the first of each run left out; medians in µs, "
        "one process). The bound step's pieces are timed by a clock around the function that does each "
        "(the module's docstring lists them); its forward's and backward's rest is what they leave of the "
        "whole. Autograd's backward runs its kernels from its engine, in C++.",
        "",
        "| network | layout | piece | symgrad.bind µs | autograd µs |",
        "|---|---|---|---:|---:|",
    ]
    for row in saved["rows"]:
        head = f"| {row['network']} of width {row['width']} at {row['batch']} × {row['size']}² | {row['layout']} |"
        forward_rest = (
            row["bound forward"] - row["bound checks"] - row["bound saving forward"] - row["bound batch counts"]
        )
        entries = [
            ("forward", row["bound forward"], row["autograd forward"]),
            ("… checks", row["bound checks"], None),
            ("… saving forward", row["bound saving forward"], None),
            ("… batch counts", row["bound batch counts"], None),
            ("… rest", forward_rest, None),
            ("backward", row["bound backward"], row["autograd backward"]),
            ("… body", row["bound backward body"], None),
            ("… rest", row["bound backward"] - row["bound backward body"], None),
            ("step (forward + backward)", row["bound step"], row["autograd step"]),
        ]
        for name, bound, autograd in entries:
            lines.append(f"{head} {name} | {bound * 1e6:.0f} | {'' if autograd is None else f'{autograd * 1e6:.0f}'} |")
        if "bound calls" in row:
            lines.append(
                f"{head} aten calls, forward / backward | {row['bound calls']['forward']} / "
                f"{row['bound calls']['backward']} | {row['autograd calls']['forward']} / "
                f"{row['autograd calls']['backward']} |"
            )
    summary = "; ".join(
        f"{row['network']} {row['layout']}: the forward {row['bound forward'] / row['autograd forward']:.2f}×, the "
        f"backward {row['bound backward'] / row['autograd backward']:.2f}× and its body alone "
        f"{row['bound backward body'] / row['autograd backward']:.2f}× autograd's whole backward"
        for row in saved["rows"]
    )
    lines += [
        "",
        f"Time against autograd's in the same layout (above 1: longer): {summary}. Both make the same "
        "kernel calls but for autograd's bookkeeping (its views, detaches and the loss's own kernels), "
        "so what differs is what each pays per call: the bound step's forward is a plain sequence of calls "
        "where autograd's runs each module's `__call__`, and its backward calls each kernel from Python "
        "where autograd's engine calls it from C++.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    return quick_rows_command(
        argv,
        __doc__,
        "step-pieces",
        SECTION,
        measure,
        render,
        lambda result: f"bound {result['bound step'] * 1e3:6.2f} ms  autograd {result['autograd step'] * 1e3:6.2f} ms",
    )


if __name__ == "__main__":
    sys.exit(main())
