"""The quotient's and the square root's fused pullbacks (symgrad/rules/elementwise.py) are autograd's,
bit for bit in every dtype: derivatives.yaml's ``grad / other``, ``-grad * ((self / other) / other)`` and
``grad / (2 * result)``. sympy's local derivatives, ``grad * (1 / other)``, ``grad * (-self / other**2)``
and ``grad * (0.5 * (1 / result))``, rounded otherwise: a by-hand layer norm's ``(x - u) / sqrt(s + eps)``
(ConvNeXt's channels_first norm) gave gradients one float32 ulp from autograd's."""

from __future__ import annotations

import pytest
import torch

from symgrad.algebra import PRIMITIVES, Params


def _ours(name: str, **operands: torch.Tensor) -> torch.Tensor:
    code = PRIMITIVES[name].code(list(operands), Params.of(), str)
    return eval(code, {"torch": torch, **operands})  # noqa: S307 - symgrad's own code


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_the_fused_pullbacks_are_autograds_bit_for_bit(dtype):
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(4, 8, 3, 3, generator=generator).to(dtype).requires_grad_()
    b = (torch.rand(4, 1, 3, 3, generator=generator) + 0.1).to(dtype).requires_grad_()
    grad = torch.randn(4, 8, 3, 3, generator=generator).to(dtype)
    grad_a, grad_b = torch.autograd.grad(a / b, (a, b), grad)
    (grad_s,) = torch.autograd.grad(torch.sqrt(b), b, grad[:, :1])
    a, b, root = a.detach(), b.detach(), torch.sqrt(b.detach())
    assert torch.equal(_ours("div_backward_input", grad=grad, b=b), grad_a)
    assert torch.equal(_ours("div_backward_other", grad=grad, a=a, b=b).sum_to_size(b.shape), grad_b)
    assert torch.equal(_ours("sqrt_backward", grad=grad[:, :1], root=root), grad_s)
    if dtype == torch.float32:  # what the module computed before: sympy's forms round otherwise
        assert not torch.equal(grad * (1 / b), grad_a)
        assert not torch.equal((grad * (-a / b**2)).sum_to_size(b.shape), grad_b)
        assert not torch.equal(grad[:, :1] * (0.5 * (1 / root)), grad_s)
