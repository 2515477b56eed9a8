"""More details of the real model libraries (issue 63, ``benchmarks/upstream_check.py``), each written here
without the library, at the smallest sizes that show it, traced for its parameters as blocks, bound, and one
step compared with autograd in float64 at another batch and size."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tests.trace.test_library_details import _bound_step_matches


class TimestepDenoiser(nn.Module):
    """diffusers' ``UNet2DModel`` time path (unet_2d.py:285-292, embeddings.py:56-78): the int64 timestep
    broadcast to the batch by ``* torch.ones(n, dtype=int64)``, embedded in float32 whatever the model's dtype
    (``timesteps[:, None].float() * exp(-log(10000) * arange(half) / half)``, sin and cos, halves swapped),
    converted to the model's dtype (``.to(dtype=self.dtype)``) and added to the image's channels."""

    def __init__(self, channels: int = 3, half: int = 2):
        super().__init__()
        self.half = half
        self.time = nn.Linear(2 * half, channels)
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, sample, timestep):
        timesteps = timestep * torch.ones(sample.shape[0], dtype=timestep.dtype, device=timestep.device)
        exponent = -math.log(10000) * torch.arange(start=0, end=self.half, dtype=torch.float32) / self.half
        emb = timesteps[:, None].float() * torch.exp(exponent)[None, :]
        emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
        emb = torch.cat([emb[:, self.half :], emb[:, : self.half]], dim=-1)
        emb = emb.to(dtype=self.conv.weight.dtype)
        return F.silu(self.conv(sample) + self.time(emb)[:, :, None, None])


def test_a_per_sample_int64_timestep_embedded_in_float32_goes_in():
    """Refused before ('float' converts torch.int64 to torch.float32; 'to' converts float32 to float64): the
    conversions are cast layers, the int64 timestep's broadcast by ones a view of it. The embedding is computed
    in float32 as the model computes it (sin of a timestep near 1000 differs from float64's by ~1e-5, which the
    float64 comparison would see), then converted to the dtype the spec runs in (``like: sample``)."""
    timestep = torch.tensor([999, 3, 517])
    text = _bound_step_matches(
        TimestepDenoiser(),
        {"sample": (2, 3, 4, 4), "timestep": (2,)},
        {"sample": (3, 3, 6, 4)},
        dtypes={"timestep": "int64"},
        data={"timestep": timestep},
    )
    assert "{op: cast, in: timestep, dtype: float32" in text and "like: sample" in text


class Output:
    """diffusers' ``modeling_outputs.Transformer2DModelOutput``: an output class ..."""

    def __init__(self, sample):
        self.sample = sample


class Output(Output):  # noqa: F811 - ... that a subclass of the same name (transformer_2d.py:32) re-exports
    def __init__(self, sample):
        super().__init__(sample)


class WrappedOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)

    def forward(self, x):
        return Output(self.conv(x)).sample


def test_a_base_class_of_the_same_name_is_guarded_as_the_base():
    """The base's ``__init__`` (guarded as ``Output.__init__@Output``) was followed at bind to the subclass's own
    (the first class of that name in the MRO), whose code differs: bind refused the model it had just traced as
    changed ('the code of Output.__init__ ... changed since it was traced'; diffusers' UNet2DModel)."""
    text = _bound_step_matches(WrappedOutput(), {"x": (2, 2, 4, 4)}, {"x": (3, 2, 6, 4)})
    assert "Output.__init__@Output" in text


class PaddedAttention(nn.Module):
    """transformers' masking_utils (5.x): a 2-d int64 attention_mask is dropped where it pads nothing
    (``padding_mask.all()``, masking_utils.py:307 and 369: a branch on the mask's values), else made additive;
    a 4-d float mask is used as given."""

    def __init__(self, dim: int = 4):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x, attention_mask):
        if attention_mask.dim() == 2:
            padding = attention_mask.to(torch.bool)
            attention_mask = None if padding.all() else (~padding)[:, None, None, :].to(x.dtype) * -1e4
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], attn_mask=attention_mask)[:, 0]


def test_a_branch_on_an_int64_padding_mask_is_refused_naming_the_float_mask_that_goes_in():
    """The refusal said only 'decides with the value of a tensor computed from the inputs' (its fix, tensor ops,
    needs editing the library): it now names the int64 input and the 4-d additive mask, which goes in as given and
    trains as autograd does."""
    import pytest

    from symgrad.trace import LossChoice, trace
    from symgrad.trace.errors import TraceError

    with pytest.raises(
        TraceError,
        match=r"test_library_facts_2\.py:\d+: error: 'bool\(tensor\)' decides with the "
        r"values of an int64 input .*attention_mask of shape \[B, 1, 1, T\]",
    ):
        trace(
            PaddedAttention().double(),
            {"x": (2, 3, 4), "attention_mask": (2, 3)},
            wrt="parameters",
            name="step",
            loss=LossChoice("mse_loss", "target"),
            dtypes={"attention_mask": "int64"},
        )
    padded = torch.tensor([[0.0, 0.0, -1e4], [0.0, 0.0, 0.0], [0.0, -1e4, -1e4]], dtype=torch.float64)
    _bound_step_matches(
        PaddedAttention(),
        {"x": (2, 3, 4), "attention_mask": (2, 1, 1, 3)},
        {"x": (3, 3, 4)},
        data={"attention_mask": padded[:, None, None, :]},
    )


class PatchedMap(nn.Module):
    """timm's MobileViT block (mobilevit.py:248-256): the map interpolated up to a multiple of the patch size only
    where ``math.ceil(H / p) * p != H``, unfolded into patches by reshapes, a linear across each patch's entries,
    folded back, and interpolated back where it was."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)
        self.mix = nn.Linear(4, 4)

    def forward(self, x):
        x = self.conv(x)
        B, C, H, W = x.shape
        new_h, new_w = math.ceil(H / 2) * 2, math.ceil(W / 2) * 2
        interpolate = new_h != H or new_w != W
        if interpolate:
            x = F.interpolate(x, size=(new_h, new_w), mode="bilinear", align_corners=False)
        nh, nw = new_h // 2, new_w // 2
        x = x.reshape(B * C * nh, 2, nw, 2).transpose(1, 2).reshape(B, C, nh * nw, 4)
        x = self.mix(x)
        x = x.reshape(B * C * nh, nw, 2, 2).transpose(1, 2).reshape(B, C, nh * 2, nw * 2)
        if interpolate:
            x = F.interpolate(x, size=(H, W), mode="bilinear", align_corners=False)
        return x


def test_a_branch_on_the_input_size_is_checked_where_the_step_runs():
    """Traced at an even height the spec holds no interpolation; called at an odd one it computed the other
    branch's reshapes and failed inside them ('shape [...] is invalid'), or, where those fit, would compute
    something else. The comparison is a size_check layer: equal at other even sizes, and at an odd height the
    step stops naming the model's line and the comparison."""
    import re

    import pytest

    import symgrad
    from symgrad.check import module_from_source
    from symgrad.pipeline import build_text
    from symgrad.trace import LossChoice, trace

    text = _bound_step_matches(PatchedMap(), {"x": (2, 2, 4, 6)}, {"x": (3, 2, 6, 8)})
    assert text.count("op: size_check") == 2 and "holds: false" in text
    model = PatchedMap().double()
    spec = trace(model, {"x": (2, 2, 4, 6)}, wrt="parameters", name="step", loss=LossChoice("mse_loss", "target"))
    step = symgrad.bind(
        module_from_source(build_text(spec, "step.yaml", documents=False).rendered.files["step.py"], "step"), model
    )
    x = torch.randn(3, 2, 5, 8, dtype=torch.float64)
    with pytest.raises(
        Exception,
        match=re.escape("test_library_facts_2.py:") + r"\d+: the traced code branches on "
        r"2\*ceil\(shape\[2\]/2\) != shape\[2\] of conv \(False when traced\)",
    ):
        step(x=x, target=torch.randn_like(x))
