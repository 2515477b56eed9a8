"""A submodule ADDED after bind changes what the model computes as surely as one replaced: a shortcut its
code reads with ``hasattr`` (kuangliu's PreActBlock), a ``Sequential`` appended to. ``symgrad.bind`` refuses
it at the call in one line naming the module and the child (before, the bound step ran the traced forward and
trained on other numbers: the hostile reading of 2026-12-07, /tmp/review6 F1/F2). Library-free."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from symgrad import BindError
from tests.bind.test_model_guard import bound, images


class Block(nn.Module):
    """A shortcut made only where the shapes differ, read by ``hasattr`` (as kuangliu's PreActBlock)."""

    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)

    def forward(self, x):
        shortcut = self.shortcut(x) if hasattr(self, "shortcut") else x
        return F.relu(self.conv(x)) + shortcut


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4))
        self.block = Block(4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.block(self.stem(x)), 1).flatten(1))


@pytest.mark.parametrize("form", ("flat", "blocks"))
@pytest.mark.parametrize(
    "change, named",
    [
        (lambda model: model.stem.append(nn.ReLU()), "a submodule 2 was added to stem (Sequential)"),
        (lambda model: setattr(model.block, "shortcut", nn.Conv2d(4, 4, 1).double()), "shortcut was added to block"),
    ],
)
def test_a_submodule_added_after_bind_is_refused_at_the_call(form, change, named, tmp_path):
    torch.manual_seed(0)
    model = Net().double()
    fast = bound(tmp_path, model, form)
    x = images()
    before = fast(x)  # binds and runs as traced
    torch.testing.assert_close(before, model(x), rtol=1e-12, atol=1e-12)
    change(model)
    assert not torch.allclose(model(x), before)  # the model now computes something else
    with pytest.raises(BindError) as error:
        fast(x)
    (line,) = str(error.value).splitlines()
    assert named in line and "after bind" in line and "fix:" in line, line
