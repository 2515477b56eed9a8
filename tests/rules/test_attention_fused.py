"""scaled_dot_product_attention's fused derivation (symgrad/rules/attention_fused.py): the CPU flash kernels
called where, and as, autograd calls them.

- ``_flash_attention_taken`` is PyTorch's own dispatch decision (``torch._fused_sdp_choice`` picks flash, 1)
  on the cases that decide it: dtype, rank, strides, sizes, causal, flash disabled, autocast.
- Where it is taken, the generated helpers' gradients are autograd's bit for bit (float32, q, k and v views of
  one permuted qkv as a ViT makes them, the gradient a transposed view); where a graph is recorded, the formula
  runs and is differentiable again (autograd's own kernel is not).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from symgrad.rules.attention_fused import ATTENTION, ATTENTION_BACKWARD


def _helpers() -> dict:
    namespace = {"torch": torch, "F": F}
    exec(ATTENTION, namespace)  # noqa: S102 - the generated module's own text
    exec(ATTENTION_BACKWARD, namespace)  # noqa: S102
    return namespace


HELPERS = _helpers()


def _qkv(batch=2, heads=2, length=5, width=4, dtype=torch.float32, seed=0):
    """q, k, v as a ViT cuts them: views of one [3, B, H, L, E] permutation of a linear's output."""
    generator = torch.Generator().manual_seed(seed)
    qkv = torch.randn(batch, length, 3, heads, width, generator=generator, dtype=dtype).permute(2, 0, 3, 1, 4)
    return qkv.unbind(0)


def _cases():
    q, k, v = _qkv()
    yield "float32", (q, k, v)
    yield "float64", _qkv(dtype=torch.float64)
    yield "bfloat16", _qkv(dtype=torch.bfloat16)
    yield "dtypes differ", (q, k.double(), v)
    yield "3-d", (q[0], k[0], v[0])
    yield "value wider", (q, k, torch.randn(2, 2, 5, 6))
    yield "fewer keys", (q, k[:, :, :3], v[:, :, :3])
    yield "last dim transposed", (q, k.transpose(-1, -2).contiguous().transpose(-1, -2), v)
    yield "last dim not unit stride", (q, torch.randn(2, 2, 5, 8)[..., ::2], v)
    yield "one head of another batch", (q, k[:1], v[:1])


@pytest.mark.parametrize("case", [name for name, _ in _cases()])
def test_the_flash_preconditions_are_pytorchs_dispatch(case):
    query, key, value = dict(_cases())[case]
    try:
        expected = torch._fused_sdp_choice(query, key, value) == SDPBackend.FLASH_ATTENTION.value
    except RuntimeError:  # shapes F.scaled_dot_product_attention refuses: no kernel is taken
        expected = False
    assert HELPERS["_flash_attention_taken"](query, key, value) == expected
    for causal in (False, True):
        if expected:
            assert torch._fused_sdp_choice(query, key, value, None, 0.0, causal) == SDPBackend.FLASH_ATTENTION.value


def test_disabled_flash_and_autocast_take_the_math_path():
    query, key, value = _qkv()
    with sdpa_kernel([SDPBackend.MATH]):
        assert torch._fused_sdp_choice(query, key, value) == SDPBackend.MATH.value
        assert not HELPERS["_flash_attention_taken"](query, key, value)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not HELPERS["_flash_attention_taken"](query, key, value)
        out, logsumexp = HELPERS["_attention"](query, key, value)
    assert logsumexp is None and out.dtype == torch.bfloat16


@pytest.mark.parametrize("causal, scale", [(False, None), (True, 0.3)])
def test_the_fused_gradients_are_autograds_bit_for_bit(causal, scale):
    leaves = [part.detach().clone().requires_grad_() for part in _qkv(batch=3, length=6, width=8, seed=1)]
    taken = [part.permute(1, 0, 2, 3) for part in leaves]  # [H, B, L, E]: a last dim of stride 1, others not
    out = F.scaled_dot_product_attention(*taken, is_causal=causal, scale=scale)
    assert "FlashAttentionForCpu" in type(out.grad_fn).__name__
    grad = torch.randn(out.shape[0], out.shape[2], out.shape[1], out.shape[3]).transpose(1, 2)
    expected = torch.autograd.grad(out, leaves, grad)
    with torch.no_grad():
        inputs = [part.detach().permute(1, 0, 2, 3) for part in leaves]
        mine, logsumexp = HELPERS["_attention"](*inputs, is_causal=causal, scale=scale)
        assert logsumexp is not None and torch.equal(mine, out.detach())
        grads = HELPERS["_attention_backward"](grad, *inputs, mine, logsumexp, is_causal=causal, scale=scale)
    for got, want in zip(grads, expected):
        assert torch.equal(got.permute(1, 0, 2, 3), want)


def test_a_recorded_gradient_is_the_formula_and_twice_differentiable():
    query, key, value = (part.double().requires_grad_() for part in _qkv(batch=1, heads=2, length=3, width=2, seed=2))
    out, logsumexp = HELPERS["_attention"](query, key, value, is_causal=True)
    assert logsumexp is not None
    grad = torch.randn(out.shape, dtype=torch.float64, requires_grad=True)
    got = HELPERS["_attention_backward"](grad, query, key, value, out, logsumexp, is_causal=True)
    with sdpa_kernel([SDPBackend.MATH]):  # autograd's own double backward fails through the flash kernel
        reference = F.scaled_dot_product_attention(query, key, value, is_causal=True)
    expected = torch.autograd.grad(reference, (query, key, value), grad, create_graph=True)
    for mine, theirs in zip(got, expected):
        torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)
    weights = [torch.randn_like(part) for part in got]
    second = [
        torch.autograd.grad(sum((g * w).sum() for g, w in zip(grads, weights)), (grad, query, key, value))
        for grads in (got, expected)
    ]
    for mine, theirs in zip(*second):
        torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)


def test_under_a_torch_func_transform_the_formula_runs():
    query, key, value = (part.double() for part in _qkv(batch=1, heads=2, length=3, width=2, seed=3))
    grad = torch.randn(1, 2, 3, 2, dtype=torch.float64)

    def summed_query_gradient(q):
        out, logsumexp = HELPERS["_attention"](q, key, value)
        return HELPERS["_attention_backward"](grad, q, key, value, out, logsumexp)[0].sum()

    mine = torch.func.grad(summed_query_gradient)(query)
    leaf = query.clone().requires_grad_()
    with sdpa_kernel([SDPBackend.MATH]):
        reference = F.scaled_dot_product_attention(leaf, key, value)
    (first,) = torch.autograd.grad(reference, leaf, grad, create_graph=True)
    (expected,) = torch.autograd.grad(first.sum(), leaf)
    torch.testing.assert_close(mine, expected, rtol=1e-12, atol=1e-12)
