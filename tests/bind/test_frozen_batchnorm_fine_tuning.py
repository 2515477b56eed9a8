"""Fine-tuning with a frozen backbone, from the user's side: ``model.train(); model.backbone.eval()``, so that
the backbone's BatchNorm normalises with its running statistics and moves none of them, and its dropout
draws nothing, while the head trains (its own BatchNorm in train mode). Traced without ``--train``/``--eval``
the model is traced as set; bound, it trains as autograd does through the model itself (float64, another
batch and size than traced, <= 1e-10, several SGD steps), the frozen statistics unchanged; ``model.eval()``
runs the eval-mode module; any other combination of modes is refused, naming the submodules that differ and
the ``symgrad trace`` options that trace the model as it is."""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

import symgrad
from symgrad.cli import main
from symgrad.pipeline import build_text
from symgrad.trace import load_target, trace_modes

MODEL = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock."""

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class Backbone(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = nn.Sequential(BasicBlock(width, width), BasicBlock(width, width))
        self.layer2 = nn.Sequential(BasicBlock(width, 2 * width, stride=2))
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.layer2(self.layer1(self.relu(self.bn1(self.conv1(x))))))


class Net(nn.Module):
    """A pretrained backbone and a new head, the backbone frozen (its BatchNorm and dropout in eval mode)."""

    def __init__(self, width=4, classes=3, frozen=True, head_norm=True):
        super().__init__()
        self.backbone = Backbone(width)
        self.head = nn.Sequential(nn.Linear(2 * width, 2 * width, bias=False), nn.BatchNorm1d(2 * width), nn.ReLU(),
                                  nn.Linear(2 * width, classes)) if head_norm else nn.Linear(2 * width, classes)
        if frozen:
            self.backbone.eval()

    def forward(self, x):
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.backbone(x), 1), 1))


class LossNet(Net):
    def forward(self, x, labels):
        return F.cross_entropy(super().forward(x), labels)
'''
FORMS = ["flat", "blocks"]


def model_file(folder) -> str:
    path = folder / "fine_tune.py"
    path.write_text(MODEL)
    return str(path)


def pretrained(file: str, kind: str = "Net", **init) -> torch.nn.Module:
    """The model built as its class builds it (the backbone frozen), in float64, its BatchNorms given the
    running statistics and affine parameters of a trained network (fresh ones, 0 and 1, hide a mode's effect)."""
    torch.manual_seed(0)
    model = load_target(f"{file}:{kind}", init).double()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                size = module.num_features
                module.running_mean.copy_(torch.randn(size, generator=generator, dtype=torch.float64))
                module.running_var.copy_(torch.rand(size, generator=generator, dtype=torch.float64) + 0.5)
                module.weight.copy_(torch.rand(size, generator=generator, dtype=torch.float64) + 0.5)
                module.bias.copy_(torch.randn(size, generator=generator, dtype=torch.float64))
    return model


def generated(folder, *texts) -> list:
    """Each spec text's module generated into ``folder`` (as ``symgrad generate`` writes it, without its
    pages); the modules' paths."""
    paths = []
    for text in texts:
        built = build_text(text, "traced.yaml", documents=False)
        paths.append(folder / f"{built.graph.spec.name}.py")
        paths[-1].write_text(built.rendered.files[paths[-1].name])
    return paths


def batch(seed: int, size: int = 3):
    """Another batch and spatial size than traced (2 x 3 x 8 x 8)."""
    generator = torch.Generator().manual_seed(seed)
    return (
        torch.randn(size, 3, 6, 10, generator=generator, dtype=torch.float64),
        torch.randint(0, 3, (size,), generator=generator),
    )


def frozen_statistics(model) -> dict:
    return {
        key: value.clone() for key, value in model.backbone.state_dict().items() if "running" in key or "batches" in key
    }


def fine_tune(step, model, reference, loss_form: bool, steps: int = 3) -> None:
    """``steps`` of SGD through ``step`` (the bound model) and through ``reference`` (autograd): the same
    gradients, parameters and buffers at each step, the backbone's statistics as they were."""
    head_norms = [module for module in model.head.modules() if isinstance(module, torch.nn.BatchNorm1d)]
    frozen, counted = frozen_statistics(model), [module.num_batches_tracked.item() for module in head_norms]
    ours = torch.optim.SGD([value for value in model.parameters() if value.requires_grad], lr=0.1, momentum=0.9)
    theirs = torch.optim.SGD([value for value in reference.parameters() if value.requires_grad], lr=0.1, momentum=0.9)
    for index in range(steps):
        x, labels = batch(index + 2)
        for optimizer in (ours, theirs):
            optimizer.zero_grad()
        torch.manual_seed(index)
        (step(x=x, labels=labels) if loss_form else F.cross_entropy(step(x), labels)).backward()
        torch.manual_seed(index)
        (reference(x, labels) if loss_form else F.cross_entropy(reference(x), labels)).backward()
        expected = dict(reference.named_parameters())
        scale = max(value.grad.abs().max().item() for value in expected.values() if value.grad is not None)
        for key, value in model.named_parameters():
            if expected[key].grad is None:
                assert value.grad is None, key
            else:
                assert (value.grad - expected[key].grad).abs().max().item() <= 1e-10 * scale, (index, key)
        ours.step()
        theirs.step()
    for (key, value), expected in zip(model.state_dict().items(), reference.state_dict().values()):
        assert (value.double() - expected.double()).abs().max().item() <= 1e-10, key
    assert all(torch.equal(value, frozen[key]) for key, value in frozen_statistics(model).items())
    assert [module.num_batches_tracked.item() - count for module, count in zip(head_norms, counted)] == [steps] * len(
        head_norms
    )  # the head's BatchNorm trains


@pytest.mark.parametrize("form", FORMS)
def test_a_model_returning_outputs_fine_tunes_with_its_backbone_frozen_as_set(form, tmp_path):
    model = pretrained(model_file(tmp_path), frozen=False)
    model.train()
    model.backbone.eval()  # frozen after building, as a fine-tuning script does
    model.backbone.requires_grad_(False)
    specs = trace_modes(model, {"x": (2, 3, 8, 8)}, "parameters", "net", blocks=form == "blocks")
    assert specs[1] is not None and "eval: net_eval" in specs[0]
    assert model.training and not any(module.training for module in model.backbone.modules())  # left as set
    reference = copy.deepcopy(model)
    fast = symgrad.bind(generated(tmp_path, *specs)[0], model, verify=False)
    fine_tune(fast, model, reference, loss_form=False)
    model.eval()  # the eval-mode module: every BatchNorm with its running statistics
    reference.eval()
    x, _ = batch(7, size=2)
    assert (fast(x) - reference(x)).abs().max().item() <= 1e-10
    for each in (model, reference):  # back to fine-tuning
        each.train()
        each.backbone.eval()
    fine_tune(fast, model, reference, loss_form=False, steps=1)


def test_a_frozen_backbone_under_a_head_without_modes_is_one_module_serving_the_model_as_set_and_in_eval(tmp_path):
    """The model as set computes what model.eval() does (every BatchNorm and dropout is in the backbone): one
    spec, which serves both, and is refused where the model's modes differ from it."""
    model = pretrained(model_file(tmp_path), head_norm=False)
    specs = trace_modes(model, {"x": (2, 3, 8, 8)}, "parameters", "net")
    assert specs[1] is None and "\neval:" not in specs[0]
    reference = copy.deepcopy(model)
    fast = symgrad.bind(generated(tmp_path, specs[0])[0], model, verify=False)
    fine_tune(fast, model, reference, loss_form=False, steps=2)
    model.eval()
    reference.eval()
    x, _ = batch(7, size=2)
    assert (fast(x) - reference(x)).abs().max().item() <= 1e-10
    model.train()  # the backbone unfrozen
    with pytest.raises(
        symgrad.BindError,
        match=r"^net was traced in eval mode only, and the model is now in train mode "
        r"\(fix: call model\.eval\(\), or trace and generate the model as it is "
        r"now: symgrad trace \S*fine_tune\.py:Net --input \.\.\. --train -o",
    ):
        fast(x)


@pytest.mark.parametrize("form", ["blocks", "--flat"])
def test_the_command_line_traces_a_loss_ending_model_with_its_backbone_frozen_as_set(form, tmp_path):
    file = model_file(tmp_path)
    spec = tmp_path / "loss_net.yaml"
    result = CliRunner().invoke(
        main,
        [
            "trace",
            f"{file}:LossNet",
            "--input",
            "x=2,3,8,8",
            "--input",
            "labels=int64:2",
            "--wrt",
            "parameters",
            "--name",
            "loss_net",
            "-o",
            str(spec),
            *([form] if form == "--flat" else []),
        ],
    )
    assert result.exit_code == 0, result.output
    assert (form == "blocks") == ("\nblocks:" in spec.read_text())
    module = symgrad.bind(generated(tmp_path, spec.read_text())[0], model := pretrained(file, "LossNet")).generated
    # the generated gradients, called on the model's own tensors: those of the model as its class sets it
    x, labels = batch(1)
    params = dict(model.named_parameters())
    buffers = {key: value.clone() for key, value in model.named_buffers() if not key.endswith("num_batches_tracked")}
    loss = module.loss_with_explicit_backward(x=x, labels=labels, params={**params, **buffers})
    expected_loss = model(x, labels)
    expected = torch.autograd.grad(expected_loss, list(params.values()))
    got = torch.autograd.grad(loss, list(params.values()))
    assert abs(loss.item() - expected_loss.item()) <= 1e-12
    assert max((a - b).abs().max().item() for a, b in zip(got, expected)) <= 1e-10 * max(
        g.abs().max().item() for g in expected
    )
    model = pretrained(file, "LossNet")
    reference = copy.deepcopy(model)
    fine_tune(symgrad.bind(module, model), model, reference, loss_form=True)


def test_other_modes_are_refused_naming_the_submodules_and_the_options_that_trace_them(tmp_path):
    file = model_file(tmp_path)
    model = pretrained(file)  # the backbone frozen in __init__
    fast = symgrad.bind(
        generated(tmp_path, *trace_modes(model, {"x": (2, 3, 8, 8)}, "parameters", "net"))[0], model, verify=False
    )
    x, _ = batch(1)
    fast(x)
    assert fast.serving() == 0  # the train-mode module (a CUDA graph's key)
    model.backbone.layer2.train()  # part of the backbone unfrozen: traced neither so nor in model.eval()
    with pytest.raises(symgrad.BindError) as refused:
        fast(x)
    message = str(refused.value)
    assert re.match(
        r"net was traced with backbone\.layer2\.0\.bn1 \(BatchNorm2d\), backbone\.layer2\.0\.bn2 "
        r"\(BatchNorm2d\), backbone\.layer2\.0\.downsample\.1 \(BatchNorm2d\) in eval mode, and they are "
        r"now in train mode \(fix: call \.eval\(\) on them after model\.train\(\), or trace and generate the "
        r"model as it is now: symgrad trace \S*fine_tune\.py:Net --input \.\.\. "
        r"--modes backbone=eval,backbone\.layer2=train -o \S+ && symgrad generate",
        message,
    ), message
    assert "\n" not in message and "backbone.bn1" not in message and "head" not in message
    model.train()  # the whole model training: the backbone's statistics would move
    with pytest.raises(
        symgrad.BindError,
        match=r"backbone\.bn1 \(BatchNorm2d\), backbone\.layer1\.0\.bn1 \(BatchNorm2d\), "
        r"backbone\.layer1\.0\.bn2 \(BatchNorm2d\) and 6 more in eval mode.* --train -o",
    ):
        fast(x)
    model.eval()
    assert fast.serving() == 1
    model.head.train()  # the modes traced in train mode (the root's own forward reads no mode)
    fast(x)
    assert fast.serving() == 0
    model.eval()
    model.backbone.layer1.train()  # evaluating, part of the backbone re-estimating its statistics
    with pytest.raises(
        symgrad.BindError,
        match=r"^net_eval was traced with backbone\.layer1\.0\.bn1 \(BatchNorm2d\), "
        r"backbone\.layer1\.0\.bn2 \(BatchNorm2d\), backbone\.layer1\.1\.bn1 "
        r"\(BatchNorm2d\) and 1 more in eval mode, and they are now in train mode "
        r"\(fix: call \.eval\(\) on them, or .* "
        r"--eval --modes backbone\.layer1=train -o",
    ):
        fast(x)
    model.train()
    model.backbone.eval()  # as traced again
    fast(x)


def test_modes_set_on_the_command_line_are_the_model_as_set(tmp_path):
    file = model_file(tmp_path)
    runner = CliRunner()

    def traced(*options):
        spec = tmp_path / "net.yaml"
        result = runner.invoke(
            main,
            [
                "trace",
                f"{file}:Net",
                "--input",
                "x=2,3,8,8",
                "--init",
                "frozen=False",
                "--flat",
                "-o",
                str(spec),
                *options,
            ],
        )
        assert result.exit_code == 0, result.output
        return spec.read_text(), (tmp_path / "net_eval.yaml").read_text()

    def trained(text) -> list[bool]:  # each BatchNorm's mode, in the spec's order
        return ["training: true" in line for line in re.findall(r".*op: batch_norm\b.*", text)]

    train, evaluation = traced("--modes", "backbone=eval")
    assert trained(train) == [False] * 8 + [True] and trained(evaluation) == [False] * 9
    train, evaluation = traced()  # built unfrozen: the whole model trains
    assert trained(train) == [True] * 9 and "op: dropout" in train and "op: dropout" not in evaluation
    result = runner.invoke(main, ["trace", f"{file}:Net", "--input", "x=2,3,8,8", "--modes", "backbone.layer9=eval"])
    assert result.exit_code == 2 and result.output.startswith(
        "error: --modes names backbone.layer9, which is no submodule of Net (fix:"
    ), result.output


def test_a_model_traced_in_eval_mode_gets_a_train_spec_of_the_whole_model_and_keeps_its_modes(tmp_path):
    """The stated rule: the spec of the mode the root is in is the model as set; the other is the whole model
    in the other mode. Test-time adaptation (``model.eval()``, its BatchNorm re-estimating statistics)."""
    model = pretrained(model_file(tmp_path))
    model.eval()
    model.head[1].train()
    train, evaluation = trace_modes(model, {"x": (2, 3, 8, 8)}, "parameters", "net", blocks=False)
    assert re.search(r"^name: net\n", train, re.MULTILINE) and re.search(r"^name: net_eval\n", evaluation, re.MULTILINE)
    norms = [re.findall(r".*op: batch_norm\b.*", text) for text in (train, evaluation)]
    assert len(norms[0]) == 9 and all("training: true" in line for line in norms[0])  # model.train()
    assert ["training: true" in line for line in norms[1]] == [False] * 8 + [True]  # as set
    assert not model.training and model.head[1].training and not model.backbone.training
