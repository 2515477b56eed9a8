"""Constants at full precision (issue 38, item 7): a trace of a float32 model records each constant as
the Python code wrote it, not as float32 holds it, so the float64 gradients of the generated module
match the model's (made float64) to rounding."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from symgrad.check import by_name, module_from_source, relative_error
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace
from symgrad.trace.run_once import source_name
from tests.helpers import load_yaml


class ResBlock(nn.Module):
    def __init__(self, nc):
        super().__init__()
        self.res = nn.Sequential(
            nn.Conv2d(nc, nc, 3, 1, 1, bias=False), nn.ReLU(inplace=True), nn.Conv2d(nc, nc, 3, 1, 1, bias=False)
        )

    def forward(self, x):
        return x + self.res(x)


class DRUNet(nn.Module):
    """DRUNet as its users call it for one noise level: the level as a map concatenated to the input,
    a residual body scaled by a number."""

    def __init__(self, in_nc=3, nc=4, noise_level=0.1):
        super().__init__()
        self.noise_level = noise_level
        self.m_head = nn.Conv2d(in_nc + 1, nc, 3, 1, 1, bias=False)
        self.m_body = ResBlock(nc)
        self.m_tail = nn.Conv2d(nc, in_nc, 3, 1, 1, bias=False)

    def forward(self, x):
        noise_map = torch.full_like(x[:, :1], self.noise_level)
        h = self.m_head(torch.cat((x, noise_map), dim=1))
        h = self.m_body(h) * 0.1 + h
        level = torch.ones_like(x) * 0.3  # another spelling: ones times a number
        return self.m_tail(h) + x * level


def test_a_float32_trace_records_constants_as_written_and_float64_gradients_match_the_model():
    torch.manual_seed(0)
    model = DRUNet()  # float32, as models are
    text = trace(model, {"x": (2, 3, 8, 8)}, loss=LossChoice("mse_loss"))
    layers = load_yaml(text)["layers"]
    assert [layer["fill_value"] for layer in layers if layer["op"] == "full"] == [0.1], text
    assert {"op": "mul", "in": "x", "other": 0.3, "out": "mul_2"} in layers, text
    built = build_text(text, "drunet.yaml")
    module = by_name(
        module_from_source(built.rendered.files[f"{built.rendered.name}.py"], built.rendered.name), built.graph
    )  # the parameters go in `params`: called here by their spec names
    model = model.double()
    spec = load_yaml(text)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 3, 10, 6, dtype=torch.float64, generator=generator, requires_grad=True)
    target = torch.randn(3, 3, 10, 6, dtype=torch.float64, generator=generator)
    named = {source_name("", key, model): value for key, value in model.named_parameters()}
    arguments = {key: {"x": x, "target": target}.get(key, named.get(key)) for key in spec["inputs"]}
    expected = torch.autograd.grad(F.mse_loss(model(x), target), [arguments[key] for key in spec["wrt"]])
    actual = module.gradients(**{key: value.detach() for key, value in arguments.items()})
    for key, reference in zip(spec["wrt"], expected):
        assert relative_error(getattr(actual, key), reference) <= 1e-12, key
