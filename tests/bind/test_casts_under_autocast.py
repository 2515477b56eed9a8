"""A bound ResNet step under bfloat16 autocast casts no floating-point tensor more often than autograd's step
(``python -m benchmarks.casts`` lists each cast by the generated line that makes it).

Beyond autograd's casts ``--keep all`` makes five, each of them kept memory's price (symgrad/kept.py) or a
0-dim count: a byte mask of the two ReLU outputs whose own pullback alone reads them (``relu.bool()``: the
stem's before the max pool, the last block's before the global pool), the max pool's indices narrowed to
int16 and widened again for its backward kernel (two), and nll_loss's count of targets
(``_cross_entropy_backward``'s ``total``, which autograd's kernel keeps from the forward). The input image
was cast twice (by the forward's convolution and again by the first weight gradient's
``_convolution_backward``): the saving forward now keeps the copy as autograd keeps autocast's
(symgrad/kept_casts.py)."""

from __future__ import annotations

import collections
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import symgrad
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace
from tests.models.classic import BasicBlock

KEPT_MEMORYS_PRICE = 5
"""Two ReLU masks, the max pool's indices narrowed and widened, nll_loss's count (the module's docstring)."""


class Stemmed(nn.Module):
    """An ImageNet ResNet's stem (7x7 stride-2 convolution, batch norm, ReLU, max pool), a BasicBlock that
    keeps the width and one that doubles it, the global pool and a linear classifier."""

    def __init__(self, width: int = 16, classes: int = 5):  # 16: see symgrad/roles.FEWEST_CHANNELS_STRIDED_1X1
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = nn.Sequential(BasicBlock(width, width), BasicBlock(width, 2 * width, stride=2))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = self.layer1(self.maxpool(self.relu(self.bn1(self.conv1(x)))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class Casts(TorchDispatchMode):
    """Each ``_to_copy`` and ``copy_`` with data (not ``.to("meta")``), as floating point to floating point
    or other (to bool, between integer dtypes, an integer count to float)."""

    def __init__(self):
        super().__init__()
        self.found = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name == "_to_copy" and str(kwargs.get("device", "")) != "meta":
            source, target = args[0].dtype, kwargs.get("dtype", args[0].dtype)
        elif name == "copy_":
            source, target = args[1].dtype, args[0].dtype
        else:
            return func(*args, **kwargs)
        self.found["floating" if source.is_floating_point and target.is_floating_point else "other"] += 1
        return func(*args, **kwargs)


def test_a_bound_resnet_step_under_autocast_casts_no_more_than_autograds(tmp_path):
    """In the default layout the bound step casts no more than autograd (one more before: the image, cast again
    for the stem's weight gradient); in channels_last, where autograd makes one cast more of its own, the bound
    step makes as many as in the default layout (a bound count judged against autograd's channels_last alone
    held before the change too)."""
    default, _ = _step_casts(tmp_path / "default", torch.contiguous_format)
    channels_last, _ = _step_casts(tmp_path / "channels_last", torch.channels_last)
    assert channels_last == default, (channels_last, default)


def _step_casts(folder, layout) -> tuple[dict, dict]:
    """The bound step's and autograd's casts (floating / other) of one AMP step in ``layout``, after checking the
    loss and every gradient are autograd's bit for bit and the bound step casts no more than autograd."""
    folder.mkdir()
    tmp_path = folder
    torch.manual_seed(0)
    model = Stemmed().train()
    text = trace(
        model, {"x": (2, 3, 32, 32)}, wrt="parameters", name="net", loss=LossChoice("cross_entropy"), mode="train"
    )
    (tmp_path / "net.py").write_text(
        build_text(text, "net.yaml", documents=False, tests=False, keep="all").rendered.files["net.py"]
    )
    generator = torch.Generator().manual_seed(1)
    x, target = torch.randn(3, 3, 40, 40, generator=generator), torch.randint(0, 5, (3,), generator=generator)
    reference, ours = (copy.deepcopy(model).to(memory_format=layout) for _ in range(2))
    bound = symgrad.bind(tmp_path / "net.py", ours)
    data = {"x": x.contiguous(memory_format=layout), "target": target}
    eager, mine = Casts(), Casts()
    with eager, torch.autocast("cpu", dtype=torch.bfloat16):
        expected = F.cross_entropy(reference(data["x"]), target)
        expected.backward()
    with mine, torch.autocast("cpu", dtype=torch.bfloat16):
        loss = bound(**data)
        loss.backward()
    assert torch.equal(loss, expected)
    for (path, got), theirs in zip(ours.named_parameters(), reference.parameters()):
        assert torch.equal(got.grad, theirs.grad), path
    assert eager.found["other"] == 0
    assert mine.found["floating"] <= eager.found["floating"], (mine.found, eager.found)  # one more before
    assert sum(mine.found.values()) <= sum(eager.found.values()) + KEPT_MEMORYS_PRICE, (mine.found, eager.found)
    return dict(mine.found), dict(eager.found)


class PreNorm(nn.Module):
    """A transformer's pre-norm MLP block on embedded tokens, its final layer norm and a head on token 0:
    each layer norm's output read by a linear map, float32 under autocast, as its input is (the float32
    position embedding's add promotes the embedding's bfloat16 output, as a ViT's does)."""

    def __init__(self, features: int = 8, width: int = 16, classes: int = 5):
        super().__init__()
        self.embed = nn.Linear(features, width)
        self.position = nn.Parameter(0.1 * torch.randn(width))
        self.norm1 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        h = self.embed(x) + self.position
        h = h + self.fc2(F.gelu(self.fc1(self.norm1(h))))
        return self.head(self.norm(h)[:, 0])


def test_a_layer_norms_output_read_by_a_linear_map_is_cast_once_under_autocast(tmp_path):
    """autocast casts ``norm1``'s and ``norm``'s outputs (and ``x``) where the linear maps read them; the
    bound step kept them in float32 and cast each again for its weight's gradient: 3 casts more than
    autograd's before (symgrad/kept_casts.py). Gradients autograd's bit for bit under autocast and in
    float32, within 1e-12 in float64, at another batch and length."""
    torch.manual_seed(0)
    model = PreNorm().train()
    text = trace(model, {"x": (2, 5, 8)}, wrt="parameters", name="net", loss=LossChoice("cross_entropy"))
    source = build_text(text, "net.yaml", documents=False, tests=False, keep="all").rendered.files["net.py"]
    assert "norm1_autocast = _in_autocast_dtype(norm1)" in source, source
    (tmp_path / "net.py").write_text(source)
    generator = torch.Generator().manual_seed(1)
    x, target = torch.randn(3, 7, 8, generator=generator), torch.randint(0, 5, (3,), generator=generator)
    for dtype, amp in ((torch.float32, True), (torch.float32, False), (torch.float64, False)):
        reference, ours = (copy.deepcopy(model).to(dtype) for _ in range(2))
        bound = symgrad.bind(tmp_path / "net.py", ours)
        eager, mine = Casts(), Casts()
        with eager, torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            expected = F.cross_entropy(reference(x.to(dtype)), target)
            expected.backward()
        with mine, torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = bound(x=x.to(dtype), target=target)
            loss.backward()
        for (path, got), theirs in zip(ours.named_parameters(), reference.parameters()):
            assert got.grad.dtype == theirs.grad.dtype, (dtype, amp, path)
            if dtype == torch.float64:
                assert (got.grad - theirs.grad).abs().max() <= 1e-12 * theirs.grad.abs().max(), path
            else:
                assert torch.equal(got.grad, theirs.grad), (amp, path)
        assert mine.found["floating"] <= eager.found["floating"], (amp, mine.found, eager.found)  # 3 more before
        assert mine.found["other"] <= 1, mine.found  # nll_loss's count of targets


class ConvNeXtBlock(nn.Module):
    """A ConvNeXt block: a depthwise 7x7 convolution, a layer norm over channels last, a linear map, GELU, a
    linear map, a float32 layer scale (``gamma``) and the block's input added back."""

    def __init__(self, width: int):
        super().__init__()
        self.dwconv = nn.Conv2d(width, width, 7, padding=3, groups=width)
        self.norm = nn.LayerNorm(width)
        self.pwconv1 = nn.Linear(width, 4 * width)
        self.pwconv2 = nn.Linear(4 * width, width)
        self.gamma = nn.Parameter(0.5 + torch.rand(width))

    def forward(self, x):
        h = self.norm(self.dwconv(x).permute(0, 2, 3, 1))
        h = self.gamma * self.pwconv2(F.gelu(self.pwconv1(h)))
        return x + h.permute(0, 3, 1, 2)


class ConvNeXtStyle(nn.Module):
    """A patchifying stem (bfloat16 under autocast), three ConvNeXt blocks and a head on the mean over the
    image: the float32 layer scale promotes each block's output to float32 under autocast, and the next
    block's depthwise convolution reads it (the residual stream, twice here)."""

    def __init__(self, width: int = 16, classes: int = 5):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 2, stride=2)
        self.position = nn.Parameter(0.1 * torch.randn(width, 1, 1))
        self.blocks = nn.Sequential(*(ConvNeXtBlock(width) for _ in range(3)))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x) + self.position).mean((2, 3)))


def test_a_convnext_blocks_float32_residual_stream_is_cast_once_under_autocast(tmp_path):
    """autocast casts the residual stream (float32: the layer scale's product) where the next block's
    depthwise convolution reads it, and autograd keeps that copy alone; the bound step kept a copy made
    again at its last forward use (``_saved_as_autocast_casts``): 4 casts more than autograd's before
    (symgrad/kept_casts.py). The backward reads the kept copy and dtype, not the float32 value. Gradients
    autograd's bit for bit under autocast and in float32, within 1e-12 in float64, at another batch and
    size; the layer scales' within 1e-5 in float32 and under autocast, the same bits as before the change
    (the bound product ``pwconv2 * grad`` is laid out as ``pwconv2``, autograd's ``grad * pwconv2`` as the
    gradient, a permuted one: the sum over the batch and image adds in another order).
    The stem's output is added to a float32 parameter so that the first block's input is float32 too (a
    bfloat16 one, read by the add and the depthwise convolution, gets the two gradients summed in float32
    and cast once, where autograd casts the add's first and sums in bfloat16: the stem's gradients differ
    from autograd's by bfloat16's rounding, before and after this change)."""
    torch.manual_seed(0)
    model = ConvNeXtStyle().train()
    text = trace(model, {"x": (2, 3, 16, 16)}, wrt="parameters", name="net", loss=LossChoice("cross_entropy"))
    source = build_text(text, "net.yaml", documents=False, tests=False, keep="all").rendered.files["net.py"]
    assert "blocks_0_add_autocast = _in_autocast_dtype(blocks_0_add)" in source, source
    (tmp_path / "net.py").write_text(source)
    generator = torch.Generator().manual_seed(1)
    x, target = torch.randn(3, 3, 20, 20, generator=generator), torch.randint(0, 5, (3,), generator=generator)
    for dtype, amp in ((torch.float32, True), (torch.float32, False), (torch.float64, False)):
        reference, ours = (copy.deepcopy(model).to(dtype) for _ in range(2))
        bound = symgrad.bind(tmp_path / "net.py", ours)
        eager, mine = Casts(), Casts()
        with eager, torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            expected = F.cross_entropy(reference(x.to(dtype)), target)
            expected.backward()
        with mine, torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = bound(x=x.to(dtype), target=target)
            loss.backward()
        assert loss.dtype == expected.dtype and (dtype == torch.float64 or torch.equal(loss, expected)), amp
        for (path, got), theirs in zip(ours.named_parameters(), reference.parameters()):
            assert got.grad.dtype == theirs.grad.dtype, (dtype, amp, path)
            if dtype == torch.float64:
                assert (got.grad - theirs.grad).abs().max() <= 1e-12 * theirs.grad.abs().max(), path
            elif path.endswith("gamma"):  # the last bits, as before the change: see the docstring
                assert (got.grad - theirs.grad).abs().max() <= 1e-5 * theirs.grad.abs().max(), path
            else:
                assert torch.equal(got.grad, theirs.grad), (amp, path)
        assert mine.found["floating"] <= eager.found["floating"], (amp, mine.found, eager.found)  # 4 more before
        assert mine.found["other"] <= 1, mine.found  # nll_loss's count of targets


class Upsampled(nn.Module):
    """A transposed convolution on the image, ReLU and a convolution."""

    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(3, 8, 2, stride=2)
        self.conv = nn.Conv2d(8, 3, 3, padding=1)

    def forward(self, x):
        return self.conv(F.relu(self.up(x)))


class AddedBack(nn.Module):
    """A convolution of the image with the image added back (``conv(x) + x``)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x):
        return self.conv(x) + x


@pytest.mark.parametrize("make", [Upsampled, AddedBack])
def test_an_image_a_transposed_convolution_or_an_add_reads_too_is_cast_once_under_autocast(make, tmp_path):
    """The image is cast once, where the (transposed) convolution reads it, and the copy kept: the bound
    step cast it again for the weight's gradient (a transposed convolution's weight too: one cast more than
    autograd's before, each). Gradients autograd's bit for bit under autocast."""
    torch.manual_seed(0)
    model = make()
    text = trace(model, {"x": (2, 3, 6, 6)}, wrt="parameters", name="net", loss=LossChoice("mse_loss", "target"))
    source = build_text(text, "net.yaml", documents=False, tests=False, keep="all").rendered.files["net.py"]
    (tmp_path / "net.py").write_text(source)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 3, 8, 10, generator=generator)
    target = torch.randn_like(model(x))
    reference, ours = copy.deepcopy(model), copy.deepcopy(model)
    bound = symgrad.bind(tmp_path / "net.py", ours)
    eager, mine = Casts(), Casts()
    with eager, torch.autocast("cpu", dtype=torch.bfloat16):
        F.mse_loss(reference(x), target).backward()
    with mine, torch.autocast("cpu", dtype=torch.bfloat16):
        bound(x=x, target=target).backward()
    for (path, got), theirs in zip(ours.named_parameters(), reference.parameters()):
        assert got.grad.dtype == theirs.grad.dtype and torch.equal(got.grad, theirs.grad), path
    assert mine.found["floating"] <= eager.found["floating"], (mine.found, eager.found)  # one more before
