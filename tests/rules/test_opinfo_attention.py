"""PyTorch's own OpInfo samples of ``F.scaled_dot_product_attention``, through symgrad's fused derivation.

Each sample that fits the rule's arguments (``dropout_p`` 0; query, key and value of one rank: the rule does
not broadcast batch dims) is a one-layer spec; ``gradients`` (the fused derivation: on these 4-d float64
tensors the CPU flash kernels, ``rules/attention_fused.py``; 3-d ones and a mask the readable formula) is
compared with ``torch.autograd.grad`` on the sample's own tensors with a random cotangent. The samples left out
are counted by reason: a reason not listed fails, so coverage cannot shrink silently.
"""

from __future__ import annotations

import pytest
import torch
import yaml

from symgrad.check import module_from_source, relative_error
from symgrad.pipeline import build_text

op_db = pytest.importorskip("torch.testing._internal.common_methods_invocations").op_db

NAME = "nn.functional.scaled_dot_product_attention"


def _samples():
    info = next(info for info in op_db if info.name == NAME)
    return list(info.sample_inputs("cpu", torch.float64, requires_grad=True))


def _left_out(sample) -> str | None:
    key, value = sample.args[:2]
    if sample.kwargs.get("dropout_p", 0.0):
        return "dropout"  # traced as three layers (rules/attention_probabilities.py), not this op's argument
    if not (sample.input.dim() == key.dim() == value.dim()):
        return "ranks differ"
    return None


@pytest.mark.parametrize("index", range(len(_samples())))
def test_opinfo_sample_matches_autograd(index):
    sample = _samples()[index]
    reason = _left_out(sample)
    if reason is not None:
        assert reason in ("dropout", "ranks differ")
        pytest.skip(reason)
    key, value = sample.args[:2]
    mask = sample.kwargs.get("attn_mask")
    values = {"q": sample.input, "k": key, "v": value, **({"m": mask} if mask is not None else {})}
    causal = bool(sample.kwargs.get("is_causal", False))
    out = torch.nn.functional.scaled_dot_product_attention(sample.input, key, value, attn_mask=mask, is_causal=causal)
    layer = {"op": "scaled_dot_product_attention", "in": ["q", "k", "v"], "is_causal": causal, "out": "out"}
    if mask is not None:
        layer["attn_mask"] = "m"
    text = yaml.safe_dump(
        {
            "name": "opinfo_case",
            "inputs": {
                **{name: {"shape": list(tensor.shape)} for name, tensor in values.items()},
                "y": {"shape": list(out.shape)},
            },
            "layers": [layer],
            "loss": {"op": "half_sq_error", "target": "y"},
            "wrt": list(values),
        },
        sort_keys=False,
    )
    module = module_from_source(
        build_text(text, f"opinfo-attention-{index}.yaml").rendered.files["opinfo_case.py"], "opinfo_case"
    )
    cotangent = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(index))
    expected = torch.autograd.grad(out, list(values.values()), cotangent)
    target = (out - cotangent).detach()  # residual = out - y = cotangent: the module's adjoint of it
    actual = module.gradients(**{name: tensor.detach() for name, tensor in values.items()}, y=target)
    for name, reference in zip(values, expected):
        assert relative_error(getattr(actual, name), reference) <= 1e-12, (index, name, sample.kwargs)


def test_the_fused_kernels_are_among_the_samples():
    fitting = [sample for sample in _samples() if _left_out(sample) is None]
    assert sum(sample.input.dim() == 4 and "attn_mask" not in sample.kwargs for sample in fitting) >= 2
