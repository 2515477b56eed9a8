"""The functions cross_entropy's fused derivation emits into a generated module (``Primitive.helper`` in
:mod:`symgrad.rules.loss`): its forward as ``F.cross_entropy`` runs it (``log_softmax``, then
``nll_loss``, keeping the log-probabilities, as autograd keeps them), and its backward by autograd's
own two kernels, called as autograd calls them (``tools/autograd/derivatives.yaml``: ``nll_loss_backward``
or ``nll_loss2d_backward``, then ``_log_softmax_backward_data``), so its gradient is autograd's bit for
bit, in float32 and under autocast."""

from .variant_helpers import HelperDeclaration

LOG_SOFTMAX = '''def _log_softmax(input):
    """``F.log_softmax(input, 1)`` as ``F.cross_entropy`` runs it (in float32 under autocast)."""
    device = input.device.type  # "meta" where bind checks a call's sizes: no autocast there
    widened = (device != "meta" and torch.is_autocast_enabled(device)
               and input.dtype in (torch.float16, torch.bfloat16))
    return F.log_softmax(input.float() if widened else input, 1)
'''
"""Emitted once into each module whose fused derivation of cross_entropy calls it."""


CROSS_ENTROPY_BACKWARD = HelperDeclaration(
    '''def _cross_entropy_backward(grad_output, log_probs, target, dtype, reduction="mean"):
{% if planes or flattens %}
    """cross_entropy's input gradient by autograd's own kernels: nll_loss's backward (nll_loss2d's
    for [N, C, H, W]), then log_softmax's, in the forward's dtype; returned in ``dtype``."""
{% else %}
    """cross_entropy's input gradient by autograd's own kernels: nll_loss's backward, then
    log_softmax's, in the forward's dtype; returned in ``dtype``."""
{% endif %}
{% if expands %}
    how, rank = {"none": 0, "mean": 1, "sum": 2}[reduction], target.dim()
{% else %}
    how = {"none": 0, "mean": 1, "sum": 2}[reduction]
{% endif %}
    total = (target != -100).sum().to(log_probs.dtype)  # nll_loss's total_weight: targets counted
    grad = grad_output.to(log_probs.dtype)
{% if expands %}
    if how == 0 and grad.dim() < rank:  # a per-sample sum's, expanded as autograd expands it
        grad = grad.reshape(-1, *[1] * (rank - 1)).expand(target.shape)
{% endif %}
{% if flattens or rows and planes %}
    seen, classes = log_probs, target
    if log_probs.dim() not in (2, 4):  # F.nll_loss sees these as [N, C, 1, -1] (contiguous copies)
        n, c = log_probs.shape[:2]
        seen = seen.contiguous().reshape(n, c, 1, -1)
        classes = classes.contiguous().reshape(n, 1, -1)
        grad = grad if how else grad.reshape(n, 1, -1)
    grad = (torch.ops.aten.nll_loss_backward if seen.dim() == 2
            else torch.ops.aten.nll_loss2d_backward)(grad, seen, classes, None, how, -100, total)
    return torch.ops.aten._log_softmax_backward_data(
        grad.reshape(log_probs.shape), log_probs, 1, log_probs.dtype).to(dtype)
{% else %}
    grad = torch.ops.aten.nll_loss{{ "2d" if planes else "" }}_backward(grad, log_probs, target, None, how, -100, total)
    return torch.ops.aten._log_softmax_backward_data(grad, log_probs, 1, log_probs.dtype).to(dtype)
{% endif %}
''',
    parts=("rows", "planes", "flattens", "expands"),
    callers={"cross_entropy_backward": lambda expression: _scores_parts(expression.params)},
)
"""Emitted once into each module whose fused derivation of cross_entropy calls it, with the kernels and
branches its calls need: ``rows`` (scores [N, C]: nll_loss's kernel), ``planes`` ([N, C, H, W]:
nll_loss2d's), ``flattens`` (any other rank, seen as [N, C, 1, -1]; with both kernels, the general form)
and ``expands`` (a per-sample loss of a target with more than one dim: its gradient expanded)."""


def _scores_parts(params) -> frozenset[str]:
    """The parts of ``_cross_entropy_backward`` a call needs: by its scores' rank and its reduction."""
    rank = params["rank"]
    kernel = {2: "rows", 4: "planes"}.get(rank, "flattens")
    return frozenset([kernel] + (["expands"] if params["how"] == "per_sample" and rank > 2 else []))
