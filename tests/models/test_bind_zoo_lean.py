"""The bind zoo's training steps generated with ``--keep lean`` (issue 65 item 1: each batch norm's or
layer norm's output a weight gradient reads made again in the backward, ``symgrad/rematerialize.py``) train
as autograd in float64, as ``tests/models/test_bind_zoo.py`` checks the default ``--keep all``: a few
representative networks in CI (a ResNet, a U-Net, a ConvNeXt, an EfficientNet, a ViT, a GroupNorm diffusion
U-Net); ``SYMGRAD_LEAN_ZOO=all`` runs every network of the zoo (a one-off run, minutes)."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.nn.functional as F

import symgrad
from symgrad.check import module_from_source
from symgrad.pipeline import build_text
from symgrad.rematerialize import COMMENT
from tests.models.built_once import once
from tests.models.test_bind_zoo import CASES, assert_trained_as_autograd, traced_step

REPRESENTATIVE = {
    "models:resnet18": True,
    "models:unet_bilinear": True,
    "zoo:convnext_t": True,
    "zoo_nets:efficientnet_b0": True,
    "zoo_attention:vit_fused": True,
    "zoo_modern:diffusion_unet": True,
}
"""{label: whether its lean module makes some value again}: each kind of network lean is for."""
LABELS = list(CASES) if os.environ.get("SYMGRAD_LEAN_ZOO") == "all" else list(REPRESENTATIVE)


def lean_source(text: str) -> str:
    """The module generated from spec ``text`` with ``--keep lean``, built once a run."""
    return once(
        ("lean module", text),
        lambda: build_text(text, "step.yaml", documents=False, tests=False, keep="lean").rendered.files["step.py"],
    )


@pytest.mark.parametrize("label", LABELS)
def test_a_lean_step_trains_as_autograd_in_float64(label):
    model, _, kind, inputs, target_name, target = traced_step(label)
    source = lean_source(once(("bind_zoo step", label), _traced_already))  # the text traced_step traced
    if label in REPRESENTATIVE:
        assert (COMMENT in source) == REPRESENTATIVE[label]
    lean = module_from_source(source, "step")
    reference, moved = copy.deepcopy(model), copy.deepcopy(model)
    step = symgrad.bind(lean, model)
    with torch.no_grad():
        torch.manual_seed(7)  # the same dropout masks in every run below
        moved(*inputs.values())  # one forward, no graph: the statistics one training step moves
    torch.manual_seed(7)
    step(**inputs, **{target_name: target}).backward()
    torch.manual_seed(7)
    getattr(F, kind)(reference(*inputs.values()), target).backward()
    assert_trained_as_autograd(model, reference, moved)


def _traced_already() -> str:
    raise AssertionError("traced_step keeps its text under ('bind_zoo step', label)")
