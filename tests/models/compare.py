"""The one way a zoo test checks a network: trace it (train or eval mode, with a loss), build the module
alone, and compare its gradients with autograd through the ORIGINAL module in float64, at another batch and
size, with a random cotangent (``matches_autograd``); and run a generated test file
(``assert_generated_test_file_passes``). Every zoo test file reads it from here.

A network whose generated test file is run too (``matches_autograd(..., test_file=True)``) is traced in
train mode with its first loss and built with its test file once a run (``train_files``, through
``tests/models/built_once.py``): the train-mode comparison and the test-file test read the same spec and
module, whichever runs first makes them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from symgrad.check import by_name, module_from_source, relative_error
from symgrad.pipeline import build_text
from symgrad.spec import parse_spec
from symgrad.trace import LossChoice, trace
from symgrad.trace.run_once import source_name
from tests.helpers import load_yaml, run_generated_tests
from tests.models.built_once import once

__all__ = [
    "Case",
    "CLASSIFIER",
    "RESTORATION",
    "randomize",
    "traced_spec",
    "reference_loss",
    "matches_autograd",
    "assert_generated_test_file_passes",
    "train_files",
    "source_name",
]


@dataclass(frozen=True)
class Case:
    model: type
    traced: dict[str, tuple[int, ...]]
    checked: dict[str, tuple[int, ...]]
    losses: tuple[str, ...]
    init: dict = field(default_factory=dict)


CLASSIFIER = ("cross_entropy", "half_sq_error_function")
RESTORATION = ("mse_loss", "half_sq_error_function")


def randomize(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Running statistics away from 0 and 1, so that eval mode is a real test."""
    for name, buffer in model.named_buffers():
        if name.endswith("running_mean"):
            buffer.copy_(torch.randn(buffer.shape, generator=generator, dtype=buffer.dtype))
        elif name.endswith("running_var"):
            buffer.copy_(torch.rand(buffer.shape, generator=generator, dtype=buffer.dtype) + 0.5)


def traced_spec(case: Case, mode: str, kind: str, model: torch.nn.Module) -> str:
    """Trace the module with ``--loss``, or a loss function around it (the model read from its closure)."""
    if kind == "nll_loss":  # log-probabilities from the model's logits, in a function

        def loss(x, target):
            return F.nll_loss(torch.log_softmax(model(x), dim=1), target)

        return trace(
            loss,
            {**case.traced, "target": (case.traced["x"][0],)},
            name="traced",
            mode=mode,
            dtypes={"target": "int64"},
        )
    if kind == "half_sq_error_function":
        with torch.no_grad():
            output_shape = tuple(
                model(*(torch.zeros(shape, dtype=torch.float64) for shape in case.traced.values())).shape
            )
        if "noise_map" in case.traced:

            def loss(x, noise_map, target):
                return 0.5 * (model(x, noise_map) - target).pow(2).sum()
        else:

            def loss(x, target):
                return 0.5 * (model(x) - target).pow(2).sum()

        return trace(loss, {**case.traced, "target": output_shape}, name="traced", mode=mode)
    return trace(model, case.traced, name="traced", loss=LossChoice(kind), mode=mode)


def reference_loss(kind: str, model: torch.nn.Module, inputs: list[torch.Tensor], target: torch.Tensor) -> torch.Tensor:
    """The loss computed by autograd through the original module."""
    if kind == "nll_loss":
        return F.nll_loss(torch.log_softmax(model(*inputs), dim=1), target)
    if kind == "half_sq_error_function":
        return 0.5 * (model(*inputs) - target).pow(2).sum()
    return getattr(F, kind)(model(*inputs), target)


def train_files(label: str, case: Case, model: torch.nn.Module | None = None) -> tuple[str, dict[str, str]]:
    """``case`` traced in train mode with its first loss as spec ``label``, and the files built from it with
    the test file (no pages): ``(spec text, {file name: text})``, made once a run and shared by
    ``matches_autograd(..., test_file=True)`` and ``assert_generated_test_file_passes`` (each traced and
    built both: 0.5-1.5 s of CPU a network, the trace and the module alone). ``model``: the one to trace
    (a new one in float64 otherwise). The spec reads the model's structure, not its values (the
    fingerprint records each state tensor's shape), so a model whose running statistics were randomised
    traces to the same text: checked on DeiT, DenseNet, ResNet-18, MaxViT, U-Net 3D and SK-Net."""

    def traced() -> str:
        nonlocal model
        if model is None:
            torch.manual_seed(0)
            model = case.model(**case.init).double().train()
        return trace(model, case.traced, name=label, loss=LossChoice(case.losses[0]), mode="train")

    text = once(("train spec", label, repr(case)), traced)
    files = once(
        ("train files", label, text),
        lambda: json.dumps(build_text(text, f"{label}.yaml", documents=False).rendered.files),
    )
    return text, json.loads(files)


def matches_autograd(
    label: str, case: Case, mode: str, *, one_loss_per_mode: bool = False, test_file: bool = False
) -> None:
    """Trace ``case`` in ``mode`` with each of its losses, generate, and compare the gradients with autograd
    through the original module, in float64, at ``case.checked`` (another batch and spatial size): ≤1e-10.

    ``one_loss_per_mode``: the zoo tests, parametrised over both modes, trace train mode with the first loss
    and eval mode with the last, so that each network meets each of its losses and each mode once (half
    the traces of the full product; a loss is the spec's last layer, traced alike in either mode).
    ``test_file``: the network's generated test file is tested too (``assert_generated_test_file_passes``):
    train mode with the first loss reads :func:`train_files`, which that test reads."""
    generator = torch.Generator().manual_seed(11)
    torch.manual_seed(0)
    model = case.model(**case.init).double()
    randomize(model, generator)
    model.train(mode == "train")
    kinds = case.losses
    if one_loss_per_mode:
        kinds = kinds[:1] if mode == "train" else kinds[-1:]
    for kind in kinds:
        if (
            test_file
            and mode == "train"
            and kind == case.losses[0]
            and kind not in ("nll_loss", "half_sq_error_function")
        ):
            text, files = train_files(label, case, model)
            name = label
            graph = SimpleNamespace(spec=parse_spec(text, f"{label}.yaml"))  # what by_name reads: the inputs
        else:
            text = traced_spec(case, mode, kind, model)
            built = build_text(text, f"{label}.yaml", documents=False, tests=False)  # the module alone: imported
            files, name, graph = built.rendered.files, built.rendered.name, built.graph
        spec = load_yaml(text)
        module = by_name(
            module_from_source(files[f"{name}.py"], name), graph
        )  # the parameters go in `params`: called here by their spec names

        inputs = {
            key: torch.randn(shape, generator=generator, dtype=torch.float64, requires_grad=True)
            for key, shape in case.checked.items()
        }
        with torch.no_grad():
            prediction = model(*inputs.values())
        classes = spec["inputs"]["target"].get("dtype") == "int64"
        target = (
            torch.randint(prediction.shape[1], (prediction.shape[0],), generator=generator)
            if classes
            else torch.randn(prediction.shape, generator=generator, dtype=torch.float64)
        )
        named = {
            source_name("", path, model): value for path, value in [*model.named_parameters(), *model.named_buffers()]
        }
        if kind in ("half_sq_error_function", "nll_loss"):  # read from the loss function's closure
            named = {f"model_{key}": value for key, value in named.items()}
        arguments = {
            key: (inputs.get(key) if key in inputs else target if key == "target" else named[key])
            for key in spec["inputs"]
        }
        wrt = spec["wrt"]
        assert set(inputs) <= set(wrt) and len(wrt) > len(inputs), wrt

        weight = torch.randn((), generator=generator, dtype=torch.float64)  # a random cotangent
        model_before = {key: value.clone() for key, value in model.state_dict().items()}
        torch.manual_seed(5)  # the same dropout masks in both runs (the generated forward draws as the model does)
        loss = reference_loss(kind, model, list(inputs.values()), target)
        expected = torch.autograd.grad(loss, [arguments[key] for key in wrt], grad_outputs=weight)
        model.load_state_dict(model_before)  # train-mode forward moved the running statistics
        torch.manual_seed(5)
        actual = module.gradients(**arguments, grad_loss=weight)
        scale = max(reference.abs().max().item() for reference in expected)
        for key, reference in zip(wrt, expected):
            value = getattr(actual, key)
            if reference.abs().max() <= 1e-12 * scale:  # zero in exact arithmetic (a conv bias before a
                assert value.abs().max() <= 1e-12 * scale, (label, mode, kind, key)  # train-mode batch_norm)
            else:  # or far below the others, and right to float64's precision of the whole gradient (DenseNet's
                error = relative_error(value, reference)  # norm0.weight: the train-mode batch_norms after it make
                assert error <= 1e-10 or error * reference.abs().max() <= 1e-14 * scale, (  # the loss scale-free
                    label,
                    mode,
                    kind,
                    key,
                    error,
                    reference.abs().max().item() / scale,
                )  # in it, but for eps)


def assert_generated_test_file_passes(label: str, case: Case, tmp_path) -> float:
    """Trace ``case`` in train mode with its first loss (:func:`train_files`: once a run, shared with
    ``matches_autograd(..., test_file=True)``), write the generated module and its test file to
    ``tmp_path`` and run that test file in this process (``tests.helpers.run_generated_tests``): it passes with
    nothing skipped. Returns its seconds."""
    import time

    _, files = train_files(label, case)
    for name, content in files.items():
        if name.endswith(".py"):
            (tmp_path / name).write_text(content)
    started = time.perf_counter()
    outcomes = run_generated_tests(tmp_path / f"test_{label}.py")
    seconds = time.perf_counter() - started
    print(f"{label}: generated test file ran in {seconds:.1f} s")
    assert outcomes.ok, outcomes.report
    return seconds


def bound_steps_match_autograd(
    model, path, batch, loss, *, lr: float = 0.1, seeded: bool = False, steps: int = 3, bitwise: bool = False
):
    """``steps`` SGD steps of ``symgrad.bind(path, model)`` against autograd through a copy of ``model``
    (float64, the batches ``batch(generator)`` gives: ``(inputs by name, target)``, at another batch and size
    than traced): each step's loss and every parameter's gradient <= 1e-12 apart (relative; or 1e-14 of the largest gradient), then the running
    statistics alike. ``seeded``: each step's random masks drawn from one seed in both. ``bitwise``: the loss
    and every gradient equal bit for bit (float32, where the forward is autograd's). Returns the bound step."""
    import copy

    import symgrad

    reference = copy.deepcopy(model)
    step = symgrad.bind(path, model)
    optimizers = [torch.optim.SGD(net.parameters(), lr=lr) for net in (model, reference)]
    generator = torch.Generator().manual_seed(1)
    for number in range(steps):
        inputs, target = batch(generator)
        for optimizer in optimizers:
            optimizer.zero_grad()
        if seeded:
            torch.manual_seed(10 + number)
        bound = step(**inputs, target=target)
        bound.backward()
        if seeded:
            torch.manual_seed(10 + number)
        expected = loss(reference(*inputs.values()), target)
        expected.backward()
        if bitwise:
            assert torch.equal(bound, expected), (number, bound.item(), expected.item())
            for (name, ours), theirs in zip(model.named_parameters(), reference.parameters()):
                assert torch.equal(ours.grad, theirs.grad), (number, name, (ours.grad - theirs.grad).abs().max().item())
            for optimizer in optimizers:
                optimizer.step()
            continue
        assert abs(float(bound.detach() - expected.detach())) <= 1e-12 * float(expected.detach()), number
        scale = max(float(theirs.grad.abs().max()) for theirs in reference.parameters())
        for (name, ours), theirs in zip(model.named_parameters(), reference.parameters()):
            difference = float((ours.grad - theirs.grad).abs().max())
            # relative, or far below the largest gradient: one zero in exact arithmetic (a bias before a
            # train-mode batch norm, 1e-17 here) is rounding alone, as matches_autograd allows
            assert difference <= 1e-12 * float(theirs.grad.abs().max()) or difference <= 1e-14 * scale, (
                number,
                name,
                difference,
            )
        for optimizer in optimizers:
            optimizer.step()
    for buffer, theirs in zip(model.buffers(), reference.buffers()):  # running statistics moved alike
        assert torch.allclose(buffer.double(), theirs.double(), rtol=1e-12, atol=1e-12)
    return step
