"""timm's remaining transformer, hybrid and CNN families (``tests/models/zoo_hybrid.py``, ``tests/models/zoo_hybrid_conv.py``):
each traced in train and eval mode, generated, and compared in float64 with autograd through the original
module at another batch and, where the network allows, another spatial size (≤1e-10); their generated test
files pass. The networks whose
attention has a table for one feature size (CoAtNet's transformer stage, EfficientFormerV2, LeViT, BoTNet) and
DeiT (its position embedding) are checked at another batch. EdgeNeXt's position encoding, made in ``forward``
from the input's size, is refused at its line; the workaround the refusal names traces and matches."""

from __future__ import annotations

import pytest
import torch

from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, TraceError, trace
from tests.helpers import load_yaml
from tests.models import zoo_hybrid as zoo, zoo_hybrid_conv as conv_zoo
from tests.models.compare import Case, assert_generated_test_file_passes, matches_autograd

CLASSIFIER = ("cross_entropy",)
CASES = {
    # MBConv (pre-norm BN, depthwise stride 2, SE, avg-pool shortcut) then an NCHW transformer stage: q, k, v
    # from one 1x1 conv, view(B, heads, 3 d, -1).chunk(3, dim=2), RelPosBias table[index.view(-1)]
    "coatnet": Case(zoo.CoAtNet, {"x": (2, 3, 16, 16)}, {"x": (3, 3, 16, 16)}, CLASSIFIER),
    # MaxViT: channels-last block and grid partitions as view/permute chains, a bias table per partition;
    # any multiple of 4
    "maxvit": Case(zoo.MaxViT, {"x": (2, 3, 8, 8)}, {"x": (3, 3, 16, 8)}, CLASSIFIER),
    # EfficientFormerV2: attention_biases[:, attention_bias_idxs], talking-head 1x1 convs around the softmax,
    # conv + BN q/k/v and a depthwise local value branch
    "efficientformerv2": Case(zoo.EfficientFormerV2, {"x": (2, 3, 8, 8)}, {"x": (3, 3, 8, 8)}, CLASSIFIER),
    # LeViT: BatchNorm1d on linear tokens (bn(x.flatten(0, 1)).reshape_as(x)), split with a list, hardswish,
    # attention biases, the subsampling attention's x.view(B, H, W, C)[:, ::2, ::2] queries, two heads averaged
    "levit": Case(zoo.LeViTDistilled, {"x": (2, 3, 16, 16)}, {"x": (3, 3, 16, 16)}, CLASSIFIER),
    # DeiT: class and distillation tokens expanded and cat-ed, position embedding, fused attention, two heads
    "deit": Case(zoo.DeiTDistilled, {"x": (2, 3, 8, 8)}, {"x": (3, 3, 8, 8)}, CLASSIFIER),
    # PoolFormer: GroupNorm(1, C), AvgPool2d(count_include_pad=False)(x) - x, layer scales unsqueezed twice
    "poolformer": Case(conv_zoo.PoolFormer, {"x": (2, 3, 8, 8)}, {"x": (3, 3, 12, 6)}, CLASSIFIER),
    # ConvMixer: one nn.Sequential (forward(input)), a Residual wrapper, depthwise conv with padding="same"
    "convmixer": Case(conv_zoo.ConvMixer, {"input": (2, 3, 8, 8)}, {"input": (3, 3, 12, 6)}, CLASSIFIER),
    # FastViT/RepViT-style training-time branches (BN skip, kxk and 1x1 conv + BN branches summed), module paths
    # past 64 characters, a 63-character class, a 63-character conv attribute called twice
    "fastvit_repvit": Case(conv_zoo.FastRepNet, {"x": (2, 3, 8, 8)}, {"x": (3, 3, 12, 6)}, CLASSIFIER),
    # TResNet: space-to-depth by view/permute from x.size(), reflect pad + blur filter buffer conv (groups from
    # x.shape[1]), leaky ReLU 1e-3 in place, ceil-mode average-pool shortcut, `out += shortcut`
    "tresnet": Case(conv_zoo.TResNet, {"x": (2, 3, 8, 8)}, {"x": (3, 3, 12, 16)}, CLASSIFIER),
    # ECA: x.mean((2, 3)).view(x.shape[0], 1, -1) -> Conv1d -> sigmoid -> view(x.shape[0], -1, 1, 1), expand_as
    "ecaresnet": Case(conv_zoo.EcaResNet, {"x": (2, 3, 8, 8)}, {"x": (3, 3, 12, 6)}, CLASSIFIER),
    # CBAM in the same bottlenecks: x.amax((2, 3), keepdim=True) and x.amax(dim=1, keepdim=True) descriptors;
    # timm's catavgmax head: cat of F.adaptive_avg_pool2d(x, 1) and F.adaptive_max_pool2d(x, 1)
    "cbamresnet": Case(
        conv_zoo.EcaResNet,
        {"x": (2, 3, 8, 8)},
        {"x": (3, 3, 12, 6)},
        CLASSIFIER,
        {"attn_layer": "cbam", "global_pool": "catavgmax"},
    ),
    # BoTNet: torch.split with a list, reshape(B * heads, d, -1), relative logits by pad, flatten, pad, reshape,
    # slice, expand and permute
    "botnet": Case(conv_zoo.BoTNet, {"x": (2, 3, 16, 16)}, {"x": (3, 3, 16, 16)}, CLASSIFIER),
}


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("label", list(CASES))
def test_hybrid_network_matches_autograd_on_the_original_module(label, mode):
    matches_autograd(label, CASES[label], mode, one_loss_per_mode=True, test_file=label in GENERATED_TEST_CASES)


@pytest.mark.parametrize("label", ["maxvit", "fastvit_repvit", "tresnet"])
def test_hybrid_network_traced_as_blocks_writes_its_repeated_modules_once(label):
    """The CLI's default form: the repeated submodules (MaxViT's two partition attentions, the RepViT-style
    blocks, TResNet's convs) become blocks whose names ``generate`` accepts, and the module builds."""
    case = CASES[label]
    torch.manual_seed(0)
    model = case.model(**case.init).double().train()
    text = trace(model, case.traced, name=label, loss=LossChoice(case.losses[0]), mode="train", blocks=True)
    spec = load_yaml(text)
    assert spec.get("blocks"), text[:2000]
    assert max(len(name) for name in spec["inputs"]) <= 64
    build_text(text, f"{label}.yaml")


class CachedFourierEncoding(conv_zoo.PositionalEncodingFourier):
    """The workaround the refusal names: the Fourier features made once, for one feature size, as a buffer,
    expanded to the batch in ``forward``."""

    def __init__(self, feat_size, **kwargs):
        super().__init__(**kwargs)
        self.register_buffer("features", self.fourier_features((1, *feat_size)), persistent=False)

    def forward(self, shape):
        features = self.features.expand(shape[0], -1, -1, -1)
        return self.token_projection(features.to(self.token_projection.weight.dtype))


class EdgeNeXtCached(conv_zoo.EdgeNeXt):
    def __init__(self, img_size=8, **kwargs):
        super().__init__(**kwargs)
        block = self.stages[0]
        cached = CachedFourierEncoding((img_size // 2, img_size // 2), dim=block.norm.normalized_shape[0])
        cached.token_projection = block.pos_embd.token_projection
        block.pos_embd = cached


def test_edgenext_position_encoding_made_from_the_input_size_is_refused_with_a_workaround_that_works():
    """EdgeNeXt's Fourier encoding divides by the input's height and width in ``forward``: no constant of a spec
    holds it at every size, so the trace refuses it at the line that reads it, once, naming the buffer
    workaround. That workaround gives the original's output at its size and matches autograd at another batch."""
    torch.manual_seed(0)
    with pytest.raises(TraceError) as caught:
        trace(conv_zoo.EdgeNeXt().double(), {"x": (2, 3, 8, 8)}, name="edgenext", loss=LossChoice("cross_entropy"))
    (line,) = str(caught.value).splitlines()
    assert "zoo_hybrid_conv.py:" in line and "'constant'" in line and "pos_embd" in line, line
    assert "register_buffer" in line and "(fix: " in line, line

    torch.manual_seed(0)
    original = conv_zoo.EdgeNeXt().double().eval()
    cached = EdgeNeXtCached().double().eval()
    cached.load_state_dict(original.state_dict())
    x = torch.randn(3, 3, 8, 8, dtype=torch.float64)
    torch.testing.assert_close(cached(x), original(x), rtol=0, atol=1e-12)
    for mode in ("train", "eval"):
        matches_autograd(
            "edgenext_cached",
            Case(EdgeNeXtCached, {"x": (2, 3, 8, 8)}, {"x": (3, 3, 8, 8)}, CLASSIFIER),
            mode,
            test_file=True,
        )  # its generated test file runs below


GENERATED_TEST_CASES = [*CASES, "edgenext_cached"]
"""Every family, EdgeNeXt with its position encoding as a buffer."""


@pytest.mark.slow
@pytest.mark.parametrize("label", GENERATED_TEST_CASES)
def test_hybrid_networks_own_generated_test_file_passes(label, tmp_path):
    case = (
        Case(EdgeNeXtCached, {"x": (2, 3, 8, 8)}, {"x": (3, 3, 8, 8)}, CLASSIFIER)
        if label == "edgenext_cached"
        else CASES[label]
    )
    assert_generated_test_file_passes(label, case, tmp_path)
