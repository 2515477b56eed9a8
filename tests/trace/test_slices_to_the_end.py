"""``h[:, 1:]`` runs to the end of the dim at any size: its length is read at run time (``{like: h, size:
'shape[1] - 1'}``), not the traced number. Along a dim the second run does not change (a sequence's length,
dim 1 of [N, T, C], which a transformer's features beside it keep from changing) the number was frozen: traced
at T = 6 the module returned 5 tokens at T = 7, silently."""

from __future__ import annotations

import torch
import torch.nn as nn

from symgrad.check import module_from_source
from symgrad.pipeline import build_text
from symgrad.trace import trace
from tests.helpers import parameter_gradients


class DropFirstToken(nn.Module):  # a ViT's patch tokens without its class token, [N, T, C]
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)[:, 1:] * 2


def test_a_slice_to_the_end_follows_the_length_at_run_time():
    torch.manual_seed(0)
    model = DropFirstToken().double()
    text = trace(model, {"x": (2, 6, 4)}, wrt="parameters", name="dropped")
    assert "length: {like: fc, size: 'shape[1] - 1'}" in text, text
    module = module_from_source(build_text(text, "dropped.yaml").rendered.files["dropped.py"], "dropped")
    x = torch.randn(3, 9, 4, dtype=torch.float64)  # another batch and length
    params = {key: value.detach().clone() for key, value in model.state_dict().items()}
    (out,) = module.forward(x, params)
    assert out.shape == model(x).shape and torch.equal(out, model(x))
    for key, got, reference in parameter_gradients(model, module, x):
        assert (got - reference).abs().max() <= 1e-12 * reference.abs().max(), key
