"""symgrad.bind: a model traced from its file, generated, and trained with the explicit gradients,
against the same model trained with autograd: losses, parameters, running statistics and
``num_batches_tracked`` after several optimizer steps, at a batch and spatial size other than the
traced ones; frozen parameters, accumulation, refusals, and CPU bfloat16 autocast."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import symgrad
from symgrad.binding import BindError
from symgrad.check import module_from_source
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, load_target, trace

ROOT = Path(__file__).resolve().parents[1]
MODEL = f"{ROOT / 'trace' / 'inputs' / 'resnet_style.py'}:TinyResNet"


def generated_for(
    model: torch.nn.Module, mode: str = "train", name: str = "tiny_resnet", blocks: bool = False, wrt=None
):
    text = trace(
        model,
        {"x": (2, 3, 16, 16)},
        name=name,
        loss=LossChoice("cross_entropy", "labels"),
        mode=mode,
        blocks=blocks,
        wrt=wrt,
    )
    if blocks:  # the repeated BasicBlock is one block, its instances called by prefix
        assert "blocks:\n  basic_block:" in text and text.count("{block: basic_block,") >= 2, text
    built = build_text(text, f"{name}.yaml")
    return module_from_source(built.rendered.files[f"{name}.py"], name)


def batches(steps: int, dtype=torch.float64):
    generator = torch.Generator().manual_seed(5)
    for _ in range(steps):  # another batch and spatial size than traced
        yield (
            torch.randn(3, 3, 20, 12, generator=generator, dtype=dtype),
            torch.randint(0, 5, (3,), generator=generator),
        )


def fresh_model(dtype=torch.float64, **init) -> torch.nn.Module:
    torch.manual_seed(0)
    return load_target(MODEL, init).to(dtype)


@pytest.mark.parametrize("blocks", [False, True], ids=["flat", "blocks"])
def test_training_with_bind_equals_training_with_autograd(blocks):
    model = fresh_model(**({"layers": (2, 2)} if blocks else {}))
    reference = copy.deepcopy(model)
    initial = copy.deepcopy(model.state_dict())
    step = symgrad.bind(generated_for(model, blocks=blocks), model)
    rate = 0.1
    optimizers = [
        torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=rate, momentum=0.9)
        for m in (model, reference)
    ]
    losses = []
    for x, labels in batches(4):
        for optimizer in optimizers:
            optimizer.zero_grad()
        ours = step(x=x, labels=labels)
        ours.backward()
        theirs = F.cross_entropy(reference(x), labels)
        theirs.backward()
        losses.append((ours.item(), theirs.item()))
        for optimizer in optimizers:
            optimizer.step()
    for ours, theirs in losses:
        assert abs(ours - theirs) <= 1e-10 * abs(theirs)
    trained, expected = model.state_dict(), reference.state_dict()
    assert trained.keys() == expected.keys()
    for key, value in expected.items():
        if value.dtype == torch.int64:  # num_batches_tracked
            assert torch.equal(trained[key], value) and int(value) == 4, key
        else:
            scale = max(value.abs().max().item(), 1e-30)
            assert (trained[key] - value).abs().max().item() <= 1e-10 * scale, key
    if blocks:  # deeper: four steps on random batches need not lower the loss; it moved the parameters
        assert any(not torch.equal(value, initial[key]) for key, value in trained.items() if "weight" in key)
    else:
        assert losses[-1][1] < losses[0][1]  # it trained


def test_gradients_accumulate_and_frozen_parameters_stay_untouched():
    model = fresh_model()
    reference = copy.deepcopy(model)
    step = symgrad.bind(generated_for(model), model)
    for x, labels in batches(2):
        step(x=x, labels=labels).backward()
        F.cross_entropy(reference(x), labels).backward()
    assert model.conv1.weight.grad is None and not model.conv1.weight.requires_grad
    for (name, ours), theirs in zip(model.named_parameters(), reference.parameters()):
        if theirs.grad is not None:
            assert (ours.grad - theirs.grad).abs().max() <= 1e-10 * theirs.grad.abs().max(), name


def test_eval_mode_binding_uses_running_statistics_and_moves_nothing():
    model = fresh_model().eval()
    reference = copy.deepcopy(model)
    step = symgrad.bind(generated_for(model, mode="eval", name="tiny_eval"), model)
    x, labels = next(batches(1))
    step(x=x, labels=labels).backward()
    F.cross_entropy(reference(x), labels).backward()
    for key, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        if theirs.grad is not None:
            assert (ours.grad - theirs.grad).abs().max() <= 1e-10 * theirs.grad.abs().max()


def test_bind_refuses_a_changed_model_another_module_and_the_wrong_mode():
    model = fresh_model()
    generated = generated_for(model)
    other = fresh_model()
    other.maxpool.stride = 1  # the module reads every parameter at its size, never a pooling's stride
    with pytest.raises(
        BindError,
        match=r"does not fit TinyResNet: maxpool \(MaxPool2d\) has other "
        r"hyper-parameters than traced \(now .*stride=1",
    ):
        symgrad.bind(generated, other)
    with pytest.raises(BindError, match=r"does not fit TinyResNet: layers\.1 \(Sequential\) is no submodule"):
        symgrad.bind(generated, load_target(MODEL, {"layers": (1,)}).double())
    seed = module_from_source((ROOT.parent / "generated" / "seed1_strided_conv.py").read_text(), "seed1_bound")
    with pytest.raises(BindError, match="not generated from a traced model"):
        symgrad.bind(seed, model)
    step = symgrad.bind(generated, model)
    model.eval()
    x, labels = next(batches(1))
    with pytest.raises(BindError, match=r"traced in train mode.*model.train\(\)"):
        step(x=x, labels=labels)
    model.train()
    with pytest.raises(TypeError, match="missing: labels"):
        step(x=x)


def test_bound_step_under_cpu_bfloat16_autocast_is_as_accurate_as_autograd():
    exact = fresh_model()
    model = copy.deepcopy(exact).float()
    reference = copy.deepcopy(model)
    step = symgrad.bind(generated_for(model, name="tiny_autocast"), model)
    x, labels = next(batches(1))
    F.cross_entropy(exact(x), labels).backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = step(x=x.float(), labels=labels)
        theirs = F.cross_entropy(reference(x.float()), labels)
    ours.backward()
    theirs.backward()
    for (name, truth), mine, autograds in zip(exact.named_parameters(), model.parameters(), reference.parameters()):
        if truth.grad is None:
            continue
        assert mine.grad.dtype == torch.float32
        norm = truth.grad.norm().item()
        our_error = (mine.grad.double() - truth.grad).norm().item() / norm
        their_error = (autograds.grad.double() - truth.grad).norm().item() / norm
        assert their_error > 1e-4, "autocast did not lower the precision: the comparison would prove nothing"
        assert our_error <= 4 * their_error + 1e-3, (name, our_error, their_error)


def test_grad_scaler_scales_through_the_explicit_backward():
    model = fresh_model()
    reference = copy.deepcopy(model)
    step = symgrad.bind(generated_for(model, name="tiny_scaled"), model)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x, labels = next(batches(1))
    scaler.scale(step(x=x, labels=labels)).backward()
    scaler.unscale_(optimizer)
    F.cross_entropy(reference(x), labels).backward()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        if theirs.grad is not None:
            assert (ours.grad - theirs.grad).abs().max() <= 1e-10 * theirs.grad.abs().max()
    scaler.step(optimizer)
    scaler.update()


@pytest.mark.parametrize("entry", ["gradients", "loss_with_explicit_backward"])
def test_generated_seed_module_under_cpu_bfloat16_autocast_is_as_accurate_as_autograd(entry):
    module = module_from_source((ROOT.parent / "generated" / "seed3_conv_relu_conv.py").read_text(), "seed3_autocast")
    generator = torch.Generator().manual_seed(3)
    shapes = {
        "x": (2, 32, 64, 64),
        "w1": (32, 32, 3, 3),
        "w2": (1, 32, 3, 3),
        "k": (512, 1, 32, 32),
        "y": (2, 512, 2, 2),
    }
    exact = {
        name: torch.randn(shape, generator=generator, dtype=torch.float64) / (shape[1] * 9 if name[0] == "w" else 1)
        for name, shape in shapes.items()
    }
    wrt = ("x", "w1", "w2")
    truth = module.gradients(**exact)
    inputs = {name: value.float().requires_grad_(name in wrt) for name, value in exact.items()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        theirs = torch.autograd.grad(module.forward(**inputs).sum(), [inputs[name] for name in wrt])
        if entry == "gradients":
            ours = module.gradients(**inputs)
        else:
            loss = module.loss_with_explicit_backward(**inputs).sum()
    if entry != "gradients":
        ours = torch.autograd.grad(loss, [inputs[name] for name in wrt])
    for name, mine, autograds in zip(wrt, ours, theirs):
        expected = getattr(truth, name)
        assert mine.dtype == torch.float32
        our_error = ((mine.double() - expected).norm() / expected.norm()).item()
        their_error = ((autograds.double() - expected).norm() / expected.norm()).item()
        assert their_error > 1e-4, "autocast did not lower the precision: the comparison would prove nothing"
        assert our_error <= 4 * their_error, (name, our_error, their_error)


@pytest.mark.parametrize("source", ["conv1.weight'); import os #", "a..b", "-1.weight", "[1, 2]", "a b"])
def test_a_source_that_is_not_a_state_dict_key_is_refused_at_its_line(source):
    """Only dotted identifiers and indices reach the generated module as ``params`` keys."""
    from symgrad.errors import SpecError
    from symgrad.spec import parse_spec

    text = (
        f"name: s\ninputs:\n  x: {{shape: [2, 3]}}\n  w: {{shape: [3], source: {source!r}}}\n  y: {{shape: [2, 3]}}\n"
        "layers:\n  - {op: mul, in: [x, w], out: h}\nloss: {op: mse_loss, in: h, target: y}\nwrt: [w]\n"
    )
    with pytest.raises(SpecError, match=r"s.yaml:4:\d+: error: input 'w' has source .* not a state_dict key"):
        parse_spec(text, "s.yaml")


def test_a_model_that_is_an_nn_sequential_binds_by_its_index_keys():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 2, 3, padding=1), torch.nn.BatchNorm2d(2), torch.nn.ReLU(), torch.nn.Conv2d(2, 1, 1)
    ).double()
    reference = copy.deepcopy(model)
    text = trace(model, {"input": (2, 1, 6, 6)}, name="sequential", loss=LossChoice("mse_loss", "y"), mode="train")
    assert "source: 0.weight" in text
    built = build_text(text, "sequential.yaml")
    step = symgrad.bind(module_from_source(built.rendered.files["sequential.py"], "sequential"), model)
    x, y = torch.randn(3, 1, 5, 7, dtype=torch.float64), torch.randn(3, 1, 5, 7, dtype=torch.float64)
    step(input=x, y=y).backward()
    F.mse_loss(reference(x), y).backward()
    scale = max(p.grad.abs().max() for p in reference.parameters())  # conv 0's bias feeds BatchNorm: zero by structure
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        assert (ours.grad - theirs.grad).abs().max() <= 1e-10 * scale
    assert torch.equal(model[1].running_mean, reference[1].running_mean)


def test_a_module_written_as_blocks_binds_a_wider_model_and_refuses_a_missing_submodule():
    """Written as blocks, the module reads each parameter by its ``state_dict()`` key at whatever
    size it has: a model of the same structure and another width trains with it as with autograd;
    one without a submodule it was traced with is refused at bind, in one line."""
    generated = generated_for(fresh_model(layers=(2, 2)), blocks=True)
    wider, reference = fresh_model(layers=(2, 2), width=6), fresh_model(layers=(2, 2), width=6)
    step = symgrad.bind(generated, wider)
    x, labels = next(batches(1))
    step(x=x, labels=labels).backward()
    F.cross_entropy(reference(x), labels).backward()
    compared = 0
    for ours, theirs in zip(wider.parameters(), reference.parameters()):
        assert (ours.grad is None) == (theirs.grad is None)  # the frozen stem gets none
        if theirs.grad is not None:
            assert (ours.grad - theirs.grad).abs().max() <= 1e-10 * theirs.grad.abs().max()
            compared += 1
    assert compared >= 20
    with pytest.raises(
        BindError,
        match=r"^tiny_resnet does not fit TinyResNet: layers\.1\.1 \(BasicBlock\) is no "
        r"submodule of the model any more \(fix: symgrad trace [^\n]*\)$",
    ):
        symgrad.bind(generated, fresh_model(layers=(2, 1)))  # its fingerprint, at bind


@pytest.mark.parametrize("freeze_stem", [True, False], ids=["frozen stem", "trained stem"])
@pytest.mark.parametrize("blocks", [False, True], ids=["flat", "blocks"])
def test_a_module_traced_for_the_parameters_alone_trains_as_autograd_and_computes_no_input_gradient(
    blocks, freeze_stem
):
    """``trace(..., wrt="parameters")``: what a training step needs, and no more (the input's gradient,
    a stem convolution's backward-data, is not computed); bound, it trains as autograd does. A trained
    stem's weight gradient alone is one ``convolution_backward`` call asking for it alone, with the
    weight itself, as autograd calls it (the readable ``backward`` writes ``conv2d_weight``), in the
    flat form and in the blocks form, which reads the weight from its ``params`` mapping too."""
    model = fresh_model(freeze_stem=freeze_stem, **({"layers": (2, 2)} if blocks else {}))
    reference = copy.deepcopy(model)
    text = trace(
        model,
        {"x": (2, 3, 16, 16)},
        wrt="parameters",
        name="params_only",
        loss=LossChoice("cross_entropy", "labels"),
        mode="train",
        blocks=blocks,
    )
    source = build_text(text, "params_only.yaml").rendered.files["params_only.py"]
    if not freeze_stem:
        weight = 'params["conv1.weight"]'  # with blocks or without, the parameters come in `params`
        # the weight and the input as the forward's convolution read them (themselves; under autocast their
        # copies: kept_casts.py)
        assert f"conv1_weight_autocast = _in_autocast_dtype({weight})" in source, source
        assert "x_autocast = _in_autocast_dtype(x)" in source, source
        assert (
            "_, grad_conv1_weight, _ = _convolution_backward(\n        grad_conv1, x_autocast, conv1_weight_autocast, "
            "[False, True, False]" in source
        ), source
    generated = module_from_source(source, "params_only")
    assert "x" not in generated.Gradients._fields
    step = symgrad.bind(generated, model)
    for x, labels in batches(2):
        step(x=x, labels=labels).backward()
        F.cross_entropy(reference(x), labels).backward()
    theirs = dict(reference.named_parameters())
    for key, value in model.named_parameters():
        if theirs[key].grad is None:  # frozen
            assert value.grad is None, key
            continue
        assert (value.grad - theirs[key].grad).abs().max() <= 1e-10 * theirs[key].grad.abs().max(), key


@pytest.mark.parametrize("blocks", [False, True], ids=["flat", "blocks"])
def test_a_train_mode_step_differentiated_twice_moves_the_statistics_once(blocks):
    """``create_graph=True`` and ``recompute=True`` re-run the forward inside the backward; the
    running statistics, held aside rather than saved, move in the step's forward alone, and the
    gradient of a gradient is autograd's."""
    model = fresh_model(**({"layers": (2, 2)} if blocks else {}))
    generated = generated_for(model, blocks=blocks)
    x, labels = next(batches(1))
    reference, once = copy.deepcopy(model), copy.deepcopy(model)
    with torch.no_grad():
        once(x)  # one forward in train mode: the statistics a step moves
    step = symgrad.bind(generated, model)
    parameters = [value for value in model.parameters() if value.requires_grad]
    grads = torch.autograd.grad(step(x=x, labels=labels), parameters, create_graph=True)
    second = torch.autograd.grad(sum((grad**2).sum() for grad in grads), parameters)
    theirs = [value for value in reference.parameters() if value.requires_grad]
    expected_grads = torch.autograd.grad(F.cross_entropy(reference(x), labels), theirs, create_graph=True)
    expected_second = torch.autograd.grad(sum((grad**2).sum() for grad in expected_grads), theirs)
    for got, expected in zip((*grads, *second), (*expected_grads, *expected_second)):
        assert (got - expected).abs().max() <= 1e-10 * max(expected.abs().max(), 1.0)
    for key, value in model.named_buffers():
        assert torch.equal(value, dict(once.named_buffers())[key]), key


class _DispatchCount(torch.utils._python_dispatch.TorchDispatchMode):
    """Every aten op one block of code dispatches, by name."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


VIEWS = {
    "view",
    "_unsafe_view",
    "reshape",
    "as_strided",
    "t",
    "transpose",
    "expand",
    "permute",
    "unsqueeze",
    "squeeze",
    "alias",
    "detach",
    "slice",
    "select",
    "split",
    "unbind",
    "split_with_sizes",
    "movedim",
}
"""Ops that make a view: no kernel runs."""


@pytest.mark.parametrize("network", ["resnet18", "unet"])
def test_a_bound_step_runs_no_more_kernels_than_autograd_and_never_waits_for_the_device(network, tmp_path):
    """On a GPU each op is a kernel launch, and a read back to the host (``.item()``, a tensor's truth
    value, ``F.one_hot``'s range check) stalls the queue: the benchmarked training step of each
    network (``benchmarks/training.py``: zero_grad, forward, explicit backward, SGD step) reads
    nothing back, and dispatches no more kernel-running ops than autograd's step."""
    from benchmarks.training import step_variants

    steps = step_variants(network, 2, 32, 8 if network == "resnet18" else 4, tmp_path, ["symgrad.bind", "autograd"])
    counted = {}
    for name, run in steps.items():
        run()  # first call: lazy initialisation and the optimizer's state are not what is counted
        with _DispatchCount() as mode:
            run()
        counted[name] = mode.counts
    kernels = {
        name: sum(number for op, number in counts.items() if op not in VIEWS) for name, counts in counted.items()
    }
    assert not {"_local_scalar_dense", "item", "is_nonzero"} & set(counted["symgrad.bind"]), counted["symgrad.bind"]
    assert kernels["symgrad.bind"] <= kernels["autograd"], (kernels, counted)


def test_two_generated_files_of_one_name_bound_in_one_process_keep_their_own_modules(tmp_path):
    """Each file bound by its path gets its own import name: a second file of the same stem must not
    replace the first one in sys.modules (a compiled step's guards find its module by that name)."""
    models = [fresh_model(), fresh_model(layers=(2, 2))]
    steps = []
    for index, (model, blocks) in enumerate(zip(models, (False, True))):
        text = trace(
            model,
            {"x": (2, 3, 16, 16)},
            name="tiny_twice",
            loss=LossChoice("cross_entropy", "labels"),
            mode="train",
            blocks=blocks,
        )
        folder = tmp_path / str(index)
        folder.mkdir()
        path = folder / "tiny_twice.py"
        path.write_text(build_text(text, "tiny_twice.yaml").rendered.files["tiny_twice.py"])
        steps.append(symgrad.bind(path, model))
    modules = [step.generated for step in steps]
    assert modules[0].__name__ != modules[1].__name__
    assert all(sys.modules[module.__name__] is module for module in modules)


def test_the_models_state_dict_is_what_to_save_not_the_bound_modules():
    """README: save ``model.state_dict()``, not ``fast.state_dict()``: the bound module holds the model as its
    submodule ``model``, so its keys start with ``model.`` and no fresh model loads them; the model's own
    state, after bound training steps, loads into a fresh model and computes what the trained one does."""
    model = fresh_model()
    fast = symgrad.bind(generated_for(model), model, verify=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, labels in batches(2):
        optimizer.zero_grad()
        fast(x=x, labels=labels).backward()
        optimizer.step()
    assert all(key.startswith("model.") for key in fast.state_dict())
    with pytest.raises(RuntimeError, match="Missing key"):
        fresh_model().load_state_dict(fast.state_dict())
    restored = fresh_model()
    restored.load_state_dict(model.state_dict())
    model.eval()
    restored.eval()
    assert torch.equal(restored(x), model(x))
