"""cross_entropy and nll_loss skip a class index of -100 (their default ``ignore_index``) as PyTorch does:
the entry adds nothing to the loss, gets a zero gradient, and the mean averages over the other entries."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from symgrad.pipeline import build_text


def _module(tmp_path, op: str, reduction: str):
    name = f"ignored_{op}_{reduction}"
    text = f"""name: {name}
inputs:
  x: {{shape: [5, 4, 3]}}
  w: {{shape: [6, 4, 1]}}
  t: {{shape: [5, 3], dtype: int64}}
layers:
  - {{op: conv1d, weight: w, out: scores}}
loss: {{op: {op}, in: scores, target: t, reduction: {reduction}}}
wrt: [x, w]
"""
    path = tmp_path / f"{name}.py"
    path.write_text(build_text(text).rendered.files[path.name])
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("reduction", ["mean", "sum", "per_sample"])
@pytest.mark.parametrize("op", ["cross_entropy", "nll_loss"])
def test_an_ignored_class_index_gets_autograds_gradient(tmp_path, op, reduction):
    module = _module(tmp_path, op, reduction)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(5, 4, 3, dtype=torch.float64, generator=generator, requires_grad=True)
    w = torch.randn(6, 4, 1, dtype=torch.float64, generator=generator, requires_grad=True)
    t = torch.randint(0, 6, (5, 3), generator=generator)
    t[1, :] = -100  # a whole sample ignored
    t[3, 2] = -100  # and one position of another
    loss = getattr(F, op)(F.conv1d(x, w), t, reduction="none" if reduction == "per_sample" else reduction)
    if reduction == "per_sample":
        loss = loss.sum(dim=1)
    cotangent = torch.randn(loss.shape, dtype=torch.float64, generator=generator)
    expected = torch.autograd.grad(loss, [x, w], cotangent)
    ours = module.gradients(x=x.detach(), w=w.detach(), t=t, grad_loss=cotangent)
    assert torch.allclose(module.forward(x=x.detach(), w=w.detach(), t=t), loss.detach(), atol=1e-12, rtol=0)
    for name, want in zip(("x", "w"), expected):
        got = getattr(ours, name)
        assert (got - want).abs().max().item() <= 1e-12 * max(1.0, want.abs().max().item()), name
    assert ours.x[1].abs().max().item() == 0.0  # the ignored sample has no gradient at all
    torch.autograd.gradcheck(lambda x, w: module.loss_with_explicit_backward(x, w, t), (x, w), fast_mode=True)
