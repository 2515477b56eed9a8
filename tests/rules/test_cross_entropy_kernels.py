"""cross_entropy's fused derivation is autograd's own: the saving forward runs ``log_softmax`` then ``nll_loss``
(as ``F.cross_entropy`` does: the same loss, bit for bit) and keeps the log-probabilities; the backward calls
``nll_loss_backward`` (``nll_loss2d_backward``) and ``_log_softmax_backward_data`` as autograd calls them, so
its gradients are autograd's bit for bit in float32 and under bfloat16 autocast (which runs cross_entropy in
float32), with ignored class indices (-100), for every reduction and rank, and twice differentiable."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from symgrad.check import module_from_source
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace


class ConvHead(nn.Module):
    """A convolution, a global pool and a linear classifier: any input size."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(torch.relu(self.conv(x)), 1).flatten(1))


@pytest.fixture(scope="module")
def conv_head():
    torch.manual_seed(0)
    model = ConvHead()
    text = trace(model, {"x": (2, 3, 6, 6)}, name="ce_head", loss=LossChoice("cross_entropy", "labels"), mode="train")
    source = build_text(text, "ce_head.yaml").rendered.files["ce_head.py"]
    return model, source, module_from_source(source, "ce_head")


def _autograd(model, x, labels):
    """The loss and the gradients of x and every parameter, by autograd through the original module."""
    x = x.clone().requires_grad_()
    loss = F.cross_entropy(model(x), labels)
    return loss.detach(), torch.autograd.grad(loss, [x, *model.parameters()])


def _ours(module, model, x, labels):
    params = {key: value.detach().clone() for key, value in model.state_dict().items()}
    grads = module.gradients(x, labels, params)
    return module.forward(x, labels, params), [grads.x, *(grads.params[key] for key, _ in model.named_parameters())]


LABELS = torch.tensor([0, 4, -100, 3, 3, 1, 2])  # one ignored
"""Seven samples, another batch than the traced 2, one of them ignored."""


def test_the_module_keeps_the_readable_call_and_runs_autograds_kernels(conv_head):
    _, source, _ = conv_head
    plain = source[source.index("def forward(") : source.index("def gradients(")]
    saving = source[source.index("def _forward_saving(") : source.index("def _backward_from_saved(")]
    backward = source[source.index("def _backward_from_saved(") : source.index("class ExplicitGradient")]
    assert "F.cross_entropy(fc, labels, reduction='mean')" in plain
    assert "log_probs_loss = _log_softmax(fc)" in saving
    assert "F.nll_loss(log_probs_loss, labels, reduction='mean')" in saving
    assert "_cross_entropy_backward(grad_loss, log_probs_loss, labels, fc_layout.dtype)" in backward
    assert "torch.softmax(" not in backward and "scatter_" not in backward  # the exploded formula is gone
    assert "torch.ops.aten.nll_loss_backward" in source and "torch.ops.aten._log_softmax_backward_data" in source


def test_float64_gradients_equal_autograd_at_another_batch_and_size(conv_head):
    model, _, module = conv_head
    model = copy.deepcopy(model).double()
    x = torch.randn(7, 3, 9, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    loss, want = _autograd(model, x, LABELS)
    ours, got = _ours(module, model, x, LABELS)
    assert abs(ours.item() - loss.item()) <= 1e-12
    for a, b in zip(want, got):
        assert (a - b).abs().max().item() <= 1e-12 * max(1.0, a.abs().max().item())
    assert got[0][2].abs().max().item() == 0.0  # the ignored sample's input has no gradient


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16-autocast"])
def test_float32_gradients_are_autograds_bit_for_bit(conv_head, autocast):
    model, _, module = conv_head
    x = torch.randn(7, 3, 9, 7, generator=torch.Generator().manual_seed(2))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss, want = _autograd(copy.deepcopy(model), x, LABELS)
        ours, got = _ours(module, model, x, LABELS)
        saved_loss, *_ = module._forward_saving(x, LABELS, dict(model.state_dict()))
    assert loss.dtype == ours.dtype == saved_loss.dtype == torch.float32  # cross_entropy in float32 under autocast
    assert torch.equal(ours, loss) and torch.equal(saved_loss, loss)
    for a, b in zip(want, got):
        assert a.dtype == b.dtype and torch.equal(a, b)


def _scored(rank: int, reduction: str):
    """The module of ``relu`` then cross_entropy on scores of ``rank``."""
    shape = SCORES[rank]
    text = f"""name: ce_rank{rank}
inputs:
  s: {{shape: {list(shape)}}}
  t: {{shape: {[shape[0], *shape[2:]]}, dtype: int64}}
layers:
  - {{op: relu, in: s, out: scores}}
loss: {{op: cross_entropy, in: scores, target: t, reduction: {reduction}}}
wrt: [s]
"""
    return module_from_source(build_text(text).rendered.files[f"ce_rank{rank}.py"], f"ce_rank{rank}")


SCORES = {2: (5, 4), 3: (3, 4, 5), 4: (2, 4, 3, 5), 5: (2, 4, 2, 3, 2)}
"""Scores [N, C, ...] of each rank cross_entropy takes (nll_loss on [N, C], nll_loss2d on [N, C, H, W], any
other rank as [N, C, 1, -1] views)."""


@pytest.mark.parametrize(
    "rank, reduction, channels_last",
    [(2, "mean", False), (2, "sum", False), (2, "per_sample", False), (3, "per_sample", False)]
    + [(4, "mean", True), (4, "per_sample", False), (5, "sum", False), (5, "per_sample", False)],
)
def test_every_rank_and_reduction_is_autograds_bit_for_bit(rank, reduction, channels_last):
    shape = SCORES[rank]
    module = _scored(rank, reduction)
    generator = torch.Generator().manual_seed(rank)
    big = tuple(size + 1 for size in shape)  # another size than the spec's
    scores = torch.randn(big, generator=generator)
    if channels_last:
        scores = scores.contiguous(memory_format=torch.channels_last)
    t = torch.randint(0, big[1], (big[0], *big[2:]), generator=generator)
    t.view(-1)[::3] = -100
    leaf = scores.clone().requires_grad_()
    loss = F.cross_entropy(F.relu(leaf), t, reduction="none" if reduction == "per_sample" else reduction)
    loss = loss.sum(dim=tuple(range(1, rank - 1))) if reduction == "per_sample" and rank > 2 else loss
    cotangent = torch.randn(loss.shape, generator=generator)
    (want,) = torch.autograd.grad(loss, leaf, cotangent)
    (got,) = module.gradients(scores, t, grad_loss=cotangent)
    assert torch.equal(module.forward(scores, t), loss.detach())
    assert torch.equal(got, want)


@pytest.mark.parametrize("rank, reduction", [(2, "mean"), (4, "per_sample")])
def test_twice_differentiable(rank, reduction):
    """Autograd differentiates the two kernels where a gradient is recorded (``create_graph``)."""
    module = _scored(rank, reduction)
    generator = torch.Generator().manual_seed(5)
    scores = torch.randn(SCORES[rank], dtype=torch.float64, generator=generator, requires_grad=True)
    t = torch.randint(0, SCORES[rank][1], (SCORES[rank][0], *SCORES[rank][2:]), generator=generator)
    t.view(-1)[0] = -100
    assert torch.autograd.gradgradcheck(lambda s: module.loss_with_explicit_backward(s, t), (scores,), fast_mode=True)
