"""Shared test helpers: build a spec from Python values, and import its generated module from memory."""

from __future__ import annotations

import os

import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

from symgrad.check import by_name, module_from_source
from symgrad.pipeline import Built, build_text as _build_text


def spec_text(inputs: dict, layers: list, loss: dict, wrt: list, name: str = "rule_case") -> str:
    document = {
        "name": name,
        "inputs": {
            key: (dict(shape) if isinstance(shape, dict) else {"shape": list(shape)}) for key, shape in inputs.items()
        },
        "layers": layers,
        "loss": loss,
        "wrt": wrt,
    }
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

    CHECKED = {
        "native_layer_norm.default": (0, (2, 3)),
        "native_layer_norm_backward.default": (1, (5, 6)),
        "native_group_norm.default": (0, (1, 2)),
        "native_group_norm_backward.default": (1, (2, 3, 4)),
    }
    """op: (the input's position, the positions that must share its dtype)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        checked = self.CHECKED.get(str(func).removeprefix("aten."))
        if checked is not None:
            dtype = args[checked[0]].dtype
            for index in checked[1]:
                value = args[index] if index < len(args) else None
                if isinstance(value, torch.Tensor) and value.dtype != dtype:
                    raise RuntimeError(
                        f"{func}: expected scalar type {dtype} but found {value.dtype} "
                        f"(argument {index}; CUDA's kernel reads it in the input's dtype)"
                    )
        return func(*args, **(kwargs or {}))


class _Outcomes:
    """A pytest plugin that counts a nested run's outcomes (its call phase; setup errors as failures)."""

    def __init__(self):
        self.passed, self.failed, self.skipped, self.lines = 0, 0, 0, []

    def pytest_configure(self, config):
        """No garbage collection at the end of the nested run (what pytest's own ``pytester`` sets for the
        runs it makes in its process): pytest collects twice there to find unraisable exceptions, each a
        full collection of the whole test process, 0.25 s of CPU or more once the suite has imported torch,
        sympy and the zoo (a 1-test file's run: 0.37 s of CPU, 0.1 s without); the objects the run leaves
        are freed by their reference counts or by the process's own collections later."""
        from _pytest.unraisableexception import gc_collect_iterations_key

        config.stash[gc_collect_iterations_key] = 0

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


def run_generated_tests(test_file, *options: str) -> _Outcomes:
    """Run a generated test file with pytest in this process, as ``pytest -q test_x.py`` would in its own:
    the interpreter start, torch's and pytest's imports (about 3 s of CPU a file) are not paid again. The
    file must read only torch, pytest and the standard library (checked from its imports first: what a
    subprocess in a fresh interpreter would show), and leaves no module of its own (nor one without a file),
    path or default dtype behind; installed and standard modules it imported stay (pytest's plugins, which
    were imported, assertion-rewritten and dropped again at every run). Hypothesis's plugin is off: the
    files do not use it. ``options``: more pytest arguments (``"-k", "float32"``)."""
    import ast
    import sys
    import sysconfig
    from pathlib import Path

    import pytest

    test_file = Path(test_file)
    for node in ast.walk(ast.parse(test_file.read_text())):
        names = (
            [alias.name for alias in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        for name in names:
            top = name.split(".")[0]
            assert top in {"torch", "pytest"} or top in sys.stdlib_module_names, f"{test_file.name} imports {name}"
    outcomes = _Outcomes()
    modules, path, dtype = dict(sys.modules), list(sys.path), torch.get_default_dtype()
    rng = torch.get_rng_state()
    try:
        pytest.main(
            [
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "no:xdist",
                "-p",
                "no:xdist.looponfail",
                "-p",
                "no:hypothesispytest",
                "--import-mode=importlib",
                "--rootdir",
                str(test_file.parent),
                "--override-ini",
                "addopts=",
                *options,
                str(test_file),
            ],
            plugins=[outcomes],
        )
    finally:
        installed = tuple({sysconfig.get_path(key) for key in ("purelib", "platlib", "stdlib", "platstdlib")})
        for name in set(sys.modules) - set(modules):
            if not (getattr(sys.modules[name], "__file__", None) or "").startswith(installed):
                del sys.modules[name]
        sys.path[:] = path
        torch.set_default_dtype(dtype)
        torch.set_rng_state(rng)
    return outcomes


def load_yaml(text: str):
    """``yaml.safe_load`` on libyaml's parser (PyYAML's ``CSafeLoader``): the same values, about ten times
    faster on a traced network's spec (a second of CPU for a segmentation network's, pure Python)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def run_symgrad(*arguments: str, cwd, environment: dict | None = None, preexec_fn=None, timeout: float = 600):
    """``python -m symgrad ARGUMENTS`` as a user runs it: a process of its own, its exit status, what it wrote to
    its stdout and stderr (file descriptors 1 and 2), a traceback where an exception escapes. The process is
    forked from this one, so it does not import torch and sympy again (about 2.5 s of CPU a command); it
    starts from Python's default warning filters, printing to its stderr, not from pytest's. ``environment``:
    variables set in it; ``preexec_fn`` runs in it first (resource limits, another user). Where this process
    runs torch on more than one thread (``-n 0``; xdist's workers run one), a fork could inherit an OpenMP
    pool mid-state: a fresh interpreter runs the command instead."""
    import selectors
    import subprocess
    import sys
    import time
    import traceback
    import warnings

    command = [sys.executable, "-m", "symgrad", *arguments]
    if torch.get_num_threads() > 1:
        return subprocess.run(
            command,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(environment or {})},
            preexec_fn=preexec_fn,
        )
    pipes = [os.pipe(), os.pipe()]  # pipes, as subprocess's: a file-size limit does not apply to them
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the command's process
        code = 1
        try:
            for target, (read_end, write_end) in zip((1, 2), pipes):
                os.dup2(write_end, target)
                os.close(read_end)
                os.close(write_end)
            sys.stdin = open(os.devnull)
            sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
            os.chdir(cwd)
            os.environ.update(environment or {})
            warnings.resetwarnings()  # Python's defaults (3.11, not a debug build), most specific first
            for category in (ResourceWarning, ImportWarning, PendingDeprecationWarning, DeprecationWarning):
                warnings.filterwarnings("ignore", category=category)
            warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
            warnings.showwarning = warnings._showwarning_orig
            warnings._showwarnmsg_impl = lambda message: sys.stderr.write(
                warnings.formatwarning(
                    message.message, message.category, message.filename, message.lineno, message.line
                )
            )
            if preexec_fn is not None:
                preexec_fn()
            sys.argv = ["symgrad", *arguments]
            from symgrad.cli import main

            main(list(arguments), prog_name="symgrad")
            code = 0
        except SystemExit as exit:
            if exit.code is None or isinstance(exit.code, int):
                code = exit.code or 0
            else:
                print(exit.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - what the interpreter does with an escaping exception
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    for read_end, write_end in pipes:
        os.close(write_end)
    chunks: dict[int, list[bytes]] = {read_end: [] for read_end, _ in pipes}
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        for read_end in chunks:
            selector.register(read_end, selectors.EVENT_READ)
        while selector.get_map():
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                raise subprocess.TimeoutExpired(command, timeout)
            for key, _ in selector.select(timeout=0.5):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    chunks[key.fd].append(chunk)
                else:
                    selector.unregister(key.fd)
                    os.close(key.fd)
    _, status = os.waitpid(pid, 0)
    out, err = (b"".join(chunks[read_end]).decode() for read_end, _ in pipes)
    return subprocess.CompletedProcess(command, os.waitstatus_to_exitcode(status), out, err)


def parameter_gradients(
    model: torch.nn.Module, module, x: torch.Tensor
) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """``(key, the generated module's gradient, autograd's)`` for each of ``model``'s parameters at ``x``, with a
    random cotangent of the output: ``module.gradients`` (an outputs' module) against ``torch.autograd.grad``
    through ``model`` itself."""
    params = {key: value.detach().clone() for key, value in model.state_dict().items() if value.is_floating_point()}
    out = model(x)
    grad = torch.randn_like(out)
    expected = torch.autograd.grad(out, list(model.parameters()), grad)
    got = module.gradients(x, params, (grad,)).params
    return [(key, got[key], reference) for (key, _), reference in zip(model.named_parameters(), expected)]


def generated_matches(model: torch.nn.Module, module, x: torch.Tensor) -> None:
    """The generated (outputs') ``module`` at ``x``: its forward equals ``model``'s bit for bit, and each parameter's
    gradient autograd's through ``model`` within 1e-12 relative (float64)."""
    params = {key: value.detach().clone() for key, value in model.state_dict().items()}
    (out,) = module.forward(x, params)
    assert torch.equal(out, model(x))
    for key, got, reference in parameter_gradients(model, module, x):
        assert (got - reference).abs().max() <= 1e-12 * reference.abs().max(), key


def bound_matches(model: torch.nn.Module, path, x: torch.Tensor):
    """``symgrad.bind(path, model)`` at ``x`` against autograd through a copy of ``model`` (float64): the output
    within 1e-12, each parameter's ``.grad`` after a random cotangent within 1e-12 relative. The bound model."""
    import copy

    import symgrad

    reference = copy.deepcopy(model)
    bound = symgrad.bind(path, model)
    out, expected = bound(x), reference(x)
    assert out.shape == expected.shape and (out - expected).abs().max() <= 1e-12
    grad = torch.randn(expected.shape, dtype=expected.dtype, generator=torch.Generator().manual_seed(2))
    out.backward(grad)
    wanted = torch.autograd.grad(expected, list(reference.parameters()), grad)
    for (key, parameter), theirs in zip(model.named_parameters(), wanted):
        assert (parameter.grad - theirs).abs().max() <= 1e-12 * theirs.abs().max(), key
    return bound


def model_in_folder(folder, source: str, module: str, name: str) -> torch.nn.Module:
    """``name`` of the model file ``folder/module.py`` (written from ``source`` where it is not there yet), imported
    afresh (no stale ``sys.modules`` entry), built from seed 0, in float64."""
    import sys

    from symgrad.trace import load_target

    path = folder / f"{module}.py"
    if not path.exists():
        path.write_text(source)
    for key in [key for key in sys.modules if module in key]:
        sys.modules.pop(key)
    torch.manual_seed(0)
    return load_target(f"{path}:{name}").double()


def write_generated(folder, text: str, name: str) -> None:
    """The module (and its test) ``build_text`` makes of the spec ``text``, written into ``folder``."""
    for file, content in _build_text(text, f"{name}.yaml", documents=False).rendered.files.items():
        (folder / file).write_text(content)
