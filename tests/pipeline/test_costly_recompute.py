"""An activation whose recompute costs about as much as its backward kernel (SiLU: an exp per element,
``Primitive.costly_to_recompute``) is kept by ``--keep all``, as autograd keeps it, and computed again in
the backward only under ``--keep lean``. GELU stays recomputed under both (tests/pipeline/test_plan.py).
EfficientNet-B0's stages at 8 x 112² under AMP, one thread's CPU time: 0.93x autograd's step recomputing
twelve SiLU outputs, 0.98x keeping them (kept 16.6 -> 23.1 MiB; lean's 9.9 unchanged)."""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

import symgrad
from symgrad.check import module_from_source
from symgrad.pipeline import build_text
from symgrad.trace import trace
from tests.helpers import parameter_gradients

SILU_BETWEEN_CONVOLUTIONS = """name: silu_between
inputs:
  x: {shape: [2, 3, 6, 6]}
  w1: {shape: [8, 3, 3, 3]}
  w2: {shape: [8, 1, 3, 3]}
  t: {shape: [2, 8, 6, 6]}
layers:
  - {op: conv2d, in: x, weight: w1, padding: 1, out: c1}
  - {op: silu, in: c1, out: s1}
  - {op: conv2d, in: s1, weight: w2, padding: 1, groups: 8, out: c2}
loss: {op: mse_loss, target: t}
wrt: [x, w1, w2]
"""


@pytest.mark.parametrize("keep", ["all", "lean"])
def test_silu_is_kept_by_keep_all_and_computed_again_by_keep_lean(keep):
    source = build_text(SILU_BETWEEN_CONVOLUTIONS, "silu_between.yaml", keep=keep).rendered.files["silu_between.py"]
    backward = source[source.index("def _backward_from_saved(") : source.index("class ExplicitGradient")]
    unpacked = backward[: backward.index("= saved")]
    again = "\n    s1 = F.silu(c1)" in backward
    assert again == (keep == "lean"), backward
    assert ("s1" in unpacked) == (keep == "all") and "c1" in unpacked, unpacked
    module = module_from_source(source, "silu_between")
    generator = torch.Generator().manual_seed(0)
    shapes = {name: entry["shape"] for name, entry in yaml.safe_load(SILU_BETWEEN_CONVOLUTIONS)["inputs"].items()}
    inputs = {name: torch.randn(shape, generator=generator, dtype=torch.float64) for name, shape in shapes.items()}
    got = module.gradients(**inputs)
    x, w1, w2, t = (value.clone().requires_grad_(name != "t") for name, value in inputs.items())
    loss = F.mse_loss(F.conv2d(F.silu(F.conv2d(x, w1, padding=1)), w2, padding=1, groups=8), t)
    for name, reference in zip(("x", "w1", "w2"), torch.autograd.grad(loss, [x, w1, w2])):
        assert (getattr(got, name) - reference).abs().max() <= 1e-12 * reference.abs().max(), name


class WideThenNarrow(nn.Module):
    """MBConv's pattern: conv -> BN -> SiLU (the widest value) -> depthwise conv, stride 2 -> BN -> SiLU
    (a quarter of its elements) -> 1x1 conv."""

    def __init__(self):
        super().__init__()
        self.expand, self.bn1 = nn.Conv2d(2, 4, 1, bias=False), nn.BatchNorm2d(4)
        self.depthwise = nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=4, bias=False)
        self.bn2, self.project = nn.BatchNorm2d(4), nn.Conv2d(4, 3, 1)

    def forward(self, x):
        wide = F.silu(self.bn1(self.expand(x)))
        return self.project(F.silu(self.bn2(self.depthwise(wide))))


def _wide_then_narrow(keep: str):
    torch.manual_seed(0)
    text = trace(WideThenNarrow().train(), {"x": (2, 2, 6, 6)}, wrt="parameters", name="wide", mode="train")
    source = build_text(text, "wide.yaml", documents=False, tests=False, keep=keep).rendered.files["wide.py"]
    return source, module_from_source(source, f"wide_{keep}")


def test_keep_lean_makes_again_the_widest_silu_output_and_keeps_a_small_one():
    """``rematerialize.costly_made_again``: the SiLU output as wide as the widest value the backward reads
    is made again (with its batch norm's output, from the convolution's output and the batch statistics);
    the one of a quarter of its elements, after the stride-2 depthwise convolution, is kept, as ``--keep
    all`` keeps it (its batch norm's output, which silu_backward reads, is still made again). Gradients:
    autograd's in float64 at another batch and size; under bfloat16 autocast ``--keep all``'s bit for bit."""
    source, lean = _wide_then_narrow("lean")
    start = source.index("def _backward_from_saved(")
    backward = source[start : re.search(r"\n(def|class) ", source[start + 1 :]).start() + start + 1]
    unpacked = backward[: backward.index("= saved")]
    wide, narrow = re.findall(r"(\w+) = F\.silu\((\w+)\)", source[: source.index("def _backward_from_saved(")])[:2]
    names = set(re.findall(r"\w+", unpacked))
    assert f"\n    {wide[0]} = F.silu({wide[1]})" in backward and wide[0] not in names, backward
    assert f"\n    {narrow[0]} = F.silu(" not in backward and narrow[0] in names, backward
    assert f"\n    {narrow[1]} = _batch_norm_again(" in backward and narrow[1] not in names, backward
    torch.manual_seed(1)
    _gradients_are_autograds(WideThenNarrow().train().double(), lean, torch.randn(3, 2, 8, 8, dtype=torch.float64))
    model, x, grads = WideThenNarrow().train(), torch.randn(4, 2, 10, 10), []
    for module in (lean, _wide_then_narrow("all")[1]):
        net = copy.deepcopy(model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = symgrad.bind(module, net)(x)
        out.float().square().sum().backward()
        grads.append({key: value.grad for key, value in net.named_parameters()})
    assert all(torch.equal(grads[0][key], grads[1][key]) for key in grads[1])


class Expanding(nn.Module):
    def __init__(self, channels: int, expanded: int):
        super().__init__()
        self.up, self.bn = nn.Conv2d(channels, expanded, 1, bias=False), nn.BatchNorm2d(expanded)
        self.down = nn.Conv2d(expanded, channels, 3, padding=1)

    def forward(self, x):
        return x + self.down(F.silu(self.bn(self.up(x))))


class WideStemThenBlocks(nn.Module):
    """A stem whose output is the widest value (8 channels), then three instances of one block of 2
    channels: their SiLU outputs a quarter of it in every instance."""

    def __init__(self, stem: int = 8):
        super().__init__()
        self.stem, self.bn = nn.Conv2d(2, stem, 3, padding=1), nn.BatchNorm2d(stem)
        self.down = nn.Conv2d(stem, 2, 1)
        self.blocks = nn.Sequential(Expanding(2, 2), Expanding(2, 2), Expanding(2, 2))

    def forward(self, x):
        return self.blocks(self.down(F.silu(self.bn(self.stem(x)))))


@pytest.mark.parametrize("stem", [8, 2])
def test_a_block_body_keeps_a_silu_output_small_in_every_instance_as_the_flat_module_does(stem):
    """In a block's body (``trace(..., blocks=True)``, the CLI's default) ``--keep lean`` chooses from the
    block's largest instance beside the network's largest value (``body_graphs.instance_sizes``), as the
    flat module chooses per layer: with a stem 4x as wide as the blocks, their SiLU outputs are kept in
    the blocks form and in the flat form alike; with a stem as narrow, made again in both. Gradients:
    autograd's through the original module in float64 at another batch and size."""
    torch.manual_seed(0)
    model = WideStemThenBlocks(stem).train().double()
    sources = {}
    for blocks in (True, False):
        text = trace(model, {"x": (2, 2, 6, 6)}, wrt="parameters", name="stemmed", mode="train", blocks=blocks)
        assert ("\nblocks:\n" in text) == blocks
        built = build_text(text, "stemmed.yaml", documents=False, tests=False, keep="lean")
        sources[blocks] = built.rendered.files["stemmed.py"]
    body = sources[True][sources[True].index("_backward(saved, grad_output)") :]
    body = body[: body.index("\ndef ")]
    made_again_in_block = re.search(r"\n    \w+ = F\.silu\(", body) is not None  # a statement, not a comment
    flat = sources[False][sources[False].index("def _backward_from_saved(") :]
    made_again_flat = len(re.findall(r"\n    blocks_\d_\w* = F\.silu\(", flat))
    assert made_again_in_block == (stem == 2) and made_again_flat == (3 if stem == 2 else 0), (body, flat)
    module = module_from_source(sources[True], f"stemmed_{stem}")
    _gradients_are_autograds(model, module, torch.randn(3, 2, 7, 5, dtype=torch.float64))


def _gradients_are_autograds(model: nn.Module, module, x: torch.Tensor) -> None:
    """``module.gradients`` (outputs' form) of ``model``'s parameters at ``x``: autograd's through ``model`` in
    float64, with a random cotangent, within 1e-12."""
    for key, got, reference in parameter_gradients(model, module, x):
        assert (got - reference).abs().max() <= 1e-12 * max(1.0, reference.abs().max().item()), key


class NarrowStemThenExpanding(nn.Module):
    """EfficientNet's shape: a stem narrower than the expansion inside its blocks."""

    def __init__(self):
        super().__init__()
        self.stem, self.bn = nn.Conv2d(2, 2, 3, padding=1), nn.BatchNorm2d(2)
        self.mix = nn.Conv2d(2, 2, 3, padding=1)
        self.blocks = nn.Sequential(Expanding(2, 8), Expanding(2, 8), Expanding(2, 8))

    def forward(self, x):
        return self.blocks(self.mix(F.silu(self.bn(self.stem(x)))))


def test_the_top_body_of_the_blocks_form_judges_a_silu_output_beside_the_networks_largest():
    """The blocks form's top body sees each instance as one call, which hides the expansions inside: it is
    planned beside the network's largest value (``body_graphs.top_sizes``), so the stem's SiLU output, a
    quarter of an expansion's, is kept as the flat module keeps it, and the expansions' are made again."""
    torch.manual_seed(0)
    model = NarrowStemThenExpanding().train().double()
    again = {}
    for blocks in (True, False):
        text = trace(model, {"x": (2, 2, 6, 6)}, wrt="parameters", name="narrow", mode="train", blocks=blocks)
        source = build_text(text, "narrow.yaml", documents=False, tests=False, keep="lean").rendered.files["narrow.py"]
        top = source[source.index("def _backward_from_saved(") :]
        again[blocks] = re.findall(r"\n    (\w+) = F\.silu\(", top), source
    assert again[True][0] == [] and sorted(again[False][0]) == ["blocks_0_silu", "blocks_1_silu", "blocks_2_silu"]
    block_backward = again[True][1][again[True][1].index("def expanding_backward(") :]
    assert re.search(r"\n    silu = F\.silu\(", block_backward)  # the expansion's, made again in its block
    _gradients_are_autograds(
        model, module_from_source(again[True][1], "narrow_blocks"), torch.randn(3, 2, 7, 5).double()
    )
