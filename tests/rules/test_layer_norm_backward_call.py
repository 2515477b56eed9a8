"""The layer norm's fused backward (``_layer_norm_backward``, symgrad/rules/norm_helpers.py) calls
``native_layer_norm_backward`` as autograd calls it, and nothing else, where autograd's call takes the
operands as they are: every operand in one dtype, and under a CPU's autocast a bfloat16 input with a
float32 weight, bias and statistics (the mix the forward ran; a ConvNeXt block's layer norm after its
bfloat16 depthwise convolution). It cast the input and the gradient to float32 and the input's gradient
back there: three passes over the activation per layer norm that autograd does not make."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from symgrad.rules.norm_helpers import LAYER_NORM_BACKWARD


class _Calls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _helper():
    namespace = {"torch": torch}
    exec(LAYER_NORM_BACKWARD, namespace)  # noqa: S102 - symgrad's own helper
    return namespace


def _autograd_and_helper(x, weight, bias, grad, autocast: bool, namespace):
    """Autograd's gradients of F.layer_norm over the last dim (under a CPU's bfloat16 autocast where
    asked), and the helper's from the statistics the forward kernel returned, with the aten ops it ran."""
    leaves = [value.detach().requires_grad_() for value in (x, weight, bias)]
    shape = [x.shape[-1]]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = F.layer_norm(leaves[0], shape, leaves[1], leaves[2], 1e-6)
        _, mean, rstd = torch.native_layer_norm(x, shape, weight, bias, 1e-6)
    expected = torch.autograd.grad(out, leaves, grad)
    with _Calls() as calls:
        got = namespace["_layer_norm_backward"](grad, x, shape, weight, bias, mean, rstd, eps=1e-6)
    return expected, got, calls.names


def test_one_dtype_is_one_kernel_call_equal_to_autograd():
    generator = torch.Generator().manual_seed(0)
    # channels last of a [N, C, H, W] activation, permuted to [N, H, W, C] as a ConvNeXt block does
    x = torch.randn(2, 5, 3, 4, generator=generator, dtype=torch.float64).permute(0, 2, 3, 1)
    weight, bias = (torch.randn(5, generator=generator, dtype=torch.float64) for _ in range(2))
    grad = torch.randn(2, 3, 4, 5, generator=generator, dtype=torch.float64)
    expected, got, calls = _autograd_and_helper(x, weight, bias, grad, False, _helper())
    assert calls == ["native_layer_norm_backward"]
    for ours, theirs in zip(got, expected):
        assert ours.dtype == theirs.dtype and (ours - theirs).abs().max() <= 1e-12


def test_a_bfloat16_input_with_a_float32_weight_on_a_cpu_is_autograds_call_bit_for_bit():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 4, 6, generator=generator).bfloat16()
    weight, bias = (torch.randn(6, generator=generator) for _ in range(2))
    grad = torch.randn(2, 3, 4, 6, generator=generator).bfloat16()
    namespace = _helper()
    expected, got, calls = _autograd_and_helper(x, weight, bias, grad, True, namespace)
    assert [value.dtype for value in expected] == [torch.bfloat16, torch.float32, torch.float32]
    assert calls == ["native_layer_norm_backward"], calls
    assert all(torch.equal(ours, theirs) for ours, theirs in zip(got, expected))
    # where the kernels refuse the mix (CUDA's), every operand in float32, each gradient in its dtype
    namespace["LAYER_NORM_MIXED_DEVICES"] = ()
    _, promoted, calls = _autograd_and_helper(x, weight, bias, grad, True, namespace)
    assert calls.count("native_layer_norm_backward") == 1 and "_to_copy" in calls
    assert [value.dtype for value in promoted] == [torch.bfloat16, torch.float32, torch.float32]
    for ours, theirs in zip(promoted, expected):
        assert (ours.float() - theirs.float()).norm() <= 1e-2 * theirs.float().norm()
