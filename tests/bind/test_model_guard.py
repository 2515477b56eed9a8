"""``symgrad.bind`` of a model traced without a loss (a ``BoundModel``) keeps the guarantees of the
loss-ending form, from the user's side: every tensor that requires grad gets its gradient or a
one-line error, every BatchNorm and dropout runs in the mode it was traced in (the train module or its
eval sibling, as ``model.training`` picks), a call the model refuses moves no buffer, and the bound
model deep-copies, pickles and saves as an ordinary module that trains as autograd does (float64,
another batch and spatial size, <= 1e-10)."""

from __future__ import annotations

import copy
import io
import pickle
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symgrad
from symgrad.pipeline import build_text
from symgrad.trace import trace_modes

FORMS = ("flat", "blocks")


class ConvBnAct(nn.Module):
    """timm's ConvNormAct: conv, BatchNorm, activation."""

    def __init__(self, in_chs, out_chs, kernel_size=3, stride=1):
        super().__init__()
        self.conv = nn.Conv2d(in_chs, out_chs, kernel_size, stride=stride, padding=kernel_size // 2, bias=False)
        self.bn = nn.BatchNorm2d(out_chs)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Net(nn.Module):
    """A small classifier: stem, global pool, dropout, head (as timm's ClassifierHead runs them)."""

    def __init__(self, in_chans=3, num_features=4, num_classes=3, drop_rate=0.25):
        super().__init__()
        self.stem = ConvBnAct(in_chans, num_features)
        self.global_pool = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(drop_rate)
        self.fc = nn.Linear(num_features, num_classes)

    def forward(self, x):
        x = self.stem(x)
        x = self.global_pool(x).flatten(1)
        return self.fc(self.drop(x))


def bound(tmp_path: Path, model: nn.Module, form: str, name: str = "net"):
    """``model`` traced in both modes without a loss, generated into ``tmp_path``, bound by path."""
    paths = []
    for text in trace_modes(model, {"x": (2, 3, 8, 8)}, "parameters", name, blocks=form == "blocks"):
        built = build_text(text, f"{name}.yaml")
        for file, content in built.rendered.files.items():
            (tmp_path / file).write_text(content)
        paths.append(tmp_path / f"{built.graph.spec.name}.py")
    return symgrad.bind(paths[0], model, verify=False)


def images(batch=3, height=5, width=7, seed=1):
    return torch.randn(batch, 3, height, width, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def train_step(net: nn.Module, x: torch.Tensor, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)  # the same dropout mask in the bound model and in the model
    logits = net(x)
    F.cross_entropy(logits, torch.arange(x.shape[0]) % 3).backward()
    return logits.detach()


def assert_same_training(model: nn.Module, reference: nn.Module) -> None:
    for (name, value), expected in zip(model.named_parameters(), reference.parameters()):
        assert (value.grad - expected.grad).abs().max().item() <= 1e-10, name
    for (name, value), expected in zip(model.named_buffers(), reference.buffers()):
        assert (value.double() - expected.double()).abs().max().item() <= 1e-10, name


@pytest.mark.parametrize("form", FORMS)
def test_an_input_that_requires_grad_outside_wrt_is_refused_in_one_line(form, tmp_path):
    torch.manual_seed(0)
    model = Net().double()
    fast = bound(tmp_path, model, form)
    upstream = nn.Conv2d(3, 3, 1).double()  # features of another network, fed as x
    with pytest.raises(symgrad.BindError, match=r"x requires grad, and the module computes no gradient for it"):
        fast(upstream(images()))
    fast(upstream(images()).detach())  # as the fix says
    with torch.no_grad():  # no gradient asked for
        fast(upstream(images()))


@pytest.mark.parametrize("form", FORMS)
def test_a_parameter_frozen_when_traced_and_unfrozen_later_is_refused(form, tmp_path):
    torch.manual_seed(0)
    model = Net().double()
    for parameter in model.stem.bn.parameters():  # BatchNorm's affine frozen, as detectron2 fine-tunes
        parameter.requires_grad_(False)
    fast = bound(tmp_path, model, form)
    train_step(fast, images())
    assert model.stem.bn.weight.grad is None and model.stem.conv.weight.grad is not None
    model.stem.bn.weight.requires_grad_(True)  # unfrozen for the second phase of training
    with pytest.raises(symgrad.BindError, match=r"stem\.bn\.weight requires grad, .* frozen when traced"):
        fast(images())


def test_every_batchnorm_and_dropout_runs_in_the_mode_of_the_module_that_serves_the_model(tmp_path):
    torch.manual_seed(0)
    model = Net().double()
    reference = copy.deepcopy(model)
    fast = bound(tmp_path, model, "flat")
    model.drop.eval()  # dropout switched off by hand in training: the train module would still drop
    with pytest.raises(symgrad.BindError, match=r"drop \(Dropout\) in train mode, and it is now in eval mode"):
        fast(images())
    model.train()
    model.eval()
    model.stem.bn.train()  # BatchNorm re-estimating statistics in eval: the eval sibling uses the running ones
    with pytest.raises(symgrad.BindError, match=r"stem\.bn \(BatchNorm2d\) in eval mode, and it is now in train mode"):
        fast(images())
    model.train()
    train_step(fast, images())
    train_step(reference, images())
    assert_same_training(model, reference)


@pytest.mark.parametrize("form", FORMS)
def test_a_call_the_model_refuses_moves_no_buffer(form, tmp_path):
    torch.manual_seed(0)
    model = Net().double()
    reference = copy.deepcopy(model)
    fast = bound(tmp_path, model, form)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=r"^Expected more than 1 value per channel when training"):
        fast(images(batch=1, height=1, width=1))  # PyTorch's own message, as the model raises it
    with pytest.raises(ValueError, match=r"^Expected more than 1 value per channel when training"):
        copy.deepcopy(reference)(images(batch=1, height=1, width=1))
    with pytest.raises(symgrad.BindError, match=r"cannot take x \[2, 5, 6, 6\].*nothing was moved"):
        fast(torch.randn(2, 5, 6, 6, dtype=torch.float64))  # the wrong channel count
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    for seed in range(2):
        train_step(fast, images(seed=seed), seed)
        train_step(reference, images(seed=seed), seed)
    assert model.stem.bn.num_batches_tracked.item() == reference.stem.bn.num_batches_tracked.item() == 2
    assert_same_training(model, reference)


@pytest.mark.parametrize("form", FORMS)
def test_a_bound_model_deepcopies_pickles_and_saves_and_trains_as_autograd(form, tmp_path):
    torch.manual_seed(0)
    model = Net().double()
    reference = copy.deepcopy(model)
    fast = bound(tmp_path, model, form)
    train_step(fast, images(seed=2))
    train_step(reference, images(seed=2))
    assert set(fast.state_dict()) == {f"model.{key}" for key in model.state_dict()}
    copies = [copy.deepcopy(fast), pickle.loads(pickle.dumps(fast))]
    buffer = io.BytesIO()
    torch.save(fast, buffer)
    buffer.seek(0)
    copies.append(torch.load(buffer, weights_only=False))
    states = io.BytesIO()
    torch.save(fast.state_dict(), states)
    states.seek(0)
    fresh = bound(tmp_path, Net().double(), form, name="net_again")
    fresh.load_state_dict(torch.load(states))
    copies.append(fresh)
    for copied in copies:
        assert copied.model is not model
        for key, value in copied.state_dict().items():
            assert torch.equal(value, fast.state_dict()[key]), key
        theirs = copy.deepcopy(reference)
        for net in (copied.model, theirs):
            for parameter in net.parameters():
                parameter.grad = None
        train_step(copied, images(batch=4, height=6, width=5, seed=3), seed=3)
        train_step(theirs, images(batch=4, height=6, width=5, seed=3), seed=3)
        assert_same_training(copied.model, theirs)
        copied.model.eval()
        theirs.eval()
        assert (copied(images()) - theirs(images())).abs().max().item() <= 1e-10


@pytest.mark.parametrize("form", FORMS)
def test_a_frozen_stem_convolution_binds_and_trains_as_autograd(form, tmp_path):
    """The stem's convolution frozen (fine-tuning): no gradient flows into any convolution, and the module's
    backward has no weight to move to channels_last (an empty `if` made the generated module not compile)."""
    torch.manual_seed(0)
    model = Net().double()
    model.stem.conv.weight.requires_grad_(False)
    reference = copy.deepcopy(model)
    fast = bound(tmp_path, model, form)
    for seed in range(2):
        train_step(fast, images(4, 6, 5, seed=seed), seed=seed)
        train_step(reference, images(4, 6, 5, seed=seed), seed=seed)
    assert model.stem.conv.weight.grad is None and reference.stem.conv.weight.grad is None
    model.stem.conv.weight.grad = reference.stem.conv.weight.grad = torch.zeros_like(model.stem.conv.weight)
    assert_same_training(model, reference)


@pytest.mark.parametrize("form", FORMS)
def test_an_empty_batch_is_refused_in_one_line_and_moves_nothing(form, tmp_path):
    torch.manual_seed(0)
    model = Net().double()
    fast = bound(tmp_path, model, form)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=r"^x has shape \[0, 3, 5, 7\]: an empty batch.*skip empty batches\)$"):
        fast(images(0))
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())


@pytest.mark.parametrize("form", FORMS)
def test_a_bound_model_under_non_reentrant_checkpoint_trains_as_the_model_under_it(form, tmp_path):
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = Net(drop_rate=0.0).double().train()
    reference = copy.deepcopy(model)
    fast = bound(tmp_path, model, form)
    x = images()
    for net in (fast, reference):  # the recomputation stops early: checkpoint's signal passes through untouched
        F.cross_entropy(checkpoint(net, x, use_reentrant=False), torch.arange(3) % 3).backward()
    assert_same_training(model, reference)
