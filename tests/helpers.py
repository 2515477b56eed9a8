"""Shared test helpers: build a spec from Python values, and import its generated module from memory."""

from __future__ import annotations

import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

from symgrad.check import by_name, module_from_source
from symgrad.pipeline import Built, build_text as _build_text


def spec_text(inputs: dict, layers: list, loss: dict, wrt: list, name: str = "rule_case") -> str:
    document = {"name": name, "inputs": {key: (dict(shape) if isinstance(shape, dict) else {"shape": list(shape)})
                                         for key, shape in inputs.items()},
                "layers": layers, "loss": loss, "wrt": wrt}
    return yaml.safe_dump(document, sort_keys=False)


def build_text(text: str, label: str = "case.yaml", extras: tuple[str, ...] = ()) -> Built:
    return _build_text(text, label, extras)


def generated_module(built: Built):
    """The generated module, called with every input by its spec name (``check.by_name``: the
    inputs with a ``source:`` go in its ``params`` mapping)."""
    module = module_from_source(built.rendered.files[f"{built.rendered.name}.py"], built.rendered.name)
    return by_name(module, built.graph)


class CudaNormKernels(TorchDispatchMode):
    """CUDA's layer_norm and group_norm kernels on the CPU: they read the weight and bias (and
    group_norm's mean and 1 / std) in the input's dtype and refuse any other, where the CPU's also
    take a float32 weight with a bfloat16 input. Within this mode such a call raises as on a GPU
    (``expected scalar type BFloat16 but found Float``), so a CPU test sees what a GPU would refuse."""

    CHECKED = {"native_layer_norm.default": (0, (2, 3)), "native_layer_norm_backward.default": (1, (5, 6)),
               "native_group_norm.default": (0, (1, 2)), "native_group_norm_backward.default": (1, (2, 3, 4))}
    """op: (the input's position, the positions that must share its dtype)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        checked = self.CHECKED.get(str(func).removeprefix("aten."))
        if checked is not None:
            dtype = args[checked[0]].dtype
            for index in checked[1]:
                value = args[index] if index < len(args) else None
                if isinstance(value, torch.Tensor) and value.dtype != dtype:
                    raise RuntimeError(f"{func}: expected scalar type {dtype} but found {value.dtype} "
                                       f"(argument {index}; CUDA's kernel reads it in the input's dtype)")
        return func(*args, **(kwargs or {}))


class _Outcomes:
    """A pytest plugin that counts a nested run's outcomes (its call phase; setup errors as failures)."""

    def __init__(self):
        self.passed, self.failed, self.skipped, self.lines = 0, 0, 0, []

    def pytest_runtest_logreport(self, report):
        if report.skipped:
            self.skipped += 1
            self.lines.append(f"SKIPPED {report.nodeid}: {report.longrepr}")
        elif report.failed:
            self.failed += 1
            self.lines.append(f"FAILED {report.nodeid} ({report.when}):\n{report.longreprtext[-3000:]}")
        elif report.when == "call":
            self.passed += 1

    @property
    def ok(self) -> bool:
        """Something passed, nothing failed and nothing was skipped."""
        return self.passed > 0 and self.failed == 0 and self.skipped == 0

    @property
    def report(self) -> str:
        return f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped\n" + "\n".join(self.lines)


def run_generated_tests(test_file) -> _Outcomes:
    """Run a generated test file with pytest in this process, as ``pytest -q test_x.py`` would in its own:
    the interpreter start, torch's and pytest's imports (about 3 s of CPU a file) are not paid again. The
    file must read only torch, pytest and the standard library (checked from its imports first: what a
    subprocess in a fresh interpreter would show), and leaves no module, path or default dtype behind."""
    import ast
    import sys
    from pathlib import Path

    import pytest

    test_file = Path(test_file)
    for node in ast.walk(ast.parse(test_file.read_text())):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for name in names:
            top = name.split(".")[0]
            assert top in {"torch", "pytest"} or top in sys.stdlib_module_names, f"{test_file.name} imports {name}"
    outcomes = _Outcomes()
    modules, path, dtype = dict(sys.modules), list(sys.path), torch.get_default_dtype()
    rng = torch.get_rng_state()
    try:
        pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--import-mode=importlib",
                     "--rootdir", str(test_file.parent), "--override-ini", "addopts=", str(test_file)],
                    plugins=[outcomes])
    finally:
        for name in set(sys.modules) - set(modules):
            del sys.modules[name]
        sys.path[:] = path
        torch.set_default_dtype(dtype)
        torch.set_rng_state(rng)
    return outcomes


def load_yaml(text: str):
    """``yaml.safe_load`` on libyaml's parser (PyYAML's ``CSafeLoader``): the same values, about ten times
    faster on a traced network's spec (a second of CPU for a segmentation network's, pure Python)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
