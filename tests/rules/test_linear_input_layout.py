"""A linear map of a non-contiguous input of 3 or more dims pulls its gradient back as autograd does for that
input's layout at run time, so float32 gradients equal autograd's bit for bit. ``F.linear`` (Linear.cpp) runs
one addmm on a contiguous input with a bias; on another, ``matmul`` (the input folded to [N, in] by reshape)
then ``add_(bias)``: the bias's gradient sums the gradient over its leading dims as it is laid out (a
transposed gradient summed so differs from the flattened copy's ``sum(0)``), and where the folded input is
column-major (one sample's ``permute(0, 2, 3, 1)`` or ``transpose(1, 2)``) mm's backward computes the input's
gradient transposed. With a frozen weight ``matmul`` folds the input only where that is a view, else runs
``bmm``. All went by the flattened formula before, off by a few units in the last place."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symgrad
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace


class _PermutedTokens(nn.Module):
    """A ConvNeXt block's ``Linear`` on ``conv(x).permute(0, 2, 3, 1)``, nothing between."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.pointwise = nn.Linear(4, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(self.pointwise(self.conv(x).permute(0, 2, 3, 1)).mean(1).mean(1))


class _TokenMixing(nn.Module):
    """MLP-Mixer's token MLP: a linear map of ``x.transpose(1, 2)``, its output transposed back into the next
    linear map: the first one's gradient arrives transposed."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 6)
        self.tokens = nn.Linear(5, 8)
        self.channels = nn.Linear(6, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        mixed = self.tokens(self.embed(x).transpose(1, 2))
        return self.head(self.channels(mixed.transpose(1, 2)).mean(1))


MODELS = {  # (model, traced input, run inputs: another batch and size, and one sample, frozen weights)
    "permuted": (_PermutedTokens, (2, 4, 5, 5), [(3, 4, 6, 7), (1, 4, 6, 7)], ()),
    "transposed": (_TokenMixing, (2, 5, 4), [(3, 5, 4), (1, 5, 4)], ()),
    # a frozen weight: matmul folds the input only where that is a view, else runs bmm (one sample's permute)
    "permuted, frozen": (_PermutedTokens, (2, 4, 5, 5), [(1, 4, 8, 8)], ("pointwise.weight",)),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_linear_map_of_a_strided_input_is_autograds_bit_for_bit(tmp_path, name):
    make, traced, shapes, frozen = MODELS[name]
    torch.manual_seed(0)
    model = make()
    for path in frozen:
        model.get_parameter(path).requires_grad_(False)
    text = trace(model, {"x": traced}, name="net", loss=LossChoice("cross_entropy"), mode="train")
    (tmp_path / "net.py").write_text(
        build_text(text, "net.yaml", documents=False, tests=False).rendered.files["net.py"]
    )
    source = (tmp_path / "net.py").read_text()
    assert f"_linear_{'frozen_' if frozen else ''}input_grad(" in source and "_linear_bias_grad(" in source
    generator = torch.Generator().manual_seed(1)
    for shape in shapes:
        x, target = torch.randn(shape, generator=generator), torch.randint(0, 3, (shape[0],), generator=generator)
        for dtype in (torch.float32, torch.float64):
            reference, ours = (copy.deepcopy(model).to(dtype) for _ in range(2))
            expected = F.cross_entropy(reference(x.to(dtype)), target)
            expected.backward()
            loss = symgrad.bind(tmp_path / "net.py", ours)(x=x.to(dtype), target=target)
            loss.backward()
            for (path, mine), theirs in zip(ours.named_parameters(), reference.parameters()):
                if path in frozen:
                    assert mine.grad is None and theirs.grad is None, path
                    continue
                where = (shape, dtype, path)
                if dtype == torch.float32:
                    assert torch.equal(mine.grad, theirs.grad), where
                else:
                    assert (mine.grad - theirs.grad).abs().max() <= 1e-12 * max(theirs.grad.abs().max(), 1.0), where
