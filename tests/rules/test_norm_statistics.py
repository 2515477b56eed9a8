"""layer_norm and group_norm keep their forward's statistics for the backward, as autograd does.

The fused backward of each used to run the normalisation's kernel a second time (``torch.native_layer_norm``
or ``torch.native_group_norm`` in the backward) to get the mean and 1 / std, a pass over the input that
autograd's backward does not make. These tests count the kernel's calls in a bound training step (one per
layer: the forward's), check the step against autograd through the original module in float64 at another
batch and size, and the forward's output against the module's own, bit for bit, in every layout the
kernel takes (``F.group_norm`` gives it the input in ``suggest_memory_format``'s layout on a CPU). Under
autocast group_norm's forward stays ``F.group_norm`` (a GPU's autocast runs it in float32, and does not
cast the native kernel), so its backward computes the statistics again there.
"""

from __future__ import annotations

import copy
from collections import Counter

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import symgrad
from symgrad.trace import LossChoice, trace
from tests.helpers import build_text, module_from_source


class _Counted(TorchDispatchMode):
    """Counts the aten calls made inside it, by overload name."""

    def __init__(self):
        super().__init__()
        self.calls = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[str(func)] += 1
        return func(*args, **(kwargs or {}))


class NormNet(nn.Module):
    """GroupNorm and ConvNeXt's LayerNorm (over channels, in [N, H, W, C]) as their authors write them."""

    def __init__(self, channels=8):
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1)
        self.group = nn.GroupNorm(4, channels)
        self.depthwise = nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        self.norm = nn.LayerNorm(channels, eps=1e-6)
        self.pointwise = nn.Linear(channels, 2 * channels)
        self.head = nn.Conv2d(2 * channels, 3, 1)

    def forward(self, x):
        x = F.silu(self.group(self.conv(x)))
        x = self.depthwise(x).permute(0, 2, 3, 1)
        x = self.pointwise(self.norm(x)).permute(0, 3, 1, 2)
        return self.head(x)


def _bound_and_reference(dtype=torch.float64):
    torch.manual_seed(0)
    model = NormNet().to(dtype).train()
    text = trace(
        model, {"x": (2, 3, 8, 8)}, wrt="parameters", name="norms", loss=LossChoice("mse_loss", "target"), mode="train"
    )
    generated = module_from_source(build_text(text, "norms.yaml").rendered.files["norms.py"], "norms")
    bound_model = copy.deepcopy(model)
    return symgrad.bind(generated, bound_model), bound_model, model


def test_a_bound_step_runs_each_norm_kernel_once_and_equals_autograd():
    bound, bound_model, model = _bound_and_reference()
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 3, 10, 6, generator=generator, dtype=torch.float64)  # another batch and size than traced
    target = torch.randn(3, 3, 10, 6, generator=generator, dtype=torch.float64)
    bound(x=x, target=target)  # bind checks a call's sizes once, on meta tensors (counted too)
    with _Counted() as counted:
        bound(x=x, target=target).backward()
    assert counted.calls["aten.native_group_norm.default"] == 1, counted.calls
    assert counted.calls["aten.native_layer_norm.default"] == 1, counted.calls
    assert counted.calls["aten.native_group_norm_backward.default"] == 1
    assert counted.calls["aten.native_layer_norm_backward.default"] == 1
    F.mse_loss(model(x), target).backward()
    for (name, ours), theirs in zip(bound_model.named_parameters(), model.parameters()):
        assert (ours.grad - theirs.grad).norm() <= 1e-12 * theirs.grad.norm(), name


def test_under_autocast_group_norm_computes_its_statistics_again_and_layer_norm_does_not():
    bound, bound_model, model = _bound_and_reference(torch.float32)
    generator = torch.Generator().manual_seed(2)
    x, target = (torch.randn(2, 3, 8, 8, generator=generator) for _ in range(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bound(x=x, target=target)  # bind checks a call's sizes once, on meta tensors (counted too)
    with _Counted() as counted:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = bound(x=x, target=target)
        loss.backward()
    assert counted.calls["aten.native_group_norm.default"] == 2, counted.calls  # F.group_norm's, the backward's
    assert counted.calls["aten.native_layer_norm.default"] == 1, counted.calls
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = F.mse_loss(model(x), target)
    reference.backward()
    assert torch.equal(loss.detach(), reference.detach())
    for (name, ours), theirs in zip(bound_model.named_parameters(), model.parameters()):
        assert (ours.grad - theirs.grad).norm() <= 2e-2 * theirs.grad.norm(), name


def test_the_forward_equals_f_group_norm_bit_for_bit_in_every_layout():
    from symgrad.rules.norm import GROUP_NORM, GROUP_NORM_BACKWARD

    namespace = {"torch": torch, "F": F}
    exec(GROUP_NORM + GROUP_NORM_BACKWARD, namespace)  # noqa: S102 - symgrad's own helper
    generator = torch.Generator().manual_seed(3)
    weight, bias = torch.randn(8, generator=generator), torch.randn(8, generator=generator)
    inputs = [
        torch.randn(2, 8, 5, 7, generator=generator).contiguous(memory_format=torch.channels_last),
        torch.randn(2, 8, 3, 4, 5, generator=generator).contiguous(memory_format=torch.channels_last_3d),
        torch.randn(2, 8, 7, 5, generator=generator).transpose(2, 3),
        torch.randn(2, 8, 11, generator=generator),
        # channels_last strides, not dense: suggest_memory_format still says channels_last
        torch.randn(2, 16, 5, 7, generator=generator).contiguous(memory_format=torch.channels_last)[:, :8],
        torch.randn(2, 8, 4, 6, 5, generator=generator).contiguous(memory_format=torch.channels_last_3d)[:, :, 1:],
    ]
    for x in inputs:
        output, mean, rstd = namespace["_group_norm"](x, weight, bias, 4)
        expected = F.group_norm(x, 4, weight, bias)
        assert torch.equal(output, expected) and output.stride() == expected.stride(), x.shape
        assert mean.shape == rstd.shape == (2, 4)
        # the backward, from these statistics, equals autograd's bit for bit too
        leaf, weight_leaf, bias_leaf = (value.detach().requires_grad_() for value in (x, weight, bias))
        reference = F.group_norm(leaf, 4, weight_leaf, bias_leaf)
        cotangent = torch.randn(reference.shape, generator=generator)
        expected_grads = torch.autograd.grad(reference, (leaf, weight_leaf, bias_leaf), cotangent)
        grads = namespace["_group_norm_backward"](cotangent, x, weight, 4, mean, rstd)
        assert all(torch.equal(ours, theirs) for ours, theirs in zip(grads, expected_grads)), x.shape


class _ScaledNorm(nn.Module):
    """A layer norm without affine, then a layer scale (timm's ``LayerScale``: ``x * gamma``)."""

    def __init__(self):
        super().__init__()
        self.fc, self.norm = nn.Linear(6, 8), nn.LayerNorm(8, elementwise_affine=False)
        self.gamma = nn.Parameter(torch.full((8,), 0.5))

    def forward(self, input):
        return self.norm(self.fc(input)) * self.gamma


def test_a_step_whose_gradient_is_wider_than_its_layer_norm_takes_statistics_in_that_dtype():
    """Under autocast a bfloat16 layer norm without affine, then a float32 layer scale, gets a float32
    gradient: wider than the statistics its forward kept, which the kernel reads in its input's dtype, so
    the backward computes them again in that dtype (it raised before)."""
    torch.manual_seed(0)
    model = _ScaledNorm()
    text = trace(
        model, {"input": (4, 6)}, wrt="parameters", name="wider", loss=LossChoice("mse_loss", "target"), mode="train"
    )
    generated = module_from_source(build_text(text, "wider.yaml").rendered.files["wider.py"], "wider")
    bound_model = copy.deepcopy(model)
    bound = symgrad.bind(generated, bound_model)
    generator = torch.Generator().manual_seed(4)
    x, target = torch.randn(5, 6, generator=generator), torch.randn(5, 8, generator=generator)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bound(input=x, target=target).backward()
        F.mse_loss(model(x), target).backward()
    for (name, ours), theirs in zip(bound_model.named_parameters(), model.parameters()):
        assert (ours.grad - theirs.grad).norm() <= 2e-2 * theirs.grad.norm(), name


class _Block(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(channels, channels, 3, padding=1), nn.GroupNorm(2, channels)

    def forward(self, x):
        return x + torch.relu(self.norm(self.conv(x)))


class _Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.stages = nn.Sequential(_Block(8), _Block(8))
        self.drop = nn.Dropout(0.5)
        self.head = nn.Conv2d(8, 2, 1)

    def forward(self, x):
        return self.head(self.drop(self.stages(self.stem(x))))


def test_the_blocks_form_checks_sizes_on_meta_tensors_and_draws_the_dropout_masks_autograd_draws():
    """bind checks a call's sizes by running the generated forward on meta tensors; the blocks' group norms
    run there too (``torch.is_autocast_enabled("meta")`` raises, so ``_group_norm`` does not ask). Had the
    check fallen back to the real forward, it would have drawn the step's dropout masks first."""
    torch.manual_seed(0)
    model = _Blocks().double()
    text = trace(
        model,
        {"x": (2, 3, 6, 6)},
        wrt="parameters",
        name="blocks",
        loss=LossChoice("mse_loss", "target"),
        mode="train",
        blocks=True,
    )
    assert "\nblocks:\n" in text
    generated = module_from_source(build_text(text, "blocks.yaml").rendered.files["blocks.py"], "blocks")
    bound_model = copy.deepcopy(model)
    bound = symgrad.bind(generated, bound_model)
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(3, 3, 5, 7, generator=generator, dtype=torch.float64)
    target = torch.randn(3, 2, 5, 7, generator=generator, dtype=torch.float64)
    torch.manual_seed(5)
    F.mse_loss(model(x), target).backward()
    torch.manual_seed(5)
    bound(x=x, target=target).backward()
    for (name, ours), theirs in zip(bound_model.named_parameters(), model.parameters()):
        assert (ours.grad - theirs.grad).norm() <= 1e-12 * theirs.grad.norm(), name


def test_a_gradient_penalty_through_a_group_norm_whose_bias_alone_trains():
    """``create_graph=True`` where only the group norm's bias needs a gradient: the forward's statistics
    (differentiable outputs of ``native_group_norm``, through the bias) reach the kernel, which has no
    derivative, as constants."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.GroupNorm(2, 8), nn.Flatten(), nn.Linear(8 * 9, 4)).double()
    model[0].weight.requires_grad_(False)
    model[2].weight.requires_grad_(False)
    text = trace(model, {"input": (2, 8, 3, 3)}, "parameters", "penalty", mode="train")
    generated = module_from_source(build_text(text, "penalty.yaml").rendered.files["penalty.py"], "penalty")
    bound_model = copy.deepcopy(model)
    bound = symgrad.bind(generated, bound_model)
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(3, 8, 3, 3, generator=generator, dtype=torch.float64)
    cotangent = torch.randn(3, 4, generator=generator, dtype=torch.float64)
    for net, owner in ((model, model), (bound, bound_model)):
        trained = [p for p in owner.parameters() if p.requires_grad]
        loss = (net(x) * cotangent).sum()
        grads = torch.autograd.grad(loss, trained, create_graph=True)
        (loss + sum(grad.pow(2).sum() for grad in grads)).backward()
    for (name, ours), theirs in zip(bound_model.named_parameters(), model.parameters()):
        if theirs.requires_grad:
            assert (ours.grad - theirs.grad).norm() <= 1e-12 * theirs.grad.norm(), name
