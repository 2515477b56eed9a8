"""Upstream-style attention models (``tests/models/zoo_attention.py``) in: traced in train and eval mode, generated,
and compared in float64 with autograd through the original module at another batch size, and another spatial
size where the network allows it (a ViT's learned position embedding fixes its number of patches)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import yaml

from symgrad.trace import LossChoice, TraceError, trace
from tests.helpers import load_yaml
from tests.models import zoo_attention as zoo
from tests.models.compare import Case, assert_generated_test_file_passes, matches_autograd

CASES = {
    # timm's Attention through F.scaled_dot_product_attention; cls token, position embedding, LayerScale, GELU Mlp
    "vit_fused": Case(zoo.VisionTransformer, {"x": (2, 3, 16, 16)}, {"x": (3, 3, 16, 16)}, ("cross_entropy",)),
    # the same network through the manual branch: (q * scale) @ k.transpose(-2, -1), softmax(dim=-1), attn @ v
    "vit_manual": Case(
        zoo.VisionTransformer, {"x": (2, 3, 16, 16)}, {"x": (3, 3, 16, 16)}, ("cross_entropy",), {"fused_attn": False}
    ),
    # MobileViT: B, C, H, W = x.shape; math.ceil(H / patch_h); reshape(B * C * n_h, p_h, n_w, p_w) unfolding into
    # [B * P, N, C] tokens, transformer blocks over them, folded back: every size read at run time
    "mobilevit": Case(zoo.MobileVitNet, {"x": (2, 3, 8, 8)}, {"x": (3, 3, 6, 10)}, ("mse_loss",)),
    "mobilevit_manual": Case(
        zoo.MobileVitNet, {"x": (2, 3, 8, 8)}, {"x": (3, 3, 10, 4)}, ("mse_loss",), {"fused_attn": False}
    ),
    # Restormer's MDTA and LayerNorm through einops rearrange, an einops reduce / repeat gate, an einops
    # space-to-depth 'b c (h p1) (w p2) -> b (c p1 p2) h w'
    "einops_restormer": Case(zoo.EinopsRestormerBlock, {"x": (2, 8, 8, 8)}, {"x": (3, 8, 6, 10)}, ("mse_loss",)),
    # UNETR's encoder in MONAI's layout: einops Rearrange layers for the 3D patches and the heads, einsum
    # attention scores and output, tokens viewed back to a 3D map for a conv3d; another batch (position embedding)
    "unetr_encoder": Case(zoo.UNETREncoder, {"x_in": (2, 1, 8, 8, 8)}, {"x_in": (3, 1, 8, 8, 8)}, ("mse_loss",)),
}


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("label", list(CASES))
def test_attention_model_matches_autograd_on_the_original_module(label, mode):
    matches_autograd(label, CASES[label], mode, one_loss_per_mode=True, test_file=label in GENERATED_TEST_CASES)


def _refusal(function, shapes, mode=None, where="test_zoo_attention.py:") -> str:
    with pytest.raises(TraceError) as caught:
        trace(function, shapes, name="refused", loss=LossChoice("mse_loss"), mode=mode)
    (line,) = str(caught.value).splitlines()
    assert where in line and "(fix: " in line, line
    return line


class Dropping(torch.nn.Module):
    """timm's Attention with attn_drop > 0: dropout inside attention in training mode, none in eval mode."""

    def __init__(self):
        super().__init__()
        self.attn = zoo.Attention(8, num_heads=2, attn_drop=0.1)

    def forward(self, x):
        return self.attn(x)


def test_attention_dropout_is_traced_as_the_math_kernel_computes_it_in_training_mode_and_absent_in_eval_mode():
    """Its probabilities, dropout drawn as F.dropout draws it, and the product with v (the CPU math kernel's
    steps; the bound model's draws are the model's: tests/trace/test_text_transformers.py)."""
    text = trace(Dropping().double(), {"x": (2, 5, 8)}, name="dropping", loss=LossChoice("mse_loss"), mode="train")
    layers = [layer for layer in load_yaml(text)["layers"]]
    ops = [layer["op"] for layer in layers]
    assert "scaled_dot_product_attention" not in ops and ops.count("dropout") == 1, ops
    start = ops.index("attention_probabilities")
    assert ops[start : start + 3] == ["attention_probabilities", "dropout", "matmul"] and layers[start + 1]["p"] == 0.1
    evaluated = trace(Dropping().double(), {"x": (2, 5, 8)}, name="evaluated", loss=LossChoice("mse_loss"), mode="eval")
    assert "op: scaled_dot_product_attention" in evaluated and "op: dropout" not in evaluated


def test_a_boolean_mask_is_refused_with_the_additive_form():
    mask = torch.ones(5, 5, dtype=torch.bool).tril()

    def masked(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    line = _refusal(masked, {"q": (2, 2, 5, 4), "k": (2, 2, 5, 4), "v": (2, 2, 5, 4)})
    assert "boolean attn_mask" in line and "float('-inf')" in line, line


def test_an_einsum_diagonal_is_refused_at_its_line():
    def diagonal(x, y):
        return torch.einsum("bii,bij->bj", x, y)

    with pytest.raises(Exception) as caught:
        trace(diagonal, {"x": (2, 3, 3), "y": (2, 3, 4)}, name="diagonal", loss=LossChoice("mse_loss"))
    (line,) = str(caught.value).splitlines()
    # the fix a traced model can follow (torch.diagonal is no op symgrad traces)
    assert "diagonal" in line and "identity registered as a buffer" in line and "(fix: " in line, line


class TorchMultiheadAttention(torch.nn.Module):
    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x):
        out, _ = self.attn(x, x, x, need_weights=False)
        return out


def test_multihead_attention_is_refused_with_a_workaround_that_works():
    """nn.MultiheadAttention is refused, naming timm's form; that form with the module's own weights gives the
    same output, and traces and matches autograd."""
    torch.manual_seed(0)
    original = TorchMultiheadAttention().double().eval()
    line = _refusal(original, {"x": (2, 5, 8)})
    assert "multi_head_attention_forward" in line and "scaled_dot_product_attention" in line, line

    rewritten = zoo.Attention(8, num_heads=2, qkv_bias=True).double().eval()
    with torch.no_grad():
        rewritten.qkv.weight.copy_(original.attn.in_proj_weight)
        rewritten.qkv.bias.copy_(original.attn.in_proj_bias)
        rewritten.proj.weight.copy_(original.attn.out_proj.weight)
        rewritten.proj.bias.copy_(original.attn.out_proj.bias)
    x = torch.randn(3, 7, 8, dtype=torch.float64)
    torch.testing.assert_close(rewritten(x), original(x), rtol=0, atol=1e-12)

    class Rewritten(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = rewritten

        def forward(self, x):
            return self.attn(x)

    matches_autograd("multihead_rewritten", Case(Rewritten, {"x": (2, 5, 8)}, {"x": (3, 7, 8)}, ("mse_loss",)), "eval")


GENERATED_TEST_CASES = ["vit_fused", "mobilevit", "einops_restormer"]


@pytest.mark.slow
@pytest.mark.parametrize("label", GENERATED_TEST_CASES)
def test_attention_models_own_generated_test_file_passes(label, tmp_path):
    """The test file written beside each traced attention model's module runs and passes, at the shapes its
    solver picks for the whole graph (the ViT's token count fixed by its position embedding)."""
    assert_generated_test_file_passes(label, CASES[label], tmp_path)


@pytest.mark.parametrize(
    "layer, problem",
    [
        (
            {"op": "scaled_dot_product_attention", "in": ["q", "k", "v"], "attn_mask": "m", "is_causal": True},
            "together with is_causal",
        ),
        ({"op": "scaled_dot_product_attention", "in": ["q", "k", "v"], "dropout_p": 0.1}, "dropout inside attention"),
        ({"op": "einsum", "in": ["q", "k"], "equation": "bhii,bhjd->bhj"}, "a diagonal"),
        ({"op": "einsum", "in": ["q", "k"], "equation": "bhid,bhjc->bhij"}, "alone"),
    ],
)
def test_attention_layers_outside_the_rules_are_refused_in_one_line(layer, problem):
    from symgrad.errors import SpecError
    from symgrad.pipeline import build_text as build

    text = yaml.safe_dump(
        {
            "name": "refused",
            "inputs": {name: {"shape": [2, 2, 4, 4]} for name in ("q", "k", "v", "m", "y")},
            "layers": [{**layer, "out": "out"}],
            "loss": {"op": "half_sq_error", "target": "y"},
            "wrt": ["q"],
        },
        sort_keys=False,
    )
    with pytest.raises(SpecError) as caught:
        build(text, "refused.yaml")
    (line,) = str(caught.value).splitlines()
    assert "refused.yaml:" in line and problem in line and "fix" in line, line
