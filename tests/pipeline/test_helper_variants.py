"""A declared helper is written with only the parts its module's calls use (issue 64 item 5;
symgrad/rules/variant_helpers.py): a mean cross entropy over [N, C] scores has no branch for a per-sample
loss over an image's pixels, a module of plain convolutions no transposed or grouped keywords, a batch norm
with a weight no ones for a missing one; a module whose calls need a part keeps it, and each gives
autograd's gradients through the original module, float64, at another batch and size."""

from __future__ import annotations

import ast
import copy
import itertools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from symgrad.check import module_from_source
from symgrad.pipeline import build_text
from symgrad.rules.conv_helpers import CONVOLUTION_BACKWARD
from symgrad.rules.loss_helpers import CROSS_ENTROPY_BACKWARD
from symgrad.rules.norm_helpers import BATCH_NORM_BACKWARD
from symgrad.trace import LossChoice, trace

DECLARATIONS = [CONVOLUTION_BACKWARD, BATCH_NORM_BACKWARD, CROSS_ENTROPY_BACKWARD]


@pytest.mark.parametrize("declaration", DECLARATIONS, ids=lambda item: item.template.split("(")[0].split()[-1])
def test_every_choice_of_parts_is_one_function_within_100_columns(declaration):
    for count in range(len(declaration.parts) + 1):
        for parts in itertools.combinations(declaration.parts, count):
            source = declaration.source(frozenset(parts))
            tree = ast.parse(source)
            assert len(tree.body) == 1 and isinstance(tree.body[0], ast.FunctionDef), parts
            assert max(map(len, source.splitlines())) <= 100, parts
    with pytest.raises(ValueError, match="no part"):
        declaration.source(frozenset({"no_such_part"}))


def _helper(declaration, parts):
    namespace = {"torch": torch, "F": F}
    exec(declaration.source(frozenset(parts)), namespace)
    return next(value for key, value in namespace.items() if key.startswith("_") and callable(value))


def test_each_variant_computes_the_whole_helpers_values_bit_for_bit():
    """The parts left out are branches the call never takes: what remains is the same kernels' calls."""
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(5, 4, generator=generator).log_softmax(1)
    target = torch.tensor([0, 3, -100, 1, 2])
    for reduction, grad in (("mean", torch.tensor(0.7)), ("sum", torch.tensor(1.3)), ("none", torch.randn(5))):
        arguments = (grad, scores, target, torch.float32, reduction)
        wanted = _helper(CROSS_ENTROPY_BACKWARD, CROSS_ENTROPY_BACKWARD.parts)(*arguments)
        assert torch.equal(_helper(CROSS_ENTROPY_BACKWARD, {"rows"})(*arguments), wanted)
    planes = torch.randn(2, 4, 3, 5, generator=generator).log_softmax(1)
    classes = torch.randint(0, 4, (2, 3, 5), generator=generator)
    arguments = (torch.randn(2, 3, 5, generator=generator), planes, classes, torch.float32, "none")
    wanted = _helper(CROSS_ENTROPY_BACKWARD, CROSS_ENTROPY_BACKWARD.parts)(*arguments)
    assert torch.equal(_helper(CROSS_ENTROPY_BACKWARD, {"planes"})(*arguments), wanted)

    x, w = torch.randn(2, 3, 9, 9, generator=generator), torch.randn(4, 3, 3, 3, generator=generator)
    grad = torch.randn(2, 4, 5, 5, generator=generator)  # 9 x 9, stride 2, padding 1: 5 x 5
    options = {"stride": 2, "padding": 1, "weight_dtype": w.dtype}
    wanted = _helper(CONVOLUTION_BACKWARD, CONVOLUTION_BACKWARD.parts)(grad, x, w, [True, True, False], **options)
    got = _helper(CONVOLUTION_BACKWARD, ())(grad, x, w, [True, True, False], **options)
    assert all(torch.equal(a, b) for a, b in zip(got[:2], wanted[:2])) and got[2] is wanted[2] is None

    x = torch.randn(6, 4, 5, 5, generator=generator)
    mean, invstd = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False).add(1e-5).rsqrt()
    arguments = (torch.randn(6, 4, 5, 5, generator=generator), x, torch.randn(4, generator=generator), mean, invstd)
    wanted = _helper(BATCH_NORM_BACKWARD, BATCH_NORM_BACKWARD.parts)(*arguments)
    assert all(torch.equal(a, b) for a, b in zip(_helper(BATCH_NORM_BACKWARD, ())(*arguments), wanted))


class Segmenter(nn.Module):
    """Two convolutions, one of them grouped, a batch norm without a weight, and per-pixel scores."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.norm = nn.BatchNorm2d(4, affine=False)
        self.mix = nn.Conv2d(4, 4, 3, padding=1, groups=2)
        self.scores = nn.Conv2d(4, 5, 1)

    def forward(self, x):
        return self.scores(torch.relu(self.mix(self.norm(self.conv(x)))))


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.norm = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(torch.relu(self.norm(self.conv(x))), 1).flatten(1))


def _module(model, name, reduction):
    text = trace(
        model,
        {"x": (2, 3, 8, 8)},
        wrt="parameters",
        name=name,
        loss=LossChoice("cross_entropy", reduction=reduction),
        mode="train",
    )
    source = build_text(text, f"{name}.yaml", documents=False, tests=False).rendered.files[f"{name}.py"]
    return source, module_from_source(source, name)


def _helper_text(source, name):
    return source[source.index(f"def {name}(") :].split("\n\ndef ", 1)[0]


def test_a_mean_over_rows_has_no_per_sample_branch_and_plain_convolutions_no_grouped_keywords():
    torch.manual_seed(0)
    source, _ = _module(Classifier(), "classifier", "mean")
    loss = _helper_text(source, "_cross_entropy_backward")
    assert "how == 0" not in loss and "nll_loss2d_backward" not in loss and "seen, classes" not in loss
    assert "torch.ops.aten.nll_loss_backward(grad, log_probs, target, None, how, -100, total)" in loss
    convolution = _helper_text(source, "_convolution_backward")
    assert "groups" not in convolution and "transposed" not in convolution and "bias_sizes" not in convolution
    norm = _helper_text(source, "_batch_norm_backward")
    assert "new_ones" not in norm and "output_mask" not in norm


def test_a_per_pixel_loss_keeps_its_branch_and_the_grouped_convolution_its_keywords_as_autograd():
    torch.manual_seed(0)
    model = Segmenter()
    source, module = _module(model, "segmenter", "per_sample")
    loss = _helper_text(source, "_cross_entropy_backward")
    assert "torch.ops.aten.nll_loss2d_backward(grad, log_probs, target, None, how, -100, total)" in loss
    assert "nll_loss_backward(" not in loss.replace("nll_loss2d_backward(", "")  # no [N, C] kernel: none called
    assert "groups=1, bias_sizes=None" in _helper_text(source, "_convolution_backward")
    assert "new_ones" in _helper_text(source, "_batch_norm_backward")
    reference = copy.deepcopy(model).double().train()
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 3, 10, 7, dtype=torch.float64, generator=generator)
    target = torch.randint(0, 5, (3, 10, 7), generator=generator)
    target[0, 0, :3] = -100
    cotangent = torch.randn(3, dtype=torch.float64, generator=generator)
    losses = F.cross_entropy(reference(x), target, reduction="none").sum(dim=(1, 2))
    wanted = torch.autograd.grad(losses, list(reference.parameters()), cotangent)
    params = {key: value.detach().clone() for key, value in copy.deepcopy(model).double().state_dict().items()}
    got = module.gradients(x, target, params, grad_loss=cotangent).params
    for (key, _), value in zip(reference.named_parameters(), wanted):
        assert (got[key] - value).abs().max().item() <= 1e-12 * max(1.0, value.abs().max().item()), key
