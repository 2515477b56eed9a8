"""A custom torch.autograd.Function in the traced forward: traced through its forward's ops where its own
backward was checked equal to its forward's derivative (NAFNet's LayerNormFunction, as its authors write
it), refused at its line, naming what differed, where it is not (a straight-through estimator, a gradient
reversal, a backward off by a scale)."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, TraceError, trace
from tests.models.compare import Case, assert_generated_test_file_passes, matches_autograd

pytestmark = pytest.mark.filterwarnings("ignore:'saved_variables' is deprecated")  # as upstream writes it


# ----- NAFNet as megvii-research/NAFNet writes it (basicsr/models/archs/arch_util.py, NAFNet_arch.py) ---------
class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        ctx.eps = eps
        N, C, H, W = x.size()
        mu = x.mean(1, keepdim=True)
        var = (x - mu).pow(2).mean(1, keepdim=True)
        y = (x - mu) / (var + eps).sqrt()
        ctx.save_for_backward(y, var, weight)
        y = weight.view(1, C, 1, 1) * y + bias.view(1, C, 1, 1)
        return y

    @staticmethod
    def backward(ctx, grad_output):
        eps = ctx.eps

        N, C, H, W = grad_output.size()
        y, var, weight = ctx.saved_variables
        g = grad_output * weight.view(1, C, 1, 1)
        mean_g = g.mean(dim=1, keepdim=True)

        mean_gy = (g * y).mean(dim=1, keepdim=True)
        gx = 1.0 / torch.sqrt(var + eps) * (g - y * mean_gy - mean_g)
        return (
            gx,
            (grad_output * y).sum(dim=3).sum(dim=2).sum(dim=0),
            grad_output.sum(dim=3).sum(dim=2).sum(dim=0),
            None,
        )


class LayerNorm2d(nn.Module):
    def __init__(self, channels, eps=1e-6):
        super(LayerNorm2d, self).__init__()
        self.register_parameter("weight", nn.Parameter(torch.ones(channels)))
        self.register_parameter("bias", nn.Parameter(torch.zeros(channels)))
        self.eps = eps

    def forward(self, x):
        return LayerNormFunction.apply(x, self.weight, self.bias, self.eps)


class SimpleGate(nn.Module):
    def forward(self, x):
        x1, x2 = x.chunk(2, dim=1)
        return x1 * x2


class NAFBlock(nn.Module):
    """Upstream's, but beta and gamma start at ``layer_scale`` (zeros upstream, where no gradient would
    reach the block's convolutions and norms)."""

    def __init__(self, c, DW_Expand=2, FFN_Expand=2, drop_out_rate=0.0, layer_scale=0.5):
        super().__init__()
        dw_channel = c * DW_Expand
        self.conv1 = nn.Conv2d(
            in_channels=c, out_channels=dw_channel, kernel_size=1, padding=0, stride=1, groups=1, bias=True
        )
        self.conv2 = nn.Conv2d(
            in_channels=dw_channel,
            out_channels=dw_channel,
            kernel_size=3,
            padding=1,
            stride=1,
            groups=dw_channel,
            bias=True,
        )
        self.conv3 = nn.Conv2d(
            in_channels=dw_channel // 2, out_channels=c, kernel_size=1, padding=0, stride=1, groups=1, bias=True
        )
        self.sca = nn.Sequential(  # Simplified Channel Attention
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(
                in_channels=dw_channel // 2,
                out_channels=dw_channel // 2,
                kernel_size=1,
                padding=0,
                stride=1,
                groups=1,
                bias=True,
            ),
        )
        self.sg = SimpleGate()
        ffn_channel = FFN_Expand * c
        self.conv4 = nn.Conv2d(
            in_channels=c, out_channels=ffn_channel, kernel_size=1, padding=0, stride=1, groups=1, bias=True
        )
        self.conv5 = nn.Conv2d(
            in_channels=ffn_channel // 2, out_channels=c, kernel_size=1, padding=0, stride=1, groups=1, bias=True
        )
        self.norm1 = LayerNorm2d(c)
        self.norm2 = LayerNorm2d(c)
        self.dropout1 = nn.Dropout(drop_out_rate) if drop_out_rate > 0.0 else nn.Identity()
        self.dropout2 = nn.Dropout(drop_out_rate) if drop_out_rate > 0.0 else nn.Identity()
        self.beta = nn.Parameter(torch.full((1, c, 1, 1), layer_scale), requires_grad=True)
        self.gamma = nn.Parameter(torch.full((1, c, 1, 1), layer_scale), requires_grad=True)

    def forward(self, inp):
        x = inp

        x = self.norm1(x)

        x = self.conv1(x)
        x = self.conv2(x)
        x = self.sg(x)
        x = x * self.sca(x)
        x = self.conv3(x)

        x = self.dropout1(x)

        y = inp + x * self.beta

        x = self.conv4(self.norm2(y))
        x = self.sg(x)
        x = self.conv5(x)

        x = self.dropout2(x)

        return y + x * self.gamma


class NAFNet(nn.Module):
    """Upstream's U-shape at a tiny width and depth."""

    def __init__(self, img_channel=3, width=4, middle_blk_num=1, enc_blk_nums=(1,), dec_blk_nums=(1,)):
        super().__init__()
        self.intro = nn.Conv2d(
            in_channels=img_channel, out_channels=width, kernel_size=3, padding=1, stride=1, groups=1, bias=True
        )
        self.ending = nn.Conv2d(
            in_channels=width, out_channels=img_channel, kernel_size=3, padding=1, stride=1, groups=1, bias=True
        )
        self.encoders = nn.ModuleList()
        self.decoders = nn.ModuleList()
        self.middle_blks = nn.ModuleList()
        self.ups = nn.ModuleList()
        self.downs = nn.ModuleList()
        chan = width
        for num in enc_blk_nums:
            self.encoders.append(nn.Sequential(*[NAFBlock(chan) for _ in range(num)]))
            self.downs.append(nn.Conv2d(chan, 2 * chan, 2, 2))
            chan = chan * 2
        self.middle_blks = nn.Sequential(*[NAFBlock(chan) for _ in range(middle_blk_num)])
        for num in dec_blk_nums:
            self.ups.append(nn.Sequential(nn.Conv2d(chan, chan * 2, 1, bias=False), nn.PixelShuffle(2)))
            chan = chan // 2
            self.decoders.append(nn.Sequential(*[NAFBlock(chan) for _ in range(num)]))
        self.padder_size = 2 ** len(self.encoders)

    def forward(self, inp):
        B, C, H, W = inp.shape
        inp = self.check_image_size(inp)
        x = self.intro(inp)
        encs = []
        for encoder, down in zip(self.encoders, self.downs):
            x = encoder(x)
            encs.append(x)
            x = down(x)
        x = self.middle_blks(x)
        for decoder, up, enc_skip in zip(self.decoders, self.ups, encs[::-1]):
            x = up(x)
            x = x + enc_skip
            x = decoder(x)
        x = self.ending(x)
        x = x + inp
        return x[:, :, :H, :W]

    def check_image_size(self, x):
        _, _, h, w = x.size()
        mod_pad_h = (self.padder_size - h % self.padder_size) % self.padder_size
        mod_pad_w = (self.padder_size - w % self.padder_size) % self.padder_size
        x = F.pad(x, (0, mod_pad_w, 0, mod_pad_h))
        return x


NAFNET = Case(NAFNet, {"inp": (2, 3, 8, 8)}, {"inp": (3, 3, 6, 10)}, ("mse_loss",))


def test_nafnet_with_its_layer_norm_function_matches_autograd_through_the_module():
    """Traced through LayerNormFunction's forward (its backward checked equal to that forward's derivative),
    the generated gradients are autograd's through the original module, which runs the Function's own
    backward, at another batch and size (float64, <= 1e-10)."""
    matches_autograd("nafnet_function", NAFNET, "train")


def test_the_check_is_in_the_spec_and_the_derivation():
    text = trace(NAFBlock(2).double(), {"inp": (2, 2, 4, 4)}, name="nafnet_function", loss=LossChoice("mse_loss"))
    entry = next(line for line in text.splitlines() if line.startswith("  LayerNormFunction:"))
    # NAFNet's backward reads y and var saved from its forward, detached: its own derivative misses theirs
    assert "second_order: not differentiable" not in entry and "first_order: " in entry, entry
    first = float(entry.split("first_order: ")[1].split(",")[0])
    second = float(entry.split("second_order: ")[1].rstrip("}"))
    assert first <= 1e-10 < second, entry
    document = build_text(text, "nafnet_function.yaml").rendered.files["nafnet_function.md"]
    assert "`LayerNormFunction`'s backward was checked equal to its forward's derivative" in document


@pytest.mark.slow
def test_nafnet_with_its_layer_norm_function_generated_test_file_passes(tmp_path):
    assert_generated_test_file_passes("nafnet_function", NAFNET, tmp_path)


# ----- Functions whose backward is not their forward's derivative ------------------------------------------
class StraightThrough(torch.autograd.Function):
    """Round in the forward, the identity in the backward (quantisation-aware training)."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class ReverseGradient(torch.autograd.Function):
    """Domain adaptation's gradient reversal: the identity forward, the negated gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -grad


class ScaledBackward(torch.autograd.Function):
    """x * w, whose backward is right but for a factor 1.5 on x's gradient."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return 1.5 * grad * w, (grad * x).sum((0, 2, 3), keepdim=True)


class Wrapped(nn.Module):
    def __init__(self, function):
        super().__init__()
        self.conv, self.head, self.function = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 2, 1), function
        self.scale = nn.Parameter(torch.rand(1, 4, 1, 1) + 0.5)

    def forward(self, x):
        h = self.conv(x)
        if self.function is ScaledBackward:
            return self.head(ScaledBackward.apply(h, self.scale))
        return self.head(self.function.apply(h))


@pytest.mark.parametrize(
    "function, differed",
    [
        (StraightThrough, "by 1 (relative, largest entry) in its input 'x'"),
        (ReverseGradient, "by 2 (relative, largest entry) in its input 'x'"),
        (ScaledBackward, "by 0.33 (relative, largest entry) in its input 'x'"),
    ],
    ids=["straight-through", "gradient-reversal", "scaled-backward"],
)
def test_a_function_whose_backward_is_not_its_forward_derivative_is_refused_naming_the_difference(function, differed):
    with pytest.raises(TraceError) as error:
        trace(Wrapped(function).double(), {"x": (2, 3, 6, 6)}, loss=LossChoice("mse_loss"), mode="train")
    (message,) = str(error.value).splitlines()
    first = inspect.getsourcelines(function.forward)[1]
    line = first + (3 if function is ScaledBackward else 2)
    assert f"test_custom_function.py:{line}: error: " in message, message
    assert (
        f"torch.autograd.Function {function.__name__}, whose own backward differs from its forward's "
        f"derivative {differed}" in message
    ), message
    assert "x=[2, 4, 6, 6]" in message and "train that model with autograd" in message, message


class BatchOfTwo(torch.autograd.Function):
    """Right at a batch of 2 only: its backward scales by 2 / N, where its forward is the identity."""

    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):
        return grad * (2 / grad.shape[0])


def test_a_backward_right_at_the_traced_shapes_alone_is_refused_at_the_other_size():
    with pytest.raises(TraceError) as error:
        trace(Wrapped(BatchOfTwo).double(), {"x": (2, 3, 6, 6)}, loss=LossChoice("mse_loss"), mode="train")
    (message,) = str(error.value).splitlines()
    assert "Function BatchOfTwo, whose own backward differs from its forward's derivative by 0.33" in message, message
    assert "x=[3, 4, " in message, message  # the second run's batch


# ----- second order --------------------------------------------------------------------------------------
class Tanh(torch.autograd.Function):
    """tanh, its backward computed from its saved input with differentiable ops: right to second order."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.tanh(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (1 - torch.tanh(x) ** 2)


class TanhOnce(Tanh):
    """The same, with a backward autograd cannot differentiate."""

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (1 - torch.tanh(x) ** 2)


class TanhInline(nn.Module):
    def __init__(self, function=None):
        super().__init__()
        self.conv, self.head, self.function = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 2, 1), function

    def forward(self, x):
        h = self.conv(x)
        return self.head(self.function.apply(h) if self.function else torch.tanh(h))


def test_a_function_right_to_second_order_is_traced_as_its_forward_and_takes_hvp():
    """The spec holds the forward's ops and nothing of the check (the same layers as tanh written inline),
    notes the check, matches autograd through the module, and builds with hvp."""
    torch.manual_seed(0)
    model = TanhInline(Tanh).double()
    text = trace(model, {"x": (2, 3, 6, 6)}, name="tanh", loss=LossChoice("mse_loss"))
    inline = trace(TanhInline().double(), {"x": (2, 3, 6, 6)}, name="tanh", loss=LossChoice("mse_loss"))
    assert text.partition("\nchecked_functions:")[0] == inline.partition("\nfingerprint:")[0], (text, inline)
    entry = next(line for line in text.splitlines() if line.startswith("  Tanh:"))
    assert float(entry.split("second_order: ")[1].rstrip("}")) <= 1e-10, entry
    matches_autograd(
        "tanh", Case(TanhInline, {"x": (2, 3, 6, 6)}, {"x": (3, 3, 5, 7)}, ("mse_loss",), {"function": Tanh}), "train"
    )
    built = build_text(text, "tanh.yaml", extras=("hvp",))
    assert "def hvp(" in built.rendered.files["tanh.py"]
    assert "its forward's second derivative too" in built.rendered.files["tanh.md"]


@pytest.mark.parametrize(
    "function, why",
    [
        (TanhOnce, "autograd cannot differentiate its backward"),
        (LayerNormFunction, "its backward's own derivative differs from its forward's second derivative by 1"),
    ],
    ids=["once-differentiable", "nafnet-saves-detached-values"],
)
def test_hvp_is_refused_where_the_backward_is_right_to_first_order_only(function, why):
    """The first order traces (the gradients are autograd's); the hvp would be the forward's second derivative,
    which autograd through the model does not give: the spec asking for it is refused, saying why."""
    from symgrad.errors import SpecError

    model = NAFBlock(3).double() if function is LayerNormFunction else TanhInline(function).double()
    text = trace(
        model,
        {"inp" if function is LayerNormFunction else "x": (2, 3, 4, 4)},
        name="first_only",
        loss=LossChoice("mse_loss"),
    )
    assert f"  {function.__name__}: {{first_order: " in text, text
    with pytest.raises(SpecError) as error:
        build_text(text, "first_only.yaml", extras=("hvp",), documents=False)
    message = str(error.value)
    assert (
        f"the spec asks for hvp, and the torch.autograd.Function {function.__name__} was checked equal to its "
        f"forward's derivative to first order only ({why}" in message
    ), message
    assert "drop hvp" in message


def test_a_hand_written_entry_claiming_an_unequal_backward_is_refused():
    from symgrad.errors import SpecError
    from symgrad.spec import parse_spec

    text = (
        "name: s\ninputs: {x: {shape: [2, 3]}, y: {shape: [2, 3]}}\nlayers:\n  - {op: relu, out: h}\n"
        "loss: {op: half_sq_error, target: y}\nwrt: [x]\nchecked_functions:\n"
        "  Clip: {first_order: 0.5, second_order: 0.0}\n"
    )
    with pytest.raises(SpecError) as error:
        parse_spec(text, "s.yaml")
    assert "only a Function whose backward was checked equal" in str(error.value), str(error.value)
    parse_spec(text.replace("0.5", "1.0e-16"), "s.yaml")


def test_the_check_leaves_the_random_state_as_it_was():
    from symgrad.trace.custom_functions import _CHECKED, Applied, check

    _CHECKED.pop(Tanh, None)
    applied = Applied(Tanh, (torch.randn(2, 3),), {}, "here:1")
    state = torch.get_rng_state()
    found = check(applied)
    assert found.first is not None and found.first <= 1e-10 and not found.refusal, found
    assert torch.equal(state, torch.get_rng_state())


class WithCount(torch.autograd.Function):
    """Returns a number beside its tensor."""

    @staticmethod
    def forward(ctx, x):
        return x * 2.0, 3

    @staticmethod
    def backward(ctx, grad, count):
        return grad * 2.0


class TooFewGradients(torch.autograd.Function):
    """x * w whose backward returns x's gradient alone."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(w)
        return x * w

    @staticmethod
    def backward(ctx, grad):
        (w,) = ctx.saved_tensors
        return (grad * w,)


class ScaleByDetachedStd(torch.autograd.Function):
    """x / std(x), the std under no_grad in its forward and a constant in its backward, as autograd differentiates
    that forward: the check would find them equal, and the trace differentiates the std."""

    @staticmethod
    def forward(ctx, x, w):
        with torch.no_grad():
            s = x.std()
        ctx.save_for_backward(x, s, w)
        return x / s * w

    @staticmethod
    def backward(ctx, grad):
        x, s, w = ctx.saved_tensors
        return grad / s * w, (grad * x / s).sum((0, 2, 3), keepdim=True)


class Uncheckable(nn.Module):
    def __init__(self, function):
        super().__init__()
        self.conv, self.function = nn.Conv2d(3, 4, 3, padding=1), function
        self.scale = nn.Parameter(torch.rand(1, 4, 1, 1) + 0.5)

    def forward(self, x):
        h = self.conv(x)
        return self.function.apply(h)[0] if self.function is WithCount else self.function.apply(h, self.scale)


@pytest.mark.parametrize(
    "function, why",
    [
        (WithCount, "cannot be checked against its forward's derivative: its forward returns int, not only tensors"),
        (
            TooFewGradients,
            "cannot be checked against its forward's derivative: the check raised RuntimeError: "
            "function TooFewGradientsBackward returned an incorrect number of gradients",
        ),
        (
            ScaleByDetachedStd,
            f"cannot be checked against its forward's derivative: its forward turns gradients off at {__file__}:",
        ),
    ],
    ids=["returns-a-number", "backward-raises", "no-grad-inside"],
)
def test_a_function_that_cannot_be_checked_is_refused_saying_why(function, why):
    with pytest.raises(TraceError) as error:
        trace(Uncheckable(function).double(), {"x": (2, 3, 6, 6)}, loss=LossChoice("mse_loss"), mode="train")
    (message,) = str(error.value).splitlines()
    assert f"torch.autograd.Function {function.__name__}, whose own backward {why}" in message, message
