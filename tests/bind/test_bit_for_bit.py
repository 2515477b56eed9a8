"""A bound training step's gradients are autograd's bit for bit, not only close: every fused kernel is
called as autograd calls it (operands, dtypes under autocast, layouts), every formula sums in autograd's
order, so float32 and bfloat16-autocast .grad equal autograd's through the original module (torch.equal),
in the default layout and in channels_last, and so do the running statistics. A ResNet (convolutions, batch
norms, max pool, residual adds, the global pool, linear, cross entropy) and an EfficientNet (SiLU,
depthwise convolutions, squeeze-excite's sigmoid gate), written as blocks (the CLI's default) and kept lean."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import symgrad
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace
from tests.models.classic import ResNet18
from tests.models.zoo_nets import EfficientNet

# ResNet-18 of width 16: PyTorch 2.13's CPU backward of a 1x1 stride-2 convolution with fewer input channels
# can abort in channels_last, autograd's included (symgrad/roles.py FEWEST_CHANNELS_STRIDED_1X1)
MODELS = {"resnet18": lambda: ResNet18(width=16, classes=5), "efficientnet": lambda: EfficientNet(num_classes=5)}


@pytest.mark.parametrize("keep", ["all", "lean"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_bound_step_is_autograds_bit_for_bit_in_float32_and_under_autocast(tmp_path, name, keep):
    torch.manual_seed(0)
    model = MODELS[name]().train()
    text = trace(model, {"x": (2, 3, 16, 16)}, name="net", loss=LossChoice("cross_entropy"), mode="train", blocks=True)
    (tmp_path / "net.py").write_text(
        build_text(text, "net.yaml", documents=False, tests=False, keep=keep).rendered.files["net.py"]
    )
    generator = torch.Generator().manual_seed(1)
    x, target = torch.randn(3, 3, 24, 24, generator=generator), torch.randint(0, 5, (3,), generator=generator)
    for amp in (False, True):
        for layout in (torch.contiguous_format, torch.channels_last):
            reference, ours = (copy.deepcopy(model).to(memory_format=layout) for _ in range(2))
            data = {"x": x.contiguous(memory_format=layout), "target": target}
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                expected = F.cross_entropy(reference(data["x"]), target)
                expected.backward()
                loss = symgrad.bind(tmp_path / "net.py", ours)(**data)
            loss.backward()
            where = f"{name}, keep {keep}, {'AMP' if amp else 'float32'}, {layout}"
            assert torch.equal(loss, expected), where
            for (path, mine), theirs in zip(ours.named_parameters(), reference.parameters()):
                assert mine.grad.dtype == theirs.grad.dtype and torch.equal(mine.grad, theirs.grad), (where, path)
            for (path, mine), theirs in zip(ours.named_buffers(), reference.buffers()):
                assert torch.equal(mine, theirs), (where, path)
