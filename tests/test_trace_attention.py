"""Upstream-style attention models (``tests/zoo_attention.py``) in: traced in train and eval mode, generated,
and compared in float64 with autograd through the original module at another batch size, and another spatial
size where the network allows it (a ViT's learned position embedding fixes its number of patches)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from symgrad.trace import LossChoice, TraceError, trace

from . import zoo_attention as zoo
from .test_trace_models import Case, matches_autograd

CASES = {
    # timm's Attention through F.scaled_dot_product_attention; cls token, position embedding, LayerScale, GELU Mlp
    "vit_fused": Case(zoo.VisionTransformer, {"x": (2, 3, 16, 16)}, {"x": (3, 3, 16, 16)}, ("cross_entropy",)),
    # the same network through the manual branch: (q * scale) @ k.transpose(-2, -1), softmax(dim=-1), attn @ v
    "vit_manual": Case(zoo.VisionTransformer, {"x": (2, 3, 16, 16)}, {"x": (3, 3, 16, 16)}, ("cross_entropy",),
                       {"fused_attn": False}),
}


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("label", list(CASES))
def test_attention_model_matches_autograd_on_the_original_module(label, mode):
    matches_autograd(label, CASES[label], mode)
