"""What a bound model's per-call guards cost against its training step: ``python -m benchmarks.guard_cost``.

ResNet-18 (``examples/train_resnet.py``, width 64 or ``--width``, 10 classes) traced without a loss (the bound model's
outputs form), its module generated and bound; then, on the CPU in float32, the median of a training
step (zero_grad, ``fast(x)``, cross-entropy, backward, SGD step) and of the checks each call makes before
its forward (``Guard._check_model_and_mode``: submodules, hyper-parameters, modes, hooks; the call
arguments, ``symgrad.guards.ArgumentGuard``; the module constants read, ``symgrad.value_guard``), timed right after a step, as a training loop calls them,
and in a loop of their own. Prints one line per figure.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--width", type=int, default=64, help="the first stage's channels (64: ResNet-18 itself)")
    options = parser.parse_args()
    sys.path.insert(0, str(ROOT / "examples"))
    import train_resnet

    import symgrad
    from symgrad.pipeline import build_text
    from symgrad.trace import trace

    torch.manual_seed(0)
    model = train_resnet.ResNet18(options.width, 10).train()
    started = time.perf_counter()
    text = trace(model, {"x": (2, 3, 32, 32)}, wrt="parameters", name="resnet18_guarded", mode="train")
    traced = time.perf_counter() - started
    folder = Path(tempfile.mkdtemp())
    path = folder / "resnet18_guarded.py"
    path.write_text(build_text(text, "resnet18_guarded.yaml", documents=False).rendered.files[path.name])
    fast = symgrad.bind(path, model)
    mode = fast._modes[0]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(options.batch, 3, options.size, options.size)
    labels = torch.randint(0, 10, (options.batch,))
    arguments = {"x": x}

    def guards() -> None:
        mode._check_model_and_mode()
        mode.arguments.problem(arguments)
        mode.values.problem()  # in _check_model_and_mode's caller, Guard._checked_arguments

    steps, after = [], []
    for _ in range(options.steps + 2):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(fast(x), labels).backward()
        optimizer.step()
        steps.append(time.perf_counter() - started)
        started = time.perf_counter()
        guards()
        after.append(time.perf_counter() - started)
    started = time.perf_counter()
    for _ in range(1000):
        guards()
    looped = (time.perf_counter() - started) / 1000
    started = time.perf_counter()
    for _ in range(1000):
        mode.arguments.problem(arguments)
    argument_guard = (time.perf_counter() - started) / 1000
    step, guard = statistics.median(steps[2:]), statistics.median(after[2:])
    print(
        f"trace of ResNet-18 (width {options.width}) at 2 x 3 x 32²: {traced:.1f} s; guards: {len(mode.generated.GUARDS['code'])} "
        f"functions, {len(mode._hypers)} hyper-parameters, {len(mode._children)} submodules, "
        f"{len(mode.values._places)} module constants"
    )
    print(f"training step at {options.batch} x 3 x {options.size}²: {step * 1e3:.1f} ms (median of {options.steps})")
    print(f"per-call guards right after a step: {guard * 1e6:.0f} us = {100 * guard / step:.2f} % of the step")
    print(f"per-call guards in a loop of their own: {looped * 1e6:.0f} us = {100 * looped / step:.2f} % of the step")
    print(f"of which the call arguments' guard: {argument_guard * 1e6:.1f} us")


if __name__ == "__main__":
    main()
