"""Sigmoid's fused pullback is autograd's ``sigmoid_backward(grad, out)`` kernel (symgrad/rules/activation.py),
bit for bit in every dtype: the readable formula ``grad * (out * (1 - out))`` rounds its two products apart,
which in bfloat16 (a squeeze-excite gate under autocast) gave other gradients than autograd's."""

from __future__ import annotations

import pytest
import torch

from symgrad.algebra import PRIMITIVES, Params


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_the_fused_pullback_is_autograds_kernel_bit_for_bit(dtype):
    generator = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(8, 72, 1, 1, generator=generator)).to(dtype).requires_grad_()
    out = torch.sigmoid(x)
    grad = torch.randn(out.shape, generator=generator).to(dtype)
    (expected,) = torch.autograd.grad(out, x, grad)
    code = PRIMITIVES["sigmoid_backward"].code(["grad", "out"], Params.of(), str)
    ours = eval(code, {"torch": torch, "grad": grad, "out": out.detach()})  # noqa: S307 - symgrad's own code
    assert torch.equal(ours, expected)
    if dtype == torch.bfloat16:  # what the module computed before: two roundings
        assert not torch.equal(grad * (out.detach() * (1 - out.detach())), expected)
