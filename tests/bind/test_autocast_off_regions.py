"""A model's own ``with torch.autocast("cpu", enabled=False):`` (a rotary embedding's cos and sin kept in float32,
as LLaMA-style code and many attention implementations write it) traces where the region is a no-op for the trace
(no autocast on while tracing): the spec's guards name the region's file:line, float32 and float64 training equal
autograd through the original module, and a bound step called under the caller's autocast, where the model runs
the region in its own precision and the explicit step would run it in bfloat16, is refused in one line naming the
region, before anything moves; the fix it prints (call the step outside autocast) gives autograd's step again.
Before, the trace refused any such region, so such a model could not be trained in float32 either.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import symgrad
from symgrad.binding import BindError
from symgrad.errors import SpecError
from symgrad.pipeline import build_text
from symgrad.spec import parse_spec
from symgrad.trace import LossChoice, trace
from tests.models.compare import bound_steps_match_autograd


class Rotary(nn.Module):
    """A query rotated by cos and sin of frequencies computed in float32 whatever the caller's autocast."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.freq = nn.Parameter(torch.randn(8, 16) * 0.3)
        self.q = nn.Linear(16, 16)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        h = self.inp(x)
        with torch.autocast("cpu", enabled=False):  # the region the guards name
            freqs = F.linear(h.to(self.freq.dtype), self.freq)
            cos, sin = freqs.cos(), freqs.sin()
        q1, q2 = self.q(h).chunk(2, -1)
        rotated = torch.cat((q1 * cos - q2 * sin, q2 * cos + q1 * sin), -1)
        return self.head(rotated.mean(1))


REGION = f"{__file__}:{next(i for i, t in enumerate(open(__file__), 1) if '# the region the guards name' in t)}"


def _generated(tmp_path, model, **options):
    text = trace(model, {"x": (2, 6, 8)}, name="rotary", wrt="parameters", **options)
    source = build_text(text, "rotary.yaml", documents=False, tests=False).rendered.files["rotary.py"]
    (tmp_path / "rotary.py").write_text(source)
    return tmp_path / "rotary.py", text


def _batch(dtype):
    def batch(generator):
        x = torch.randn(3, 9, 8, generator=generator, dtype=dtype)  # another batch and length than traced
        return {"x": x}, torch.randint(0, 5, (3,), generator=generator)

    return batch


def test_the_region_traces_and_trains_equal_to_autograd_outside_autocast(tmp_path):
    """Failed before: refused at trace ("turns autocast off for its own region"). Three SGD steps in float32 give
    autograd's loss and gradients bit for bit, and in float64 within 1e-12, at another batch and length."""
    torch.manual_seed(0)
    model = Rotary().train()
    path, text = _generated(tmp_path, model, loss=LossChoice("cross_entropy"))
    assert f'  autocast:\n    "{REGION}": cpu\n' in text, text[text.index("guards:") :]
    bound_steps_match_autograd(copy.deepcopy(model).double(), path, _batch(torch.float64), F.cross_entropy)
    bound_steps_match_autograd(copy.deepcopy(model), path, _batch(torch.float32), F.cross_entropy, bitwise=True)


@pytest.mark.parametrize("form", ["loss", "outputs"])
def test_a_bound_step_under_the_callers_autocast_is_refused_at_the_region_and_the_fix_works(tmp_path, form):
    """Under bfloat16 autocast the model runs the region's matrix product in float32 and the explicit step would
    run it in bfloat16 (the difference is shown on the model itself): the call is refused in one line naming the
    region, an exception, not an exit, with no gradient made; outside autocast, as the fix says, the same bound
    step gives autograd's loss and gradients bit for bit (float32)."""
    torch.manual_seed(0)
    model = Rotary().train()
    path, _ = _generated(tmp_path, model, **({"loss": LossChoice("cross_entropy")} if form == "loss" else {}))
    generator = torch.Generator().manual_seed(1)
    inputs, target = _batch(torch.float32)(generator)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not torch.equal(model(**inputs), _without_region(model, **inputs))  # the region matters here
    ours, theirs = copy.deepcopy(model), copy.deepcopy(model)
    step = symgrad.bind(path, ours)

    def run(net, bound):
        out = net(**inputs, target=target) if bound and form == "loss" else net(**inputs)
        return out if bound and form == "loss" else F.cross_entropy(out, target)

    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(BindError) as raised:
        run(step, True)
    message = str(raised.value)
    assert len(message.splitlines()) == 1, message
    assert message.startswith(f"{REGION}: error: the model turns autocast off there"), message
    assert "(fix: call the step outside torch.autocast, in the model's precision)" in message, message
    assert all(parameter.grad is None for parameter in ours.parameters())
    loss, expected = run(step, True), run(theirs, False)  # the fix: outside autocast
    loss.backward()
    expected.backward()
    assert torch.equal(loss, expected), (loss.item(), expected.item())
    for (name, got), want in zip(ours.named_parameters(), theirs.parameters()):
        assert torch.equal(got.grad, want.grad), (name, (got.grad - want.grad).abs().max().item())


def test_the_guards_autocast_entries_are_checked_when_the_spec_is_read(tmp_path):
    """A region's entry is a file:line and a device type; anything else is refused in one line, as the other
    guards are (the guards are written by the trace)."""
    torch.manual_seed(0)
    _, text = _generated(tmp_path, Rotary().train(), loss=LossChoice("cross_entropy"))
    parse_spec(text, "rotary.yaml")
    for entry, said in (
        ('"x.py:3": CPU!', "autocast 'x.py:3' has 'CPU!', not a device type"),
        ('"x.py": cpu', "not a file:line"),
    ):
        edited = text.replace(f'"{REGION}": cpu', entry)
        with pytest.raises(SpecError) as raised:
            parse_spec(edited, "rotary.yaml")
        assert len(str(raised.value).splitlines()) == 1 and said in str(raised.value), raised.value


def _without_region(model, x):
    """Rotary's forward without its region: what the explicit step would compute under autocast."""
    h = model.inp(x)
    freqs = F.linear(h.to(model.freq.dtype), model.freq)
    cos, sin = freqs.cos(), freqs.sin()
    q1, q2 = model.q(h).chunk(2, -1)
    return model.head(torch.cat((q1 * cos - q2 * sin, q2 * cos + q1 * sin), -1).mean(1))
