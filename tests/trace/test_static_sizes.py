"""A trace at fixed sizes (``symgrad.trace(..., static_sizes=True)``, ``symgrad.trace.static_sizes``), for code
that follows its input's size in ways a spec cannot say and that one cannot edit (issue 63: timm's PVT-v2 and
EdgeNeXt, MONAI's SwinUNETR). Library-free: a window size that follows the input's size (SwinUNETR's
``get_window_size``), a Fourier position encoding built from the map's size (EdgeNeXt's
``PositionalEncodingFourier``), a padding branch on the size (PVT-v2's padding to the window).

Each is refused by a plain trace in one line naming the model's line and the option; traced with it, it trains
equal to autograd at the traced sizes, and any other input size is refused in one line (bind: naming the traced
sizes and the trace at the new ones), never computed with the traced sizes silently."""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symgrad
from symgrad.binding import BindError
from symgrad.trace import TraceError, trace
from tests.helpers import load_yaml
from tests.trace.test_text_transformers import _generated


class WindowFollowsSize(nn.Module):
    """Attention within windows whose size is the map's where the map is smaller (swin_unetr.py's
    get_window_size), the map padded to a multiple of it."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Conv2d(2, 3, 1)
        self.window = 4

    def forward(self, x):
        x = self.proj(x)
        b, c, h, w = x.shape
        wh = h if h <= self.window else self.window
        ww = w if w <= self.window else self.window
        ph, pw = (wh - h % wh) % wh, (ww - w % ww) % ww
        if ph or pw:
            x = F.pad(x, (0, pw, 0, ph))
        hp, wp = x.shape[2], x.shape[3]
        windows = x.view(b, c, hp // wh, wh, wp // ww, ww).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, c, wh * ww)
        attention = torch.softmax(windows.transpose(-1, -2) @ windows, -1)
        out = (windows @ attention).reshape(b, hp // wh, wp // ww, c, wh, ww).permute(0, 3, 1, 4, 2, 5)
        return out.reshape(b, c, hp, wp)[:, :, :h, :w]


class FourierPositions(nn.Module):
    """A position encoding made from numbers alone at the map's size (edgenext.py:58-81), projected and
    multiplied in."""

    def __init__(self, hidden=2):
        super().__init__()
        self.proj = nn.Conv2d(2 * hidden, 2, 1)
        self.hidden = hidden

    def forward(self, x):
        b, c, h, w = x.shape
        mask = ~torch.zeros(b, h, w).to(dtype=torch.bool)
        y = mask.cumsum(1, dtype=torch.float32)
        z = mask.cumsum(2, dtype=torch.float32)
        y = y / (y[:, -1:, :] + 1e-6) * 6.28
        z = z / (z[:, :, -1:] + 1e-6) * 6.28
        dim_t = torch.arange(self.hidden, dtype=torch.int64).to(torch.float32)
        dim_t = 10000 ** (2 * torch.div(dim_t, 2, rounding_mode="floor") / self.hidden)
        pos = torch.cat((y[..., None] / dim_t, z[..., None] / dim_t), dim=3).sin().permute(0, 3, 1, 2)
        return x * self.proj(pos.to(x.dtype))


class PadsOddSizes(nn.Module):
    """A pad taken where the map's height is odd (a branch on the size), then a 2x2 pool."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)

    def forward(self, x):
        x = self.conv(x)
        if x.shape[2] % 2:
            x = F.pad(x, (0, 0, 0, 1))
        return F.avg_pool2d(x, 2)


CASES = {
    "window": (WindowFollowsSize, (2, 2, 3, 3)),
    "fourier": (FourierPositions, (2, 2, 5, 4)),
    "padding": (PadsOddSizes, (2, 2, 5, 4)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_code_following_the_size_is_refused_naming_the_static_option(case):
    build, shape = CASES[case]
    with pytest.raises(TraceError) as error:
        trace(build().double(), {"x": shape}, "parameters", "net")
    (line,) = str(error.value).splitlines()
    assert "test_static_sizes.py:" in line and "(fix: " in line and "--static-sizes" in line, line
    assert "static_sizes=True" in line, line


@pytest.mark.parametrize("case", list(CASES))
def test_traced_at_static_sizes_it_trains_as_autograd_there_and_refuses_other_sizes(case, tmp_path):
    build, shape = CASES[case]
    torch.manual_seed(5)
    model = build().double()
    text = trace(model, {"x": shape}, "parameters", "net", static_sizes=True)
    spec = load_yaml(text)
    checks = [layer for layer in spec["layers"] if layer["op"] == "size_check"]
    assert [(layer["left"]["dims"], layer["right"]) for layer in checks] == [
        ([d], size) for d, size in enumerate(shape)
    ]
    assert spec["guards"]["sizes"] == {"x": list(shape)}
    if case == "fourier":  # the encoding of one sample, expanded to the batch
        constant = next(layer for layer in spec["layers"] if layer["op"] == "constant")
        assert constant["shape"] == [1, 4, 5, 4], constant["shape"]
    reference = copy.deepcopy(model)
    fast = symgrad.bind(_generated(tmp_path, text), model)
    optimizers = [torch.optim.SGD(net.parameters(), lr=0.1) for net in (model, reference)]
    for step in range(3):
        x = torch.randn(*shape, dtype=torch.float64)
        losses = []
        for net, optimizer in zip((fast, reference), optimizers):
            optimizer.zero_grad()
            out = net(x)
            loss = (out * torch.linspace(-1, 1, out.shape[-1], dtype=torch.float64)).square().sum()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        assert abs(losses[0] - losses[1]) <= 1e-12 * abs(losses[1]), (step, losses)
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        assert (ours - theirs).abs().max().item() <= 1e-12
    for other in ((shape[0] + 1, *shape[1:]), (*shape[:2], shape[2] + 1, shape[3])):
        with pytest.raises(BindError) as error:
            fast(torch.randn(*other, dtype=torch.float64))
        (line,) = str(error.value).splitlines()
        assert f"traced with static sizes at x={list(shape)}, and x is {list(other)} now" in line, line
        assert f"--input x={','.join(map(str, other))}" in line and "--static-sizes" in line, line


def test_a_constant_refused_at_the_second_runs_sizes_alone_is_refused_not_taken_at_batch_plus_one():
    """EdgeNeXt's form: an encoding of 32 frequencies fits the constant layer's limit at 8x8 (one sample of
    [64, 8, 8]: 4096 values) and is refused by symgrad at the second run's 16x24, where the model ran; a run
    at batch + 1 alone, which goes through with the same values, no longer hides that it follows the size."""
    with pytest.raises(TraceError) as error:
        trace(FourierPositions(hidden=32).double(), {"x": (2, 2, 8, 8)}, "parameters", "net")
    (line,) = str(error.value).splitlines()
    assert "test_static_sizes.py:" in line and "at x=[3, 2, 16, 24] (the second run" in line, line
    assert "--static-sizes" in line, line
    text = trace(FourierPositions(hidden=32).double(), {"x": (2, 2, 8, 8)}, "parameters", "net", static_sizes=True)
    constant = next(layer for layer in load_yaml(text)["layers"] if layer["op"] == "constant")
    assert constant["shape"] == [1, 64, 8, 8]


def test_the_generated_code_itself_refuses_another_size(tmp_path):
    """Without bind (the module's own forward), the guards stop the call in one line."""
    from symgrad.check import module_from_source
    from symgrad.pipeline import build_text

    text = trace(PadsOddSizes().double(), {"x": (2, 2, 5, 4)}, "parameters", "net", static_sizes=True)
    module = module_from_source(build_text(text, "net.yaml").rendered.files["net.py"], "net")
    params = {
        "conv.weight": torch.randn(3, 2, 3, 3, dtype=torch.float64),
        "conv.bias": torch.randn(3, dtype=torch.float64),
    }
    assert module.forward(torch.randn(2, 2, 5, 4, dtype=torch.float64), params)[0].shape == (2, 3, 3, 2)
    with pytest.raises(ValueError) as error:
        module.forward(torch.randn(2, 2, 7, 4, dtype=torch.float64), params)
    (line,) = str(error.value).splitlines()
    assert "x.shape[2] == 5 as traced (static_sizes=True), which comes out otherwise at these sizes" in line, line
    assert "traced at x=[2, 2, 5, 4]" in line, line


def test_the_checked_input_keeps_its_name_in_the_generated_code():
    """The size checks are checks, not new values: each rebinds the input (``x = _size_check(x, ...)``) and
    the math after them reads ``x`` (``F.conv2d(x, ...)``, its backward too), never ``x_size3``."""
    from symgrad.pipeline import build_text

    text = trace(PadsOddSizes().double(), {"x": (2, 2, 5, 4)}, "parameters", "net", static_sizes=True)
    assert "out: x_size3" in text  # the spec names each check; the code does not
    source = build_text(text, "net.yaml").rendered.files["net.py"]
    assert "x_size" not in source
    assert len(re.findall(r"x = _size_check\(\s+x, ", source)) >= 4, source
    assert "F.conv2d(x, " in source


def test_the_checked_input_keeps_its_name_in_its_gradient():
    """Its gradient keeps it too: ``grad_x`` from the one line that computes it (the size checks pass the
    gradient through, so no ``grad_x_size3 = ...``, ``grad_x_size2 = grad_x_size3`` chain), and it is
    autograd's through the original module at the traced sizes."""
    from symgrad.check import module_from_source
    from symgrad.pipeline import build_text

    torch.manual_seed(5)
    model = PadsOddSizes().double()
    text = trace(model, {"x": (2, 2, 5, 4)}, None, "net", static_sizes=True)
    source = build_text(text, "net.yaml").rendered.files["net.py"]
    assert "grad_x_size" not in source and "x_size" not in source, source
    assert source.count("grad_x, grad_conv_weight, grad_conv_bias = _convolution_backward(") == 1, source
    module = module_from_source(source, "net_static_gradient")
    x = torch.randn(2, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    cotangent = torch.randn_like(model(x))
    params = {key: value.detach() for key, value in model.state_dict().items()}
    (expected,) = torch.autograd.grad(model(x), x, cotangent)
    got = module.gradients(x.detach(), params, (cotangent,)).x
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


class Tokens(nn.Module):
    """A tiny text model: token ids (int64) embedded, a position table added, projected."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(5, 3)
        self.positions = nn.Parameter(torch.randn(4, 3))
        self.proj = nn.Linear(3, 2)

    def forward(self, ids):
        return self.proj(self.table(ids) + self.positions[: ids.shape[1]])


def test_int64_inputs_are_guarded_at_bind_with_static_sizes(tmp_path):
    """Token ids take no size_check layer (no floating tensor to check): their sizes are the guards' alone,
    and bind refuses a call at another length in one line; at the traced sizes it trains as autograd."""
    torch.manual_seed(3)
    model = Tokens().double()
    shape = (2, 3)
    text = trace(model, {"ids": shape}, "parameters", "net", dtypes={"ids": "int64"}, static_sizes=True)
    spec = load_yaml(text)
    assert spec["guards"]["sizes"] == {"ids": list(shape)}
    assert not [layer for layer in spec["layers"] if layer["op"] == "size_check"]
    reference = copy.deepcopy(model)
    fast = symgrad.bind(_generated(tmp_path, text), model)
    ids = torch.randint(0, 5, shape)
    grads = []
    for net in (fast, reference):
        out = net(ids)
        loss = (out * torch.linspace(-1, 1, 2, dtype=torch.float64)).square().sum()
        grads.append(torch.autograd.grad(loss, list(net.parameters())))
    for ours, theirs in zip(*grads):
        assert (ours - theirs).abs().max().item() <= 1e-12
    with pytest.raises(BindError) as error:
        fast(torch.randint(0, 5, (2, 4)))
    (line,) = str(error.value).splitlines()
    assert "traced with static sizes at ids=[2, 3], and ids is [2, 4] now" in line, line


def test_the_command_line_option_traces_at_fixed_sizes_and_bind_prints_a_retrace_that_keeps_it(tmp_path):
    """``symgrad trace --static-sizes``: the spec's options line keeps the flag, so that every retrace bind
    prints traces at fixed sizes again; the size refusal's command names the sizes given now."""
    from click.testing import CliRunner

    from symgrad.cli import main

    (tmp_path / "pads.py").write_text(
        "import torch.nn.functional as F\nfrom torch import nn\n\n\n"
        "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.conv = nn.Conv2d(2, 3, 3, padding=1)\n\n    def forward(self, x):\n"
        "        x = self.conv(x)\n        if x.shape[2] % 2:\n"
        "            x = F.pad(x, (0, 0, 0, 1))\n        return F.avg_pool2d(x, 2)\n"
    )
    spec = tmp_path / "net.yaml"
    result = CliRunner().invoke(
        main,
        [
            "trace",
            f"{tmp_path / 'pads.py'}:Net",
            "--input",
            "x=2,2,5,4",
            "--wrt",
            "parameters",
            "--name",
            "net",
            "--static-sizes",
            "-o",
            str(spec),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "--static-sizes" in spec.read_text().splitlines()[1]
    result = CliRunner().invoke(main, ["generate", str(spec), "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    from symgrad.trace import load_target

    fast = symgrad.bind(tmp_path / "net.py", load_target(f"{tmp_path / 'pads.py'}:Net").double())
    with pytest.raises(BindError, match=r"--static-sizes --input x=2,2,7,4 -o .*net\.yaml && symgrad generate"):
        fast(torch.randn(2, 2, 7, 4, dtype=torch.float64))


class Masked(nn.Module):
    """An input named ``mask`` (an attention mask's usual name), whose checks cannot be ``mask_size0``:
    ``mask_`` is a prefix the generated code reserves."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)

    def forward(self, x, mask):
        x = self.conv(x) * mask
        if x.shape[2] % 2:
            x = F.pad(x, (0, 0, 0, 1))
        return F.avg_pool2d(x, 2)


def test_an_input_whose_name_starts_with_a_reserved_prefix_is_guarded_under_another_name(tmp_path):
    """Before: ``error: output name 'mask_size0' starts with a prefix the generated code reserves``."""
    torch.manual_seed(6)
    model = Masked().double()
    shapes = {"x": (2, 2, 5, 4), "mask": (2, 3, 5, 4)}
    text = trace(model, shapes, "parameters", "net", static_sizes=True)
    checks = [layer["out"] for layer in load_yaml(text)["layers"] if layer["op"] == "size_check"]
    assert checks[4:] == ["size0_of_mask", "size1_of_mask", "size2_of_mask", "size3_of_mask"], checks
    reference = copy.deepcopy(model)
    fast = symgrad.bind(_generated(tmp_path, text), model)
    data = {key: torch.randn(*shape, dtype=torch.float64) for key, shape in shapes.items()}
    for net in (fast, reference):
        net(**data).square().sum().backward()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        assert (ours.grad - theirs.grad).abs().max().item() <= 1e-12
    with pytest.raises(BindError, match=r"and mask is \[1, 3, 5, 4\] now"):
        fast(x=data["x"], mask=data["mask"][:1])


class TwoInputs(nn.Module):
    """Two inputs of different sizes, whose batches must agree."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.lin = nn.Linear(5, 3)

    def forward(self, x, y):
        x = self.conv(x)
        if x.shape[2] % 2:
            x = F.pad(x, (0, 0, 0, 1))
        return F.avg_pool2d(x, 2).mean((2, 3)) + self.lin(y)


def test_a_call_with_both_inputs_at_another_batch_prints_a_retrace_that_works_as_printed(tmp_path):
    """Before: the command changed x alone (``--input y=2,5 ... --input x=3,2,5,4``), whose trace fails
    (``running it at x=[3, 2, 5, 4], y=[2, 5] failed``); a smaller last batch is named with drop_last."""
    import shlex

    from click.testing import CliRunner

    from symgrad.cli import main

    (tmp_path / "two.py").write_text(
        "import torch.nn.functional as F\nfrom torch import nn\n\nfrom tests.trace.test_static_sizes import "
        "TwoInputs as Net\n"
    )
    spec = tmp_path / "net.yaml"
    arguments = ["--input", "x=2,2,5,4", "--input", "y=2,5", "--wrt", "parameters", "--name", "net"]
    result = CliRunner().invoke(
        main, ["trace", f"{tmp_path / 'two.py'}:Net", *arguments, "--static-sizes", "-o", str(spec)]
    )
    assert result.exit_code == 0, result.output
    assert CliRunner().invoke(main, ["generate", str(spec), "-o", str(tmp_path)]).exit_code == 0
    fast = symgrad.bind(tmp_path / "net.py", TwoInputs().double())
    x, y = torch.randn(3, 2, 5, 4, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    with pytest.raises(BindError) as error:
        fast(x, y)
    (line,) = str(error.value).splitlines()
    assert "and x is [3, 2, 5, 4], y is [3, 5] now" in line and "drop_last" not in line, line
    command = line.split("at these: ")[1].rstrip(")").split(" && ")[0]
    assert "--input x=3,2,5,4" in command and "--input y=3,5" in command, command
    result = CliRunner().invoke(main, shlex.split(command)[1:])
    assert result.exit_code == 0, result.output
    with pytest.raises(
        BindError, match=r"at those sizes \(a smaller last batch: DataLoader\(\.\.\., drop_last=True\)\)"
    ):
        fast(x[:1], y[:1])
