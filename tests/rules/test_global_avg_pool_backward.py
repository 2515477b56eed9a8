"""Global average pooling's pullback (``global_avg_pool_backward``, symgrad/rules/resample.py) is what
autograd computes, bit for bit: PyTorch runs ``adaptive_avg_poolNd(x, 1)`` as ``x.mean(spatial axes,
keepdim=True)`` and autograd's mean backward divides the spread gradient by the number of positions. The
pooling kernel (``_adaptive_avg_pool2d_backward``, which the generated code called before) rounds
otherwise where that number is no power of 2 (7 x 5 here), and was 3-25x slower on a CPU in channels_last."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from symgrad.algebra import PRIMITIVES, Params
from symgrad.pipeline import build_text

SIZES = (7, 5, 3)  # 7, 35, 105 positions
LAST = {2: torch.channels_last, 3: torch.channels_last_3d}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_the_pullback_is_autograds_mean_backward_bit_for_bit(dims, layout, dtype):
    if layout == "channels_last" and dims == 1:
        pytest.skip("a 1-d input has no channels_last layout")
    generator = torch.Generator().manual_seed(dims)
    x = torch.randn((2, 3, *SIZES[:dims]), generator=generator).to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=LAST[dims])
    x.requires_grad_()
    pooled = getattr(F, f"adaptive_avg_pool{dims}d")(x, 1)
    grad = torch.randn(pooled.shape, generator=generator).to(dtype)
    (expected,) = torch.autograd.grad(pooled, x, grad)
    code = PRIMITIVES["global_avg_pool_backward"].code(["grad", "x_layout"], Params.of(dims=dims), str)
    # the input as the saving forward keeps it: its layout alone, a meta tensor
    ours = eval(code, {"grad": grad, "x_layout": x.detach().to("meta")})  # noqa: S307 - symgrad's own code
    assert torch.equal(ours, expected)
    assert ours.dtype == expected.dtype and ours.stride() == expected.stride()


SQUEEZE_EXCITE = """name: squeeze_excite
inputs:
  x: {shape: [2, 4, 7, 5]}
  w: {shape: [4, 4, 1, 1]}
  t: {shape: [2, 4, 7, 5]}
layers:
  - {op: adaptive_avg_pool2d, in: x, output_size: 1, out: pooled}
  - {op: conv2d, in: pooled, weight: w, out: squeezed}
  - {op: sigmoid, in: squeezed, out: gate}
  - {op: mul, in: [x, gate], out: scaled}
loss: {op: mse_loss, in: scaled, target: t}
wrt: [x, w]
"""


def test_a_squeeze_excite_gate_trains_as_autograd_without_the_pooling_kernel():
    """The pooled branch of a squeeze-excite gate: the module calls no pooling kernel and its float64
    gradients are autograd's through the same ops (a random cotangent)."""
    built = build_text(SQUEEZE_EXCITE, "squeeze_excite.yaml", documents=False, tests=False)
    source = built.rendered.files["squeeze_excite.py"]
    assert "_adaptive_avg_pool2d_backward" not in source
    names: dict = {}
    exec(compile(source, "squeeze_excite.py", "exec"), names)  # noqa: S102 - symgrad's own module
    generator = torch.Generator().manual_seed(0)
    x, t = (torch.randn(3, 4, 9, 6, generator=generator, dtype=torch.float64) for _ in range(2))
    w = torch.randn(4, 4, 1, 1, generator=generator, dtype=torch.float64)
    grad_loss = torch.rand((), generator=generator, dtype=torch.float64)
    got = names["gradients"](x, w, t, grad_loss=grad_loss)
    x.requires_grad_(), w.requires_grad_()
    loss = F.mse_loss(x * torch.sigmoid(F.conv2d(F.adaptive_avg_pool2d(x, 1), w)), t)
    expected = torch.autograd.grad(loss, [x, w], grad_loss)
    for ours, theirs in zip((got.x, got.w), expected):
        assert (ours - theirs).abs().max() <= 1e-12 * theirs.abs().max()
