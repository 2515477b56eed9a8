"""``torch.gather`` with a constant index (``symgrad/rules/gather.py``): a buffer of the output's shape is the
``gather`` layer; a 1-d buffer viewed along the dim and expanded over the others (a fixed token pick) is
``x[:, idx]``, shape-generic; an index computed from the data (``topk``, ``argmax``) is refused at its line."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from symgrad.trace import LossChoice, TraceError, trace
from tests.models.compare import Case, matches_autograd


class TokenPick(nn.Module):
    """Patch tokens, an MLP block, then a fixed subset of the tokens kept by ``gather`` (the token indices a
    buffer), pooled to a linear head: every tensor read from the input's sizes, as timm's code reads them."""

    def __init__(self, dim=8, keep=(0, 3, 5, 2), num_classes=4):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, kernel_size=2, stride=2)
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * dim, dim)
        self.head = nn.Linear(dim, num_classes)
        self.register_buffer("keep", torch.tensor(keep), persistent=False)

    def forward(self, x):
        x = self.proj(x).flatten(2).transpose(1, 2)  # B, N, C
        x = x + self.fc2(self.act(self.fc1(self.norm(x))))
        B, N, C = x.shape
        kept = torch.gather(x, dim=1, index=self.keep.view(1, -1, 1).expand(B, -1, C))
        return self.head(kept.mean(dim=1))


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_fixed_token_pick_by_gather_matches_autograd_at_another_batch_and_size(mode):
    case = Case(TokenPick, {"x": (2, 3, 8, 8)}, {"x": (3, 3, 6, 10)}, ("cross_entropy",))
    matches_autograd("token_pick", case, mode)
    text = trace(TokenPick().double(), case.traced, name="t", loss=LossChoice("cross_entropy"))
    assert "{op: index, in: " in text and "dim: 1" in text and "op: gather" not in text, text


class PickedByTheData(nn.Module):
    def forward(self, x):
        scores = x.mean(-1)
        picked = scores.topk(2, dim=1).indices  # DATA
        return x.gather(1, picked.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


class PerSampleIndex(nn.Module):
    def forward(self, x, ids_keep):
        return torch.gather(x, 1, ids_keep.unsqueeze(-1).expand(-1, -1, x.shape[-1]))  # PER_SAMPLE


def _line(marker: str) -> int:
    return next(n for n, text in enumerate(open(__file__).read().splitlines(), 1) if text.endswith(marker))


def test_an_index_computed_from_the_data_is_refused_at_its_line():
    with pytest.raises(TraceError) as error:
        trace(PickedByTheData(), {"x": (2, 5, 4)}, name="t", loss=LossChoice("half_sq_error"))
    (line,) = str(error.value).splitlines()
    assert line.startswith(f"{__file__}:{_line('# DATA')}: error: 'topk'"), line


def test_a_per_sample_index_expanded_in_forward_is_refused_with_the_workaround():
    with pytest.raises(TraceError) as error:
        trace(
            PerSampleIndex(),
            {"x": (2, 5, 4), "ids_keep": (2, 3)},
            name="t",
            loss=LossChoice("half_sq_error"),
            dtypes={"ids_keep": "int64"},
        )
    (line,) = str(error.value).splitlines()
    assert line.startswith(f"{__file__}:{_line('# PER_SAMPLE')}: error: 'gather' reads its index through a"), line
    assert "of the output's shape" in line
