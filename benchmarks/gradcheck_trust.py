"""Whether a generated test file's gradcheck or gradgradcheck failure is the code's or the check's: the same
check, at the file's own point (its inputs and seeds), run on autograd's derivatives of the module's forward.
Where autograd fails it too, with the same analytical value, finite differences are not meaningful at that point
(a kink within the step, or an ill-conditioned point such as a train-mode BatchNorm over two values); where
autograd passes and the explicit backward fails, the explicit code is wrong.

    python -m benchmarks.gradcheck_trust FOLDER [NAME]     # FOLDER holds NAME.py and test_NAME.py (NAME: step)

Prints one line per check: ``gradcheck explicit: numerical N analytical A; autograd: ...; verdict``.
"""

from __future__ import annotations

import importlib
import sys

import torch

from symgrad.testdata import checked_subset


def _outcome(check, function, values) -> tuple[str, float | None]:
    try:
        check(function, values, fast_mode=True)
        return "passes", None
    except Exception as error:  # noqa: BLE001 - gradcheck's mismatch, its two numbers read from its message
        numbers = {}
        for line in str(error).splitlines():
            key, _, value = line.strip().partition(":")
            if key in ("numerical", "analytical"):
                try:
                    numbers[key] = float(value.strip().strip("tensor()[] ,"))
                except ValueError:
                    numbers[key] = float("nan")
        text = f"numerical {numbers.get('numerical')} analytical {numbers.get('analytical')}"
        return text, numbers.get("analytical")


def main() -> int:
    folder, name = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "step")
    sys.path.insert(0, folder)
    tests = importlib.import_module(f"test_{name}")
    gradcheck = importlib.import_module("torch.autograd.gradcheck")
    gradcheck._run_slow_mode_and_get_error = lambda *arguments: ""  # the file's own fails_fast
    for label, check, seed in (
        ("gradcheck", torch.autograd.gradcheck, 6),
        ("gradgradcheck", torch.autograd.gradgradcheck, 7),
    ):
        results = {}
        for kind, forward in (("explicit", tests.explicit_backward), ("autograd", tests.run_forward)):
            inputs = tests.inputs_for(tests.SMALL_SHAPES[0], torch.float64, seed=seed)
            checked = checked_subset(tests.WRT)  # the file's _symgrad_testdata.py is symgrad.testdata's text
            fixed = {key: value.detach() for key, value in inputs.items() if key not in checked}

            def function(*values, forward=forward, fixed=fixed, checked=checked):
                return forward({**fixed, **dict(zip(checked, values))})

            results[kind] = _outcome(check, function, [inputs[key] for key in checked])
        (mine, analytical), (theirs, reference) = results["explicit"], results["autograd"]
        if mine == "passes":
            verdict = "passes"
        elif theirs == "passes":
            verdict = "WRONG: autograd passes where the explicit backward fails"
        elif (
            analytical is not None
            and reference is not None
            and abs(analytical - reference) <= 1e-6 * max(abs(reference), 1e-300)
        ):
            verdict = "not meaningful at this point: autograd fails the same check, with the same analytical value"
        else:
            verdict = "not meaningful at this point: autograd fails the same check (the analytical values differ too)"
        print(f"{label} explicit: {mine}; autograd: {theirs}; {verdict}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
