"""``scaled_dot_product_attention``'s fused derivation: autograd's own CPU kernels, called as autograd calls them.

On a CPU, ``F.scaled_dot_product_attention`` runs ``_scaled_dot_product_flash_attention_for_cpu`` wherever
PyTorch's dispatch (``torch._fused_sdp_choice``) picks the flash kernel, and autograd saves the kernel's
``out, logsumexp`` for ``_scaled_dot_product_flash_attention_for_cpu_backward`` (derivatives.yaml), which
returns the three gradients in one call. The fused derivation (what ``gradients`` runs) does the same: the
forward's ``_attention`` calls that kernel where the dispatch would (:data:`FLASH_PRECONDITIONS`, the checks of
``select_sdp_backend_cpp`` with ``dropout_p`` 0 and no mask, checked against ``torch._fused_sdp_choice`` by
tests/rules/test_attention_fused.py), and the backward's ``_attention_backward`` calls its backward. Where the
dispatch takes the math path (another device, autocast, a dtype or a layout the kernel refuses) and where a
graph is recorded (the kernel has no derivative: autograd's own double backward fails there), the readable
formula of ``attention.py`` runs instead::

    P = softmax(scale * q k^T),  grad_v = P^T g,  grad_S = P * (g v^T - sum_-1(P * g v^T)),
    grad_q = scale * grad_S k,   grad_k = scale * grad_S^T q

An ``attn_mask`` keeps the readable derivation (the kernel gives the mask no gradient).
"""

from __future__ import annotations

from ..algebra import primitive
from .attention import MASKED_SOFTMAX

FLASH_PRECONDITIONS = '''def _flash_attention_taken(query, key, value):
    """Whether F.scaled_dot_product_attention(query, key, value) (no mask, dropout_p 0) runs
    _scaled_dot_product_flash_attention_for_cpu, as torch._fused_sdp_choice decides it on a CPU
    (select_sdp_backend_cpp): flash enabled, 4-d tensors of one batch, head count, last size and
    floating dtype, a last dim of stride 1, no empty sequence; never under autocast (which casts
    before the dispatch). torch.compile cannot read the flash switch (sdpa_kernel): there it is on,
    its default."""
    device = query.device.type
    return (device == "cpu" and key.device.type == device and value.device.type == device
            and not torch.is_autocast_enabled(device)
            and (torch.compiler.is_compiling() or torch.backends.cuda.flash_sdp_enabled())
            and query.dim() == 4 and key.dim() == 4 and value.dim() == 4
            and query.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16)
            and key.dtype == query.dtype and value.dtype == query.dtype
            and key.shape[0] == query.shape[0] and value.shape[0] == query.shape[0]
            and key.shape[1] == query.shape[1] and value.shape[1] == query.shape[1]
            and key.shape[3] == query.shape[3] and value.shape[3] == query.shape[3]
            and query.shape[2] > 0 and key.shape[2] > 0
            and query.stride(3) == 1 and key.stride(3) == 1 and value.stride(3) == 1)
'''

ATTENTION = (
    FLASH_PRECONDITIONS
    + "\n\n"
    + '''def _attention(query, key, value, is_causal=False, scale=None):
    """F.scaled_dot_product_attention(query, key, value, is_causal=is_causal, scale=scale) and the
    logsumexp its backward reads: where the dispatch picks the CPU flash kernel, that kernel called
    as F.scaled_dot_product_attention calls it, its (out, logsumexp) as autograd saves them;
    elsewhere F.scaled_dot_product_attention itself and None."""
    if _flash_attention_taken(query, key, value):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, 0.0, is_causal, scale=scale)
    return F.scaled_dot_product_attention(query, key, value, is_causal=is_causal, scale=scale), None
'''
)
"""Emitted once into each module whose fused derivation calls it (``Primitive.helper``)."""


ATTENTION_BACKWARD = (
    MASKED_SOFTMAX
    + "\n\n"
    + '''def _attention_backward(grad_out, query, key, value, out, logsumexp, is_causal=False,
                        scale=None):
    """query's, key's and value's gradients of F.scaled_dot_product_attention: one call of
    autograd's own kernel, _scaled_dot_product_flash_attention_for_cpu_backward, from the out and
    logsumexp the forward's _attention returned, as autograd calls it. Where the forward took no
    flash kernel (logsumexp None) or where a graph is recorded (torch.func.grad's too: the kernel
    has no derivative), the formula: P = softmax(scale q k^T), grad_v = P^T g,
    grad_S = P (g v^T - sum(P g v^T)), grad_q = scale grad_S k, grad_k = scale grad_S^T q."""
    tracked = torch.is_grad_enabled() and any(
        tensor.requires_grad for tensor in (grad_out, query, key, value))
    if logsumexp is not None and not tracked and grad_out.dtype == out.dtype:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, query, key, value, out, logsumexp, 0.0, is_causal, scale=scale)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    scores = scale * query.matmul(key.transpose(-1, -2))
    if is_causal:
        above = torch.ones(scores.shape[-2], scores.shape[-1], dtype=torch.bool,
                           device=scores.device).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    probabilities = _masked_softmax(scores, -1)
    grad_probabilities = grad_out.matmul(value.transpose(-1, -2))
    grad_scores = probabilities * (
        grad_probabilities - (probabilities * grad_probabilities).sum(-1, keepdim=True))
    return ((scale * grad_scores.matmul(key)).to(query.dtype),
            (scale * grad_scores.transpose(-1, -2).matmul(query)).to(key.dtype),
            probabilities.transpose(-1, -2).matmul(grad_out).to(value.dtype))
'''
)
"""Emitted once into each module whose fused derivation calls it (``Primitive.helper``); it reads
``_masked_softmax``, attention.py's helper, written once with it."""


def _attention_code(operands, params, show) -> str:
    query, key, value = operands
    extra = ", is_causal=True" if params["is_causal"] else ""
    extra += f", scale={show(params['scale'])}" if params["explicit_scale"] else ""
    return f"_attention({query}, {key}, {value}{extra})"


def _backward_code(operands, params, show) -> str:
    extra = ", is_causal=True" if params["is_causal"] else ""
    extra += f", scale={show(params['scale'])}" if params["explicit_scale"] else ""
    return f"_attention_backward({', '.join(operands)}{extra})"


primitive(
    "attention_with_logsumexp",
    code=_attention_code,
    helper=ATTENTION,
    outputs=2,
    latex=lambda operands, params, show: (
        rf"\operatorname{{attention}}\left({', '.join(operands)}\right), \operatorname{{logsumexp}}"
    ),
)  # not fresh: its backward reads its output
primitive(
    "attention_backward",
    code=_backward_code,
    helper=ATTENTION_BACKWARD,
    outputs=3,
    fresh=True,
    latex=lambda operands, params, show: rf"\operatorname{{attention\_backward}}\left({', '.join(operands)}\right)",
)
