"""An activation whose recompute costs about as much as its backward kernel (SiLU: an exp per element,
``Primitive.costly_to_recompute``) is kept by ``--keep all``, as autograd keeps it, and computed again in
the backward only under ``--keep lean``. GELU stays recomputed under both (tests/pipeline/test_plan.py).
EfficientNet-B0's stages at 8 x 112² under AMP, one thread's CPU time: 0.93x autograd's step recomputing
twelve SiLU outputs, 0.98x keeping them (kept 16.6 -> 23.1 MiB; lean's 9.9 unchanged)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import yaml

from symgrad.check import module_from_source
from symgrad.pipeline import build_text

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
