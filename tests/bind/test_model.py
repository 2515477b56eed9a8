"""``symgrad.bind`` of a model traced without a loss: the bound model returns the model's own outputs,
any loss after it is plain autograd, it follows ``model.training``, and its dropout and drop-path masks
are the model's own draws from the same seed (issue 37)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symgrad
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace, trace_modes
from symgrad.trace.names_from_code import POSITIONS

# ----- the model, written as timm and torchvision write these layers ----------------------------------


def drop_path(x, drop_prob: float = 0.0, training: bool = False, scale_by_keep: bool = True):
    """timm.layers.drop.drop_path, as timm writes it."""
    if drop_prob == 0.0 or not training:
        return x
    keep_prob = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)  # work with diff dim tensors, not just 2D ConvNets
    random_tensor = x.new_empty(shape).bernoulli_(keep_prob)
    if keep_prob > 0.0 and scale_by_keep:
        random_tensor.div_(keep_prob)
    return x * random_tensor


class DropPath(nn.Module):
    """timm.layers.drop.DropPath."""

    def __init__(self, drop_prob: float = 0.0, scale_by_keep: bool = True):
        super().__init__()
        self.drop_prob = drop_prob
        self.scale_by_keep = scale_by_keep

    def forward(self, x):
        return drop_path(x, self.drop_prob, self.training, self.scale_by_keep)


def stochastic_depth(input, p: float, mode: str, training: bool = True):
    """torchvision.ops.stochastic_depth, as torchvision writes it."""
    if p < 0.0 or p > 1.0:
        raise ValueError(f"drop probability has to be between 0 and 1, but got {p}")
    if mode not in ["batch", "row"]:
        raise ValueError(f"mode has to be either 'batch' or 'row', but got {mode}")
    if not training or p == 0.0:
        return input

    survival_rate = 1.0 - p
    if mode == "row":
        size = [input.shape[0]] + [1] * (input.ndim - 1)
    else:
        size = [1] * input.ndim
    noise = torch.empty(size, dtype=input.dtype, device=input.device)
    noise = noise.bernoulli_(survival_rate)
    if survival_rate > 0.0:
        noise.div_(survival_rate)
    return input * noise


class StochasticDepth(nn.Module):
    """torchvision.ops.StochasticDepth."""

    def __init__(self, p: float, mode: str) -> None:
        super().__init__()
        self.p = p
        self.mode = mode

    def forward(self, input):
        return stochastic_depth(input, self.p, self.mode, self.training)


class SqueezeExcite(nn.Module):
    """timm's SE gate (timm.layers.squeeze_excite.SEModule)."""

    def __init__(self, channels, rd_ratio=0.25):
        super().__init__()
        rd_channels = max(1, int(channels * rd_ratio))
        self.fc1 = nn.Conv2d(channels, rd_channels, kernel_size=1, bias=True)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Conv2d(rd_channels, channels, kernel_size=1, bias=True)
        self.gate = nn.Sigmoid()

    def forward(self, x):
        x_se = x.mean((2, 3), keepdim=True)
        x_se = self.fc1(x_se)
        x_se = self.fc2(self.act(x_se))
        return x * self.gate(x_se)


class BasicBlock(nn.Module):
    """timm's ResNet BasicBlock with an SE gate and drop path."""

    def __init__(self, channels, drop_path_rate=0.0, depth_mode=None):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.act1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, kernel_size=3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.se = SqueezeExcite(channels)
        self.act2 = nn.ReLU(inplace=True)
        self.drop_path = (
            StochasticDepth(drop_path_rate, depth_mode)
            if depth_mode
            else DropPath(drop_path_rate)
            if drop_path_rate > 0.0
            else nn.Identity()
        )

    def forward(self, x):
        shortcut = x
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.act1(x)
        x = self.conv2(x)
        x = self.bn2(x)
        x = self.se(x)
        x = self.drop_path(x)
        x += shortcut
        x = self.act2(x)
        return x


class AuxNet(nn.Module):
    """Residual SE blocks with drop path, dropout before the head, and an auxiliary head that it
    returns only in train mode (as torchvision's Inception3 and GoogLeNet do)."""

    def __init__(self, num_classes=5, channels=8):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU(inplace=True)
        )
        self.layer1 = BasicBlock(channels, drop_path_rate=0.2)
        self.layer2 = BasicBlock(channels, drop_path_rate=0.3, depth_mode="row")
        self.aux = nn.Linear(channels, num_classes)
        self.drop = nn.Dropout(p=0.25)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x):
        x = self.stem(x)
        x = self.layer1(x)
        aux = self.aux(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)) if self.training else None
        x = self.layer2(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        x = self.drop(x)
        x = self.fc(x)
        if self.training:
            return x, aux
        return x


class DictNet(nn.Module):
    """A forward that returns a dict of tensors (a detection- or segmentation-style head)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.drop = nn.Dropout2d(0.3)
        self.head = nn.Conv2d(4, 2, 1)

    def forward(self, x):
        features = F.relu(self.conv(x))
        return {"out": self.head(self.drop(features)), "features": features}


# ----- helpers ----------------------------------------------------------------------------------------


def generated(tmp_path: Path, *texts: str):
    """Each spec generated into ``tmp_path`` (as ``symgrad generate`` writes it); the first one's path."""
    paths = []
    for text in texts:
        built = build_text(text, "traced.yaml")
        for name, content in built.rendered.files.items():
            (tmp_path / name).write_text(content)
        paths.append(tmp_path / f"{built.graph.spec.name}.py")
    return paths[0]


def max_difference(first: dict, second: dict) -> float:
    return max((first[key].double() - second[key].double()).abs().max().item() for key in first)


# ----- the done-when test -----------------------------------------------------------------------------


def test_a_model_traced_without_a_loss_trains_as_autograd_with_any_loss_and_evaluates_without_a_new_trace(
    tmp_path, monkeypatch
):
    torch.manual_seed(0)
    model = AuxNet().double()
    train_text, eval_text = trace_modes(model, {"x": (2, 3, 8, 8)}, "parameters", "auxnet")
    assert "outputs: [fc, aux]" in train_text and "eval: auxnet_eval" in train_text
    assert "outputs: fc\n" in eval_text and "dropout" not in eval_text
    assert train_text.count("op: dropout") == 3  # layer1's DropPath, layer2's StochasticDepth, the head's Dropout
    reference = copy.deepcopy(model)
    fast = symgrad.bind(generated(tmp_path, train_text, eval_text), model, verify=False)
    monkeypatch.setattr(symgrad.trace, "trace", None)  # nothing below traces again
    optimizers = [torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9) for net in (model, reference)]
    for step in range(4):  # another batch and size than traced
        images = torch.randn(3, 3, 10, 6, dtype=torch.float64)
        labels = torch.randint(0, 5, (3,))
        results = []
        for net, optimizer in zip((fast, reference), optimizers):
            optimizer.zero_grad()
            torch.manual_seed(100 + step)  # the same masks for both: drawn by the same calls, in the same order
            logits, aux = net(images)
            loss = F.cross_entropy(logits, labels, label_smoothing=0.1, ignore_index=-1) + 0.4 * F.cross_entropy(
                aux, labels
            )
            loss.backward()
            optimizer.step()
            results.append({"logits": logits.detach(), "aux": aux.detach(), "loss": loss.detach()})
        assert max_difference(*results) <= 1e-10, step
    assert max_difference(dict(model.named_parameters()), dict(reference.named_parameters())) <= 1e-10
    assert max_difference(dict(model.named_buffers()), dict(reference.named_buffers())) <= 1e-10
    assert int(model.layer1.bn1.num_batches_tracked) == 4
    model.eval()
    reference.eval()
    images = torch.randn(2, 3, 6, 10, dtype=torch.float64)
    with torch.no_grad():
        ours, theirs = fast(images), reference(images)
    assert isinstance(ours, torch.Tensor) and (ours - theirs).abs().max().item() <= 1e-10
    assert max_difference(dict(model.named_buffers()), dict(reference.named_buffers())) <= 1e-10  # eval moves none
    model.train()  # and back
    torch.manual_seed(7)
    logits, aux = fast(images)
    assert logits.shape == (2, 5) and aux.shape == (2, 5)


def test_the_masks_are_the_models_own_draws_and_each_matters(tmp_path):
    """Same seed: equal outputs; another seed: other masks, so the test above cannot pass by chance."""
    torch.manual_seed(0)
    model = AuxNet().double()
    text, evaluation = trace_modes(model, {"x": (2, 3, 8, 8)}, "parameters", "auxnet_masks")
    module = symgrad.bind(generated(tmp_path, text, evaluation), model, verify=False)
    reference = copy.deepcopy(model)
    images = torch.randn(4, 3, 8, 8, dtype=torch.float64)
    torch.manual_seed(3)
    ours = module(images)[0]
    torch.manual_seed(3)
    theirs = reference(images)[0]
    torch.manual_seed(4)
    other = reference(images)[0]
    assert (ours - theirs).abs().max().item() <= 1e-12
    assert (other - theirs).abs().max().item() > 1e-3


def test_an_eval_module_that_is_not_beside_it_is_named(tmp_path):
    from symgrad.check import module_from_source

    text, _ = trace_modes(AuxNet().double(), {"x": (2, 3, 8, 8)}, "parameters", "auxnet_alone")
    built = build_text(text, "traced.yaml")
    module = module_from_source(built.rendered.files["auxnet_alone.py"], "auxnet_alone")
    with pytest.raises(symgrad.BindError, match="auxnet_alone_eval"):
        symgrad.bind(module, AuxNet().double())


def test_a_dict_output_frozen_parameters_and_accumulation(tmp_path):
    torch.manual_seed(1)
    model = DictNet().double()
    model.conv.bias.requires_grad_(False)  # frozen: its .grad stays None
    text, evaluation = trace_modes(model, {"x": (2, 3, 8, 8)}, "parameters", "dictnet")
    features = "features" if POSITIONS else "relu"  # features = F.relu(...): the code's name (Python 3.11 on)
    assert f"outputs: {{out: head, features: {features}}}" in text
    reference = copy.deepcopy(model)
    fast = symgrad.bind(generated(tmp_path, *(t for t in (text, evaluation) if t)), model, verify=False)
    for net in (fast, reference):
        for micro in range(2):  # gradient accumulation over two micro-batches
            torch.manual_seed(micro)
            outputs = net(torch.randn(2, 3, 5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(micro)))
            assert set(outputs) == {"out", "features"}
            (outputs["out"].pow(2).mean() + 0.1 * outputs["features"].abs().sum()).backward()
    grads = {name: value.grad for name, value in model.named_parameters() if value.requires_grad}
    expected = {name: value.grad for name, value in reference.named_parameters() if value.requires_grad}
    assert model.conv.bias.grad is None and max_difference(grads, expected) <= 1e-10


def test_binding_a_loss_ending_module_still_returns_the_loss(tmp_path):
    from symgrad.trace import LossChoice

    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 1)).double()
    text = trace(model, {"input": (2, 3, 8, 8)}, "parameters", "sequential_loss", loss=LossChoice("mse_loss"))
    assert "\nloss: " in text and "outputs:" not in text
    step = symgrad.bind(generated(tmp_path, text), model)
    loss = step(input=torch.randn(2, 3, 8, 8, dtype=torch.float64), target=torch.randn(2, 2, 8, 8, dtype=torch.float64))
    assert type(step).__name__ == "Bound" and loss.dim() == 0


def test_a_module_traced_in_one_mode_refuses_the_other(tmp_path):
    model = AuxNet().double()
    text = trace(model, {"x": (2, 3, 8, 8)}, "parameters", "auxnet_train", mode="train")
    fast = symgrad.bind(generated(tmp_path, text), model)
    model.eval()
    with pytest.raises(symgrad.BindError, match="traced in train mode only"):
        fast(torch.randn(2, 3, 8, 8, dtype=torch.float64))


@pytest.mark.slow
def test_the_block_form_binds_compiles_and_its_generated_tests_pass(tmp_path):
    """Written as blocks (symgrad trace's default): the residual block is one block whose drop-path rate is a
    hyper (0.2, 0.1, 0.3 here), called per instance."""
    from tests.helpers import run_generated_tests

    torch.manual_seed(2)
    model = AuxNet().double()
    model.layer1 = nn.Sequential(BasicBlock(8, drop_path_rate=0.2), BasicBlock(8, drop_path_rate=0.1)).double()
    text, evaluation = trace_modes(model, {"x": (2, 3, 8, 8)}, "parameters", "auxnet_blocks", blocks=True)
    assert "blocks:" in text and "{block: basic_block" in text and "outputs: [fc, aux]" in text
    assert "hyper: {drop_path_p: 0.1}" in text and "hyper: {drop_path_p: 0.3}" in text
    path = generated(tmp_path, text, evaluation)
    assert "_backward(saved, grad_output):" in path.read_text()  # a block's own backward function
    reference = copy.deepcopy(model)
    fast = symgrad.bind(path, model, verify=False)
    optimizers = [torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9) for net in (model, reference)]
    for step in range(2):
        images, labels = torch.randn(3, 3, 6, 10, dtype=torch.float64), torch.randint(0, 5, (3,))
        for net, optimizer in zip((fast, reference), optimizers):
            optimizer.zero_grad()
            torch.manual_seed(step)
            logits, aux = net(images)
            (F.cross_entropy(logits, labels, label_smoothing=0.1) + 0.4 * F.cross_entropy(aux, labels)).backward()
            optimizer.step()
    assert max_difference(model.state_dict(), reference.state_dict()) <= 1e-10
    compiled = torch.compile(fast, fullgraph=True, backend="aot_eager")  # no graph break in the block form
    for net in (compiled, reference):
        torch.manual_seed(5)
        logits, aux = net(images)
        (logits.pow(2).sum() + aux.sum()).backward()
    assert (
        max_difference(
            {name: value.grad for name, value in model.named_parameters()},
            {name: value.grad for name, value in reference.named_parameters()},
        )
        <= 1e-10
    )
    model.eval()
    reference.eval()
    assert (fast(images) - reference(images)).abs().max().item() <= 1e-10
    assert (compiled(images) - reference(images)).abs().max().item() <= 1e-10
    for test_file in ("test_auxnet_blocks.py", "test_auxnet_blocks_eval.py"):
        result = run_generated_tests(tmp_path / test_file)
        assert result.failed == 0 and result.passed > 0, result.report


def test_torch_compile_fullgraph_runs_and_equals_eager(tmp_path):
    """``torch.compile(fast, fullgraph=True)``: no graph break (the Function saves every value through
    save_for_backward while compiling); the same outputs, gradients and buffers as eager, in both
    modes. The aot_eager backend keeps eager's kernels and random draws (inductor's own RNG would draw
    other masks, unless torch._inductor.config.fallback_random is set)."""
    torch.manual_seed(0)
    model = AuxNet().double()
    text, evaluation = trace_modes(model, {"x": (2, 3, 8, 8)}, "parameters", "auxnet_compiled")
    path = generated(tmp_path, text, evaluation)
    eager_model = copy.deepcopy(model)
    compiled, eager = (
        torch.compile(symgrad.bind(path, model, verify=False), fullgraph=True, backend="aot_eager"),
        symgrad.bind(path, eager_model, verify=False),
    )
    for step in range(2):
        images, labels = torch.randn(3, 3, 6, 10, dtype=torch.float64), torch.randint(0, 5, (3,))
        results = []
        for net in (compiled, eager):
            torch.manual_seed(step)
            logits, aux = net(images)
            (F.cross_entropy(logits, labels, label_smoothing=0.1) + 0.4 * F.cross_entropy(aux, labels)).backward()
            results.append({"logits": logits.detach(), "aux": aux.detach()})
        assert max_difference(*results) <= 1e-12
    grads = {name: value.grad for name, value in model.named_parameters()}
    assert max_difference(grads, {name: value.grad for name, value in eager_model.named_parameters()}) <= 1e-12
    assert max_difference(dict(model.named_buffers()), dict(eager_model.named_buffers())) <= 1e-12
    model.eval()
    eager_model.eval()
    assert (compiled(images) - eager(images)).abs().max().item() <= 1e-12


def test_the_loss_form_step_compiles_whole_and_trains_as_autograd(tmp_path):
    """``torch.compile(step, fullgraph=True)`` of the loss-ending form too: no graph break (dynamo
    sees no list held aside, so under it the forward saves every value), and two SGD steps in float64,
    a dropout mask drawn in each, move the parameters and statistics as autograd's do (the compiled
    backward re-ran the forward before, drawing new masks: gradients off by up to 1.7x)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 5),
    ).double()
    reference = copy.deepcopy(model)
    text = trace(
        model,
        {"input": (2, 3, 6, 6)},
        "parameters",
        "conv_loss",
        loss=LossChoice("cross_entropy", "labels"),
        mode="train",
    )
    step = symgrad.bind(generated(tmp_path, text), model)
    compiled = torch.compile(lambda x, labels: step(input=x, labels=labels), fullgraph=True, backend="aot_eager")
    optimizers = [torch.optim.SGD(net.parameters(), lr=0.1) for net in (model, reference)]
    for seed in range(2):
        x, labels = torch.randn(3, 3, 5, 7, dtype=torch.float64), torch.randint(0, 5, (3,))
        for optimizer in optimizers:
            optimizer.zero_grad()
        torch.manual_seed(seed)
        compiled(x, labels).backward()
        torch.manual_seed(seed)
        F.cross_entropy(reference(x), labels).backward()
        for optimizer in optimizers:
            optimizer.step()
    assert max_difference(model.state_dict(), reference.state_dict()) <= 1e-12


class Upsampling(nn.Module):
    """A decoder's resampling as authors write it: bilinear by 2, and nearest by 1.5 (both autograd's
    kernels)."""

    def __init__(self):
        super().__init__()
        self.down, self.up = nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.Conv2d(4, 3, 3, padding=1)

    def forward(self, x):
        low = F.relu(self.down(x))
        up = F.interpolate(low, scale_factor=2, mode="bilinear", align_corners=False)
        return self.up(up), F.interpolate(low, scale_factor=1.5, mode="nearest")


def test_the_compiled_bound_model_trains_at_a_new_batch_and_size(tmp_path):
    """``torch.compile`` of a bound model whose batch or image size changes (the last, smaller batch;
    validation at another size) traces its step again at symbolic sizes, where the upsample backward
    kernels have no fake implementation (torch 2.13); the module's compiled path traces the same
    adjoint from ``F.interpolate``. Three steps at three shapes, ``dynamic=True`` as dynamo's second
    shape makes it, equal autograd's in float64."""
    torch.manual_seed(0)
    model = Upsampling().double()
    reference = copy.deepcopy(model)
    path = generated(tmp_path, trace(model, {"x": (2, 3, 8, 8)}, "parameters", "upsampling", mode="train"))
    compiled = torch.compile(symgrad.bind(path, model, verify=False), fullgraph=True, dynamic=True, backend="aot_eager")
    optimizers = [torch.optim.SGD(net.parameters(), lr=0.1) for net in (model, reference)]
    for shape in ((2, 3, 8, 8), (3, 3, 8, 8), (3, 3, 12, 10)):
        x = torch.randn(shape, dtype=torch.float64)
        for optimizer in optimizers:
            optimizer.zero_grad()
        for net in (compiled, reference):
            image, side = net(x)
            (F.mse_loss(image, x) + side.square().mean()).backward()
        assert (
            max_difference(
                {name: value.grad for name, value in model.named_parameters()},
                {name: value.grad for name, value in reference.named_parameters()},
            )
            <= 1e-12
        )
        for optimizer in optimizers:
            optimizer.step()
    assert max_difference(model.state_dict(), reference.state_dict()) <= 1e-12


class ConvNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)

    def forward(self, x):
        return F.relu(self.norm(self.conv(x)))


def test_the_compiled_bound_model_of_a_conv_and_batch_norm_trains_at_symbolic_sizes(tmp_path):
    """``torch.compile(..., dynamic=True)`` of a bound convolution and BatchNorm: the backward's layout
    rule and batch-norm backward trace at symbolic sizes (a version that read the caller's weights'
    layouts only at the end of the backward failed in dynamo, lifting BatchNorm's eps as a free
    variable of its root graph); two shapes, equal to autograd in float64, buffers included."""
    torch.manual_seed(0)
    model = ConvNorm().double()
    reference = copy.deepcopy(model)
    path = generated(tmp_path, trace(model, {"x": (2, 3, 8, 8)}, "parameters", "conv_norm", mode="train"))
    compiled = torch.compile(symgrad.bind(path, model, verify=False), fullgraph=True, dynamic=True, backend="aot_eager")
    for shape in ((2, 3, 8, 8), (3, 3, 10, 8)):
        x = torch.randn(shape, dtype=torch.float64)
        for net, parameters in ((compiled, model), (reference, reference)):
            parameters.zero_grad()
            net(x).square().mean().backward()
        assert (
            max_difference(
                {name: value.grad for name, value in model.named_parameters()},
                {name: value.grad for name, value in reference.named_parameters()},
            )
            <= 1e-12
        )
    assert max_difference(model.state_dict(), reference.state_dict()) <= 1e-12
    assert model.norm.num_batches_tracked.item() == 2


def test_under_bfloat16_autocast_the_bound_model_is_as_accurate_as_autograd(tmp_path):
    """The done-when model in float32 under CPU bfloat16 autocast: its gradients as close to the float64
    ones as autograd's under the same autocast (the same masks: one seed)."""
    torch.manual_seed(0)
    exact = AuxNet().double()
    text, evaluation = trace_modes(exact, {"x": (2, 3, 8, 8)}, "parameters", "auxnet_autocast")
    path = generated(tmp_path, text, evaluation)
    model, reference = copy.deepcopy(exact).float(), copy.deepcopy(exact).float()
    fast = symgrad.bind(path, model, verify=False)
    images, labels = torch.randn(4, 3, 10, 6, dtype=torch.float64), torch.randint(0, 5, (4,))

    def step(net, data):
        torch.manual_seed(3)
        logits, aux = net(data)
        (
            F.cross_entropy(logits.float(), labels, label_smoothing=0.1) + 0.4 * F.cross_entropy(aux.float(), labels)
        ).backward()

    step(exact, images)
    for net in (fast, reference):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            step(net, images.float())
    truth = [value.grad for value in exact.parameters()]
    norm = torch.cat([grad.flatten() for grad in truth]).norm().item()

    def error(net):
        return (
            torch.cat([(value.grad.double() - grad).flatten() for value, grad in zip(net.parameters(), truth)])
            .norm()
            .item()
            / norm
        )

    assert all(value.grad.dtype == torch.float32 for value in model.parameters())
    assert error(reference) > 1e-5, "autocast did not lower the precision: the comparison would prove nothing"
    assert error(model) <= 4 * error(reference) + 1e-3, (error(model), error(reference))


class ConvClassifier(nn.Module):
    """A stem and a classifier: convolution, BatchNorm, ReLU, pooling and a linear layer, each a kernel
    Inductor writes (or calls) for the bound model's forward and backward."""

    def __init__(self, channels=6, classes=5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU())
        self.fc = nn.Linear(channels, classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.stem(x), 1), 1))


def test_inductor_compiles_the_bound_model_and_its_steps_are_autograds(tmp_path):
    """``torch.compile(fast, fullgraph=True)`` on Inductor's own kernels (C++ for this CPU), float32: two SGD
    steps of the bound model as autograd's of the model, to float32's rounding (Inductor fuses and orders
    its reductions otherwise), statistics included. The benchmark's compiled ResNet-18 rows compile the same
    generated code at its size (tests/benchmarks/test_benchmarks.py checks their wiring on aot_eager)."""
    torch.manual_seed(0)
    model = ConvClassifier()
    reference = copy.deepcopy(model)
    path = generated(tmp_path, trace(model, {"x": (2, 3, 8, 8)}, "parameters", "conv_classifier", mode="train"))
    compiled = torch.compile(symgrad.bind(path, model, verify=False), fullgraph=True)
    optimizers = [torch.optim.SGD(net.parameters(), lr=0.1) for net in (model, reference)]
    for _ in range(2):
        images, labels = torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))
        losses = []
        for net, optimizer in zip((compiled, reference), optimizers):
            optimizer.zero_grad()
            loss = F.cross_entropy(net(images), labels)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        assert abs(losses[0] - losses[1]) <= 1e-5 * abs(losses[1]), losses
    assert max_difference(model.state_dict(), reference.state_dict()) <= 1e-4
