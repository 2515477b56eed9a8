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
