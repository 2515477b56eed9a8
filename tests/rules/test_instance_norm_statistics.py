"""instance_norm without running statistics keeps its forward's statistics for the backward, as autograd does.

``F.instance_norm`` runs ``native_batch_norm`` on the input seen as one sample of N x C channels (weight and
bias repeated N times), and autograd's backward is ``native_batch_norm_backward`` from the mean and 1 / std
that call returned, the weight's and bias's gradients summed over the N copies. The generated code now does
the same: the forward is bit for bit F.instance_norm's, the gradients bit for bit autograd's, and the
backward no longer runs a normalisation again (it ran ``native_group_norm`` for the statistics). Under
autocast, and with running statistics (which F.instance_norm moves in place), the forward stays
``F.instance_norm`` and the backward computes the statistics again, as before.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import symgrad
from symgrad.trace import LossChoice, trace
from tests.helpers import build_text, module_from_source
from tests.rules.test_norm_statistics import _Counted


class ConvNormAct3d(nn.Module):
    """MONAI's ``Convolution`` unit as its authors write it: conv, instance norm, LeakyReLU, twice."""

    def __init__(self, channels=4, affine=True, track=False):
        super().__init__()
        self.conv1 = nn.Conv3d(2, channels, 3, padding=1, bias=False)
        self.norm1 = nn.InstanceNorm3d(channels, affine=affine, track_running_stats=track)
        self.conv2 = nn.Conv3d(channels, channels, 3, padding=1, bias=False)
        self.norm2 = nn.InstanceNorm3d(channels, affine=False)
        self.act = nn.LeakyReLU(0.01, inplace=True)

    def forward(self, x):
        return self.act(self.norm2(self.conv2(self.act(self.norm1(self.conv1(x))))))


def _bound(model, name):
    text = trace(
        model, {"x": (2, 2, 6, 6, 6)}, wrt="parameters", name=name, loss=LossChoice("mse_loss", "target"), mode="train"
    )
    generated = module_from_source(build_text(text, f"{name}.yaml").rendered.files[f"{name}.py"], name)
    bound_model = copy.deepcopy(model)
    return symgrad.bind(generated, bound_model), bound_model


def _data(dtype, seed, shape=(3, 2, 5, 7, 4)):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator, dtype=dtype)
    return x, torch.randn(shape[0], 4, *shape[2:], generator=generator, dtype=dtype)


def test_a_bound_step_normalises_once_per_layer_and_equals_autograd():
    torch.manual_seed(0)
    model = ConvNormAct3d().double().train()
    bound, bound_model = _bound(model, "unit3d")
    x, target = _data(torch.float64, 1)  # another batch and size than traced
    bound(x=x, target=target)  # bind checks a call's sizes once, on meta tensors
    with _Counted() as counted:
        bound(x=x, target=target).backward()
    assert counted.calls["aten.native_batch_norm.default"] == 2, counted.calls  # the forward's, one per layer
    assert counted.calls["aten.native_batch_norm_backward.default"] == 2, counted.calls
    assert counted.calls["aten.native_group_norm.default"] == 0, counted.calls  # no statistics computed again
    F.mse_loss(model(x), target).backward()
    for (name, ours), theirs in zip(bound_model.named_parameters(), model.parameters()):
        assert (ours.grad - theirs.grad).norm() <= 1e-12 * theirs.grad.norm(), name


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last_3d])
def test_the_forward_and_the_gradients_are_f_instance_norms_and_autograds_bit_for_bit(layout):
    torch.manual_seed(0)
    model = nn.InstanceNorm3d(4, affine=True)
    with torch.no_grad():
        model.weight.uniform_(0.5, 1.5), model.bias.uniform_(-0.5, 0.5)
    text = trace(model, {"input": (2, 4, 3, 4, 5)}, name="norm", loss=LossChoice("mse_loss", "target"), mode="train")
    generated = module_from_source(build_text(text, "norm.yaml").rendered.files["norm.py"], "norm")
    x, target = _data(torch.float32, 3, (3, 4, 6, 5, 7))
    x = x.contiguous(memory_format=layout)
    params = {"weight": model.weight.detach(), "bias": model.bias.detach()}
    assert torch.equal(generated.forward(input=x, target=target, params=params), F.mse_loss(model(x), target))
    ours = generated.gradients(input=x, target=target, params=params)
    leaf = x.clone().requires_grad_()
    theirs = torch.autograd.grad(F.mse_loss(model(leaf), target), [leaf, model.weight, model.bias])
    assert torch.equal(ours.input, theirs[0])
    assert torch.equal(ours.params["weight"], theirs[1]) and torch.equal(ours.params["bias"], theirs[2])


def test_under_autocast_and_with_running_statistics_the_backward_computes_them_again():
    torch.manual_seed(0)
    model = ConvNormAct3d(track=True).train()
    bound, bound_model = _bound(model, "tracked3d")
    x, target = _data(torch.float32, 2)
    for autocast in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            bound(x=x, target=target)  # the sizes checked once per dtype (and moves the statistics once)
            model(x)
        with _Counted() as counted:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = bound(x=x, target=target)
            loss.backward()
        # norm1 tracks its statistics: F.instance_norm, then group_norm's kernel in the backward; norm2 keeps
        # its statistics but under autocast, where F.instance_norm runs and the backward computes them again
        assert counted.calls["aten.native_group_norm.default"] == (2 if autocast else 1), counted.calls
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            reference = F.mse_loss(model(x), target)
        reference.backward()
        assert torch.equal(loss.detach(), reference.detach())
        for (name, ours), theirs in zip(bound_model.named_parameters(), model.parameters()):
            # under autocast a bias whose gradient is a small sum of bfloat16 terms (norm1's: 0.007 of terms
            # near 1) is compared on the scale of the gradients around it
            scale = max(theirs.grad.norm(), 0.1) if autocast else theirs.grad.norm()
            assert (ours.grad - theirs.grad).norm() <= (2e-2 if autocast else 1e-5) * scale, name
        for (name, ours), theirs in zip(bound_model.named_buffers(), model.buffers()):
            assert torch.allclose(ours.float(), theirs.float(), rtol=1e-5, atol=1e-6), name
        bound_model.zero_grad(), model.zero_grad()


def test_a_gradient_penalty_through_instance_norms_equals_autograds():
    """``create_graph=True``: native_batch_norm_backward is twice differentiable, and the repeat's sum too."""
    torch.manual_seed(0)
    model = ConvNormAct3d().double().train()
    bound, bound_model = _bound(model, "penalty3d")
    x, target = _data(torch.float64, 4, (2, 2, 4, 3, 5))
    for net, owner in ((model, model), (bound, bound_model)):
        loss = net(x=x, target=target) if net is bound else F.mse_loss(net(x), target)
        grads = torch.autograd.grad(loss, list(owner.parameters()), create_graph=True)
        (loss + sum(grad.pow(2).sum() for grad in grads)).backward()
    for (name, ours), theirs in zip(bound_model.named_parameters(), model.parameters()):
        assert (ours.grad - theirs.grad).norm() <= 1e-10 * theirs.grad.norm(), name


BIAS_ONLY = """
name: {name}
inputs:
  x: {{shape: [3, 4, 7]}}
  b: {{shape: [4]}}
  y: {{shape: [3, 4, 7]}}
layers:
  - {{op: {op}, bias: b{extra}, out: n}}
  - {{op: tanh, out: p}}
loss: {{op: mse_loss, target: y}}
wrt: [x, b]
"""


@pytest.mark.parametrize("op, extra", [("instance_norm", ""), ("batch_norm", ", training: true")])
def test_a_norm_with_a_bias_and_no_weight_has_gradients_that_differentiate_right(op, extra):
    """``native_batch_norm_backward``'s own derivative drops the bias gradient's dependence on its incoming
    gradient when the weight is None (PyTorch's gradgradcheck of ``F.instance_norm(x, bias=b)`` fails): where
    the gradients are differentiated again, batch_norm's kernel gets a weight of ones, and instance_norm's
    backward is group_norm's formula, which raised for a bias without a weight."""
    generated = module_from_source(
        build_text(BIAS_ONLY.format(name="bias_only", op=op, extra=extra), "bias_only.yaml").rendered.files[
            "bias_only.py"
        ],
        "bias_only",
    )
    generator = torch.Generator().manual_seed(7)
    x, b, y = (
        torch.randn(shape, generator=generator, dtype=torch.float64, requires_grad=True)
        for shape in ((3, 4, 7), (4,), (3, 4, 7))
    )

    def both(x, b):
        grads = generated.gradients(x=x, b=b, y=y.detach())
        return grads.x, grads.b

    assert torch.autograd.gradcheck(both, (x, b), fast_mode=True)


def test_instance_norm_gradients_are_differentiable_twice_more():
    """A third-order check (gradgradcheck of the generated gradients): the derivatives of
    ``native_batch_norm_backward``'s own derivative are wrong (PyTorch's gradgradcheck of ``F.batch_norm``'s
    gradients fails), so where the gradients are differentiated again instance_norm's backward is
    group_norm's formula, as it was before it kept its statistics."""
    spec = (
        BIAS_ONLY.format(name="affine", op="instance_norm", extra=", weight: w")
        .replace("  b: {shape: [4]}", "  w: {shape: [4]}\n  b: {shape: [4]}")
        .replace("wrt: [x, b]", "wrt: [x, w, b]")
    )
    generated = module_from_source(build_text(spec, "affine.yaml").rendered.files["affine.py"], "affine")
    generator = torch.Generator().manual_seed(7)
    x, w, b, y = (
        torch.randn(shape, generator=generator, dtype=torch.float64, requires_grad=True)
        for shape in ((3, 4, 7), (4,), (4,), (3, 4, 7))
    )

    def gradients(x, w, b):
        grads = generated.gradients(x=x, w=w, b=b, y=y.detach())
        return grads.x, grads.w, grads.b

    assert torch.autograd.gradgradcheck(gradients, (x, w, b), fast_mode=True)


def test_one_spatial_element_is_refused_as_f_instance_norm_refuses_it():
    """Each channel's statistics would be its one value and 0: F.instance_norm raises in training, and so do
    the generated functions (they called the batch_norm kernel, which returned zeros)."""
    model = nn.InstanceNorm2d(4, affine=True)
    text = trace(model, {"input": (2, 4, 3, 3)}, name="single", loss=LossChoice("mse_loss", "target"), mode="train")
    generated = module_from_source(build_text(text, "single.yaml").rendered.files["single.py"], "single")
    x, target = torch.randn(2, 4, 1, 1), torch.randn(2, 4, 1, 1)
    params = {"weight": model.weight.detach(), "bias": model.bias.detach()}
    with pytest.raises(ValueError, match="Expected more than 1 spatial element when training"):
        model(x)
    with pytest.raises(ValueError, match="Expected more than 1 spatial element when training"):
        generated.gradients(input=x, target=target, params=params)
