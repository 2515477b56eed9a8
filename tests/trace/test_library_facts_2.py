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
        emb = torch.cat([emb[:, self.half:], emb[:, :self.half]], dim=-1)
        emb = emb.to(dtype=self.conv.weight.dtype)
        return F.silu(self.conv(sample) + self.time(emb)[:, :, None, None])


def test_a_per_sample_int64_timestep_embedded_in_float32_goes_in():
    """Refused before ('float' converts torch.int64 to torch.float32; 'to' converts float32 to float64): the
    conversions are cast layers, the int64 timestep's broadcast by ones a view of it. The embedding is computed
    in float32 as the model computes it (sin of a timestep near 1000 differs from float64's by ~1e-5, which the
    float64 comparison would see), then converted to the dtype the spec runs in (``like: sample``)."""
    timestep = torch.tensor([999, 3, 517])
    text = _bound_step_matches(TimestepDenoiser(), {"sample": (2, 3, 4, 4), "timestep": (2,)},
                               {"sample": (3, 3, 6, 4)}, dtypes={"timestep": "int64"}, data={"timestep": timestep})
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
