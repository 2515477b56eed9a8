"""A model with train-mode dropout written as blocks (``symgrad trace``'s default form): the gradients its
``loss_with_explicit_backward`` gives must be those of the masks its forward drew, also where the backward
re-runs the forward (``recompute=True``, ``create_graph=True``, a second backward). The module's
loss Function keeps torch's random state in its forward and restores it there (the block form's once did
not, and its re-run forward drew new masks: the gradients of another network). Found by
smp DeepLabV3+'s generated test file (``tests/models/test_zoo_segmentation.py``): its gradcheck reports
"Backward is not reentrant" and its gradgradcheck ran past 15 minutes."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class DroppingNet(nn.Module):
    """Two instances of one block (so the trace writes a block), then dropout, as a classifier head has it."""

    def __init__(self, width=6):
        super().__init__()
        self.stem = nn.Linear(8, width)
        self.blocks = nn.Sequential(Block(width), Block(width))
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        return self.head(self.drop(self.blocks(self.stem(x))))


def _generated(blocks: bool):
    torch.manual_seed(0)
    model = DroppingNet().double().train()
    text = trace(model, {"x": (4, 8)}, name="dropping", loss=LossChoice("mse_loss"), mode="train", blocks=blocks)
    assert ("blocks:" in text) == blocks, text
    module = type(sys)("dropping")
    source = build_text(text, "dropping.yaml").rendered.files["dropping.py"]
    exec(compile(source, "dropping.py", "exec"), module.__dict__)
    return model, module


def _through_module(module, model, x, target, blocks, recompute, create_graph):
    """The gradients of the generated module's loss Function, its forward drawn from torch's seed 5."""
    parameters = dict(model.named_parameters())
    torch.manual_seed(5)
    loss = module.loss_with_explicit_backward(x, target, parameters, recompute=recompute)  # one convention
    torch.manual_seed(123)  # the backward runs from another random state, as a training step's does
    return torch.autograd.grad(loss, [x, *parameters.values()], create_graph=create_graph)


@pytest.mark.parametrize("recompute, create_graph", [(True, False), (False, True)], ids=["recompute", "create_graph"])
@pytest.mark.parametrize("blocks", [pytest.param(False, id="flat"), pytest.param(True, id="blocks")])
def test_a_backward_that_reruns_the_forward_draws_the_forwards_dropout_masks(blocks, recompute, create_graph):
    model, module = _generated(blocks)
    x = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    target = torch.randn(5, 3, dtype=torch.float64)
    torch.manual_seed(5)
    expected = torch.autograd.grad(F.mse_loss(model(x), target), [x, *model.parameters()])
    actual = _through_module(module, model, x, target, blocks, recompute, create_graph)
    errors = [float((a - e).detach().abs().max()) for a, e in zip(actual, expected)]
    assert max(errors) <= 1e-12, errors
