"""LLaMA's and T5's RMSNorm, ``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight`` (transformers'
modeling_llama.py LlamaRMSNorm): ``rsqrt`` had no rule, so such a model was refused at the trace. Its pullback
is derivatives.yaml's, ``-0.5 * grad * result.pow(3)``: three SGD steps of a small pre-norm transformer-style
model equal autograd through the original module, bit for bit in float32 and within 1e-12 in float64, at
another batch and length than traced.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace
from tests.models.compare import bound_steps_match_autograd


class RMSNorm(nn.Module):
    def __init__(self, size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size) + 0.1 * torch.randn(size))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


class PreNorm(nn.Module):
    """Token embedding, two pre-norm SiLU-gated MLP blocks, a final norm and a head (the shape of LLaMA's MLP)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.norms = nn.ModuleList([RMSNorm(8) for _ in range(2)])
        self.gates = nn.ModuleList([nn.Linear(8, 16, bias=False) for _ in range(2)])
        self.ups = nn.ModuleList([nn.Linear(8, 16, bias=False) for _ in range(2)])
        self.downs = nn.ModuleList([nn.Linear(16, 8, bias=False) for _ in range(2)])
        self.norm = RMSNorm(8)
        self.head = nn.Linear(8, 11, bias=False)

    def forward(self, ids):
        h = self.embed(ids)
        for norm, gate, up, down in zip(self.norms, self.gates, self.ups, self.downs):
            x = norm(h)
            h = h + down(F.silu(gate(x)) * up(x))
        return self.head(self.norm(h)).mean(1)


def _generated(tmp_path, model):
    text = trace(
        model,
        {"ids": (2, 5)},
        name="pre_norm",
        wrt="parameters",
        dtypes={"ids": "int64"},
        loss=LossChoice("cross_entropy"),
    )
    source = build_text(text, "pre_norm.yaml", documents=False, tests=False).rendered.files["pre_norm.py"]
    assert "torch.rsqrt(" in source, source
    (tmp_path / "pre_norm.py").write_text(source)
    return tmp_path / "pre_norm.py"


def _batch(generator):
    ids = torch.randint(0, 11, (3, 7), generator=generator)  # another batch and length than traced
    return {"ids": ids}, torch.randint(0, 11, (3,), generator=generator)


def test_rms_norm_trains_equal_to_autograd_in_float64(tmp_path):
    torch.manual_seed(0)
    model = PreNorm().double()
    bound_steps_match_autograd(model, _generated(tmp_path, model), _batch, F.cross_entropy)


def test_rms_norm_trains_bit_for_bit_in_float32(tmp_path):
    torch.manual_seed(0)
    model = PreNorm()
    bound_steps_match_autograd(model, _generated(tmp_path, model), _batch, F.cross_entropy, bitwise=True)
