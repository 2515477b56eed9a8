"""``python -m benchmarks.device_check cuda``: the committed generated modules on a device, against
autograd on the same device.

The test suite never needs a GPU; this is what to run when one is at hand. For each module in
generated/: float64 at its first small shape with a random cotangent (``gradients``,
``loss_with_explicit_backward``, the per-sample gradients summed over the batch)
and gradcheck + gradgradcheck through ``gradients``; float32 at the spec's shapes in the layout the
module chooses (``--quick``, the suite's CPU run of this script: float32 at the second small shape, and
gradcheck and gradgradcheck over the test file's checked subset of inputs, as the generated tests take
them; perturbing every input of the unrolled example took 68 s of CPU). Prints one line per check and exits non-zero if any
fails. float32 allows 1e-2: on CUDA both sides run cuDNN's convolutions in TF32 (PyTorch's default),
but not always the same ones."""

from __future__ import annotations

import contextlib
import importlib
import sys
from pathlib import Path

import torch

from symgrad.check import load_module, relative_error
from symgrad.testdata import checked_subset

ROOT = Path(__file__).resolve().parent.parent
NONDETERMINISM = {"cuda": 1e-12}
"""gradcheck's tolerance for reruns that differ: CUDA's scatter-style backward kernels add with atomics."""
LIMIT = {torch.float64: 1e-10, torch.float32: 1e-2}


@contextlib.contextmanager
def _mismatch_without_full_jacobians():
    """gradcheck's fast mode, on a mismatch, recomputes both Jacobians in full only to print them (one
    forward per entry: 45 s of CPU for the suite's wrong-gradient case, minutes for a network); the
    mismatch is reported without them, as the generated tests' ``fails_fast`` does."""
    gradcheck = importlib.import_module("torch.autograd.gradcheck")
    slow = getattr(gradcheck, "_run_slow_mode_and_get_error", None)
    if slow is None:
        yield
        return
    gradcheck._run_slow_mode_and_get_error = lambda *arguments: ""
    try:
        yield
    finally:
        gradcheck._run_slow_mode_and_get_error = slow


def check_module(test_path: Path, device: str, quick: bool = False) -> bool:
    """Every check of one generated module (its generated test file gives shapes, roles and layout);
    ``quick``: float32 at its second small shape, gradcheck over its checked subset (see the docstring)."""
    tests = load_module(test_path, test_path.stem)
    module, wrt, passed = tests.module, tests.WRT, True
    # the file's shared helpers (_symgrad_testdata.py beside it) are symgrad.testdata's text
    perturbed = checked_subset(wrt) if quick else wrt
    # a module written as blocks takes its parameters in one mapping: its test file says how
    call = getattr(tests, "arguments", lambda values: values)
    ordered = (lambda result: [tests.by_name(result)[name] for name in wrt]) if hasattr(tests, "by_name") else tuple
    float32_at = tests.SMALL_SHAPES[-1] if quick else tests.SPEC_SHAPES
    for dtype, shapes in ((torch.float64, tests.SMALL_SHAPES[0]), (torch.float32, float32_at)):
        drawn = tests.inputs_for(shapes, dtype, 3)  # class indices below each shape set's class counts
        inputs = {name: value.to(device) for name, value in drawn.items()}
        if dtype == torch.float32:
            inputs = tests.in_layout(inputs, tests.CHANNELS_LAST)
        leaves = {name: value.clone().requires_grad_(name in wrt) for name, value in inputs.items()}
        loss = module.forward(**call(leaves))
        cotangent = torch.randn(loss.shape, dtype=dtype, generator=torch.Generator().manual_seed(5)).to(device)
        expected = torch.autograd.grad(loss, [leaves[name] for name in wrt], cotangent)
        leaves = {name: value.clone().requires_grad_(name in wrt) for name, value in inputs.items()}
        explicit = module.loss_with_explicit_backward(**call(leaves))
        results = {
            "gradients": ordered(module.gradients(**call(inputs), grad_loss=cotangent)),
            "explicit backward": torch.autograd.grad(explicit, [leaves[name] for name in wrt], cotangent),
        }
        if hasattr(module, "per_sample_gradients"):  # summed over the batch: the shared weights' gradient
            per_sample = module.per_sample_gradients(**inputs, grad_loss=cotangent)._asdict()
            results["per-sample, summed"] = [
                per_sample[name].sum(0) if name in per_sample else reference for name, reference in zip(wrt, expected)
            ]
        for label, got in results.items():
            error = max(relative_error(actual, reference) for actual, reference in zip(got, expected))
            passed &= error <= LIMIT[dtype]
            print(
                f"{test_path.stem[5:]:24s} {str(dtype)[6:]:8s} {label:24s} max relative error {error:.2e} "
                f"{'ok' if error <= LIMIT[dtype] else 'FAIL'}",
                flush=True,
            )
        if dtype == torch.float64:
            wanted = tuple(inputs[name].clone().requires_grad_() for name in perturbed)

            def gradients_of(*values):
                return tuple(
                    ordered(module.gradients(**call({**inputs, **dict(zip(perturbed, values))}), grad_loss=cotangent))
                )

            tolerance = NONDETERMINISM.get(device, 0.0)
            with _mismatch_without_full_jacobians():
                ok = torch.autograd.gradcheck(
                    gradients_of, wanted, fast_mode=True, nondet_tol=tolerance
                ) and torch.autograd.gradgradcheck(gradients_of, wanted, fast_mode=True, nondet_tol=tolerance)
            passed &= ok
            print(f"{test_path.stem[5:]:24s} float64  gradcheck + gradgradcheck {'ok' if ok else 'FAIL'}", flush=True)
    return passed


def main(argv: list[str]) -> int:
    """``[DEVICE] [--quick]``; the device defaults to CUDA where there is one."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.device_check")
    parser.add_argument("device", nargs="?", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="float32 at the small shapes, gradcheck over a "
        "subset of the inputs (as the generated tests): the suite's CPU run",
    )
    options = parser.parse_args(argv)
    device = options.device
    results = [check_module(path, device, options.quick) for path in sorted((ROOT / "generated").glob("test_*.py"))]
    print(f"{sum(results)} of {len(results)} modules pass on {device}")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
