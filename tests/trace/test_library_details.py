"""Details of the real model libraries that look-alikes missed (issue 63; ``benchmarks/upstream_check.py`` runs the
libraries themselves, outside CI): each written here without the library, at the smallest sizes that show it,
traced for its parameters as blocks (the CLI's default), bound, and one step compared with autograd in float64 at
another batch (and size, where the model takes one)."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

import symgrad
from symgrad.check import module_from_source
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace
from tests.models.test_bind_zoo import assert_trained_as_autograd


def _bound_step_matches(
    model: nn.Module, traced: dict, checked: dict, dtypes: dict | None = None, data: dict | None = None
) -> str:
    """Trace ``model`` (float64, train mode) at ``traced``, bind the generated step and compare one step at
    ``checked`` with autograd's (``data``: the checked int64 inputs). Returns the spec."""
    torch.manual_seed(0)
    model = model.double().train()
    text = trace(
        model,
        traced,
        wrt="parameters",
        name="step",
        loss=LossChoice("mse_loss", "target"),
        mode="train",
        blocks=True,
        dtypes=dtypes,
    )
    generated = module_from_source(build_text(text, "step.yaml", documents=False).rendered.files["step.py"], "step")
    generator = torch.Generator().manual_seed(3)
    inputs = {key: torch.randn(shape, generator=generator, dtype=torch.float64) for key, shape in checked.items()}
    inputs.update(data or {})
    reference, once = copy.deepcopy(model), copy.deepcopy(model)
    with torch.no_grad():
        target = torch.randn_like(once(**inputs))
    step = symgrad.bind(generated, model)
    step(**inputs, target=target).backward()
    F.mse_loss(reference(**inputs), target).backward()
    assert_trained_as_autograd(model, reference, once)
    return text


class RelativePositionAttention(nn.Module):
    """timm's Swin / CoAtNet / EfficientFormerV2 attention bias: a learnt table read through an int64
    ``relative_position_index`` buffer each block holds (``table[index.view(-1)].view(N, N, heads)``)."""

    def __init__(self, window: int = 3, dim: int = 4):
        super().__init__()
        self.table = nn.Parameter(torch.randn(2 * window - 1, 1))
        position = torch.arange(window)
        self.register_buffer("relative_position_index", (position[:, None] - position[None, :] + window - 1))
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        n = self.relative_position_index.shape[0]
        bias = self.table[self.relative_position_index.view(-1)].view(n, n)
        attention = (x @ x.transpose(-1, -2) + bias).softmax(dim=-1)
        return x + self.proj(attention @ x)


class Stages(nn.Module):
    """Three instances of ``block`` after a linear stem, as a timm model's ``stages``."""

    def __init__(self, block, stem: nn.Module | None = None, **options):
        super().__init__()
        self.stem = stem or nn.Linear(4, 4)
        self.stages = nn.Sequential(*(block(**options) for _ in range(3)))

    def forward(self, x):
        return self.stages(self.stem(x))


def test_an_int64_index_buffer_each_chained_block_holds_goes_in():
    """The blocks run one after another (one chain in the generated code), each binding its own index buffer:
    refused before as if the chain read an int64 input as something other than an index."""
    model = Stages(RelativePositionAttention)
    text = _bound_step_matches(model, {"x": (2, 3, 4)}, {"x": (3, 3, 4)})
    assert "relative_position_index" in text and "{block:" in text


class MixedConv(nn.ModuleDict):
    """timm's MixNet ``MixedConv2d``: a ``ModuleDict`` of depthwise convolutions with other kernel sizes, each on
    its own unequal split of the channels (``torch.split(x, self.splits, 1)``), cat-ed back."""

    def __init__(self, splits=(2, 1, 1, 1)):
        super().__init__()
        for index, size in enumerate(splits):
            self.add_module(str(index), nn.Conv2d(size, size, 2 * index + 1, padding=index, groups=size))
        self.splits = list(splits)

    def forward(self, x):
        parts = torch.split(x, self.splits, 1)
        return torch.cat([conv(parts[index]) for index, conv in enumerate(self.values())], 1)


def test_a_module_dict_of_numbered_convolutions_on_unequal_splits_goes_in():
    """Four leaf children named by number in a ``ModuleDict`` (looked up there by the number, not its text:
    a ``KeyError: 0`` inside the tracer before)."""
    model = nn.Sequential(nn.Conv2d(3, 5, 1), MixedConv())
    _bound_step_matches(model, {"input": (2, 3, 6, 6)}, {"input": (3, 3, 5, 7)})


def test_a_softmax_in_a_module_named_by_a_number_is_named():
    """``nn.Softmax`` as a Sequential's child "1": its layer is named ``layer_softmax_1`` (every name
    ``softmax_...`` takes the prefix the generated code reserves; tracing looped for ever before)."""
    text = trace(nn.Sequential(nn.Linear(4, 4), nn.Softmax(dim=-1)), {"input": (2, 4)}, timeout=30)
    assert "out: layer_softmax_1}" in text


class StdConv2d(nn.Conv2d):
    """timm's ``StdConv2d`` (BiT): the weight standardised by a batch_norm over each output channel's entries
    before the convolution."""

    def forward(self, x):
        weight = F.batch_norm(
            self.weight.reshape(1, self.out_channels, -1), None, None, training=True, momentum=0.0, eps=1e-8
        ).reshape_as(self.weight)
        return F.conv2d(x, weight, self.bias, self.stride, self.padding)


def test_a_standardised_weight_larger_than_the_image_is_not_taken_for_the_data():
    """The layout test reads the data input's size: a model's 4-d parameter with more positions than the image
    (BiT's 3x3 weights at a small image), read by a reshape rather than a convolution, was taken for the data and
    read by its spec name where the parameters are in ``params`` (refused as a name the module uses itself)."""
    model = Stages(StandardisedBlock, stem=nn.Conv2d(3, 8, 3, padding=1))
    text = _bound_step_matches(model, {"x": (1, 3, 2, 2)}, {"x": (2, 3, 3, 4)})
    assert "{block:" in text


class StandardisedBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = StdConv2d(8, 8, 3, padding=1)
        self.act = nn.ReLU()

    def forward(self, x):
        return x + self.act(self.conv(x))
