"""Every rule, through the whole pipeline, against torch.autograd: one checker, a flat case list.

Each case is a small spec. The checker generates its module and asserts, in float64 with a random
cotangent, that the explicit gradients match autograd on PyTorch's own functions (``verify``), and
that the explicit backward passes gradcheck and gradgradcheck.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.attention

from symgrad import roles
from symgrad.check import random_inputs, relative_error, verify
from symgrad.graph import build_graph
from symgrad.roles import channels_last_inputs
from symgrad.rules import all_rules
from symgrad.spec import parse_spec
from tests.helpers import build_text, generated_module, spec_text

ROOT = Path(__file__).resolve().parents[2]

SQ = {"op": "half_sq_error", "target": "y", "reduction": "sum"}


def conv_case(dims, n, c_in, size, c_out, kernel, bias=False, wrt=("x", "w"), transposed=False, **args):
    spatial = [size] * dims if isinstance(size, int) else list(size)
    kernel = [kernel] * dims if isinstance(kernel, int) else list(kernel)
    groups = args.get("groups", 1)
    weight = [c_in, c_out // groups, *kernel] if transposed else [c_out, c_in // groups, *kernel]
    inputs = {"x": [n, c_in, *spatial] if n is not None else [c_in, *spatial], "w": weight}  # n=None: unbatched
    name = f"conv_transpose{dims}d" if transposed else f"conv{dims}d"
    layer = {"op": name, "weight": "w", **args, "out": "out"}
    if bias:
        inputs["b"] = [c_out]
        layer["bias"] = "b"
        wrt = (*wrt, "b")
    # the target's shape comes from PyTorch itself, so the case list never restates shape arithmetic
    probe = getattr(torch.nn.functional, name)(torch.zeros(inputs["x"]), torch.zeros(inputs["w"]),
                                               **{k: v for k, v in args.items()})
    inputs["y"] = list(probe.shape)
    return spec_text(inputs, [layer], SQ, list(wrt))


def torch_case(op, inputs: dict, wrt, function, in_names=None, **args):
    """A one-layer case whose target shape comes from running ``function`` (PyTorch's own op)."""
    probe = function(*[torch.zeros(shape) for shape in inputs.values()], **args)
    layer = {"op": op, **({"in": in_names} if in_names else {}), **args, "out": "out"}
    return spec_text({**inputs, "y": list(probe.shape)}, [layer], SQ, wrt)


F = torch.nn.functional
CASES = [
    pytest.param(conv_case(2, 2, 3, 7, 4, 3), id="conv2d-odd-size"),
    pytest.param(conv_case(2, 2, 3, 9, 4, 3, stride=2), id="conv2d-stride2-output_padding"),
    pytest.param(conv_case(2, 1, 2, 11, 3, 2, stride=3, padding=1), id="conv2d-stride3-padding"),
    pytest.param(conv_case(2, 2, 2, 10, 2, 3, dilation=2, padding=2), id="conv2d-dilation"),
    pytest.param(conv_case(2, 2, 4, 9, 6, 3, groups=2, stride=2, bias=True), id="conv2d-groups-bias"),
    pytest.param(conv_case(2, 2, 6, (9, 8), 3, (3, 2), groups=3, stride=[2, 3], padding=[1, 0], dilation=[1, 2]),
                 id="conv2d-per-axis-args"),
    pytest.param(conv_case(2, 2, 2, 12, 2, 2, stride=4, dilation=1), id="conv2d-stride-gt-dilation-crop"),
    pytest.param(conv_case(1, 2, 3, 13, 2, 4, stride=3, padding=2, dilation=2, bias=True), id="conv1d-all-args"),
    pytest.param(conv_case(3, 1, 2, 6, 2, 2, stride=2, padding=1, bias=True), id="conv3d-stride-padding-bias"),
    pytest.param(conv_case(2, None, 4, (7, 6), 6, 3, stride=2, padding=1, groups=2, bias=True), id="conv2d-unbatched-groups-bias"),
    pytest.param(conv_case(1, None, 2, 12, 3, 2, stride=4), id="conv1d-unbatched-stride-gt-dilation-crop"),
    pytest.param(conv_case(3, None, 2, 5, 2, 2, dilation=2, bias=True), id="conv3d-unbatched-dilation-bias"),
    pytest.param(conv_case(2, 2, 3, (7, 6), 4, (2, 4), padding="same", bias=True), id="conv2d-same-even-kernel-asymmetric"),
    pytest.param(conv_case(1, 2, 2, 9, 3, 2, padding="same", dilation=3), id="conv1d-same-odd-dilated-extent"),
    pytest.param(conv_case(3, None, 2, 5, 2, (2, 3, 2), padding="same", groups=2), id="conv3d-unbatched-same-asymmetric-groups"),
    pytest.param(conv_case(2, None, 2, (3, 4), 4, 3, transposed=True, stride=2, output_padding=1, groups=2, bias=True),
                 id="conv_transpose2d-unbatched-groups-bias"),
    pytest.param(conv_case(1, None, 2, 5, 3, 3, transposed=True, stride=2, output_padding=2, dilation=3),
                 id="conv_transpose1d-unbatched-output_padding-beyond-stride"),
    pytest.param(conv_case(2, 2, 3, 7, 4, 3, wrt=("w",)), id="conv2d-weight-only"),
    pytest.param(conv_case(2, 2, 3, 4, 2, 3, transposed=True, stride=2, padding=1, output_padding=1, bias=True),
                 id="conv_transpose2d-stride-output_padding-bias"),
    pytest.param(conv_case(2, 1, 4, (3, 4), 6, (2, 3), transposed=True, stride=[3, 1], padding=[1, 0], output_padding=[2, 0],
                           dilation=[1, 2], groups=2), id="conv_transpose2d-groups-per-axis"),
    pytest.param(conv_case(1, 2, 2, 5, 3, 3, transposed=True, stride=2, output_padding=2, dilation=3),
                 id="conv_transpose1d-output_padding-beyond-stride"),
    pytest.param(conv_case(3, 1, 2, 3, 2, 2, transposed=True, stride=2, padding=1, bias=True),
                 id="conv_transpose3d-stride-padding-bias"),
    pytest.param(spec_text({"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "relu"}], SQ, ["x"]), id="relu"),
    pytest.param(spec_text({"x": [4, 3, 5, 6], "y": [4, 3, 5, 6]}, [{"op": "dropout", "p": 0.3}], SQ, ["x"]), id="dropout"),
    pytest.param(spec_text({"x": [4, 5, 3, 4], "y": [4, 5, 3, 4]}, [{"op": "dropout", "p": 0.2, "noise": "channel"}], SQ,
                           ["x"]), id="dropout2d-channel"),
    pytest.param(spec_text({"x": [6, 3, 4], "y": [6, 3, 4]}, [{"op": "dropout", "p": 0.4, "noise": "row", "scale": False}],
                           SQ, ["x"]), id="drop-path-row-unscaled"),
    pytest.param(spec_text({"a": [2, 3], "b": [2, 3], "y": [2, 3]}, [{"op": "add", "in": ["a", "b"]}], SQ, ["a", "b"]),
                 id="add"),
    pytest.param(spec_text({"a": [2, 3], "b": [2, 3], "y": [2, 3]}, [{"op": "sub", "in": ["a", "b"]}], SQ, ["a", "b"]),
                 id="sub"),
    pytest.param(spec_text({"a": [2, 3, 4], "b": [3, 1], "y": [2, 3, 4]}, [{"op": "mul", "in": ["a", "b"]}], SQ,
                           ["a", "b"]), id="mul-broadcast"),
    pytest.param(spec_text({"a": [2, 3], "y": [2, 3]}, [{"op": "mul", "other": 0.25}], SQ, ["a"]), id="mul-constant"),
    pytest.param(spec_text({"a": [2, 3], "y": [2, 3]}, [{"op": "sub", "other": 3}], SQ, ["a"]), id="sub-constant"),
    pytest.param(spec_text({"p": [3, 2, 4], "y": [3, 2, 4]}, [], {**SQ, "in": "p", "reduction": "mean"}, ["p", "y"]),
                 id="loss-mean-target-wrt"),
    pytest.param(spec_text({"p": [3, 2, 4], "y": [3, 2, 4]}, [], {**SQ, "in": "p", "reduction": "per_sample"}, ["p", "y"]),
                 id="loss-per-sample"),
    pytest.param(spec_text({"x": [2, 2, 6, 6], "w": [2, 2, 3, 3], "y": [2, 2, 6, 6]},
                           [{"op": "conv2d", "weight": "w", "padding": 1, "out": "h"}, {"op": "relu", "out": "a"},
                            {"op": "add", "in": ["a", "x"], "out": "r"}], SQ, ["x", "w"]), id="residual-branch-sum"),
    pytest.param(spec_text({"x": [2, 2, 6, 6], "w": [2, 2, 3, 3], "y": [2, 2, 6, 6]},
                           [{"op": "conv2d", "weight": "w", "padding": 1, "out": "h"},
                            {"op": "conv2d", "in": "h", "weight": "w", "padding": 1, "out": "g"}], SQ, ["x", "w"]),
                 id="tied-weight-used-twice"),
    pytest.param(spec_text({"x": [2, 3], "y": [2, 3]}, [{"op": "mul", "in": ["x", "x"]}], SQ, ["x"]),
                 id="same-node-both-operands"),
    # two strided convs read one node: their adjoints (with symbolic output_padding) are summed
    pytest.param(spec_text({"x": [2, 2, 9, 9], "u": [2, 2, 3, 3], "v": [2, 2, 3, 3], "y": [2, 2, 4, 4]},
                           [{"op": "conv2d", "in": "x", "weight": "u", "stride": 2, "out": "p"},
                            {"op": "conv2d", "in": "x", "weight": "v", "stride": 2, "out": "q"},
                            {"op": "add", "in": ["p", "q"], "out": "s"}], SQ, ["x", "u", "v"]),
                 id="two-strided-convs-share-input"),
    *[pytest.param(spec_text({"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": op, **args}], SQ, ["x"]), id=f"{op}{'-' if args else ''}{'-'.join(f'{k}={v}' for k, v in args.items())}")
      for op, args in [("neg", {}), ("exp", {}), ("abs", {}), ("sigmoid", {}), ("tanh", {}), ("silu", {}), ("gelu", {}),
                       ("gelu", {"approximate": "tanh"}), ("softplus", {}), ("softplus", {"beta": 2, "threshold": 1}),
                       ("elu", {}), ("elu", {"alpha": 0.5}), ("leaky_relu", {}), ("leaky_relu", {"negative_slope": 0.2}),
                       ("hardtanh", {}), ("hardtanh", {"min_val": -0.5, "max_val": 2.0}), ("relu6", {}),
                       ("hardsigmoid", {}), ("hardswish", {}),
                       ("pow", {"exponent": 3}), ("pow", {})]],  # pow's default exponent (2) must reach PyTorch
    *[pytest.param(spec_text({"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "softplus"}, {"op": op, **args}], SQ, ["x"]),
                   id=f"{op}-of-positive{'-' if args else ''}{'-'.join(f'{k}={v}' for k, v in args.items())}")
      for op, args in [("log", {}), ("sqrt", {}), ("pow", {"exponent": 0.5}), ("pow", {"exponent": -1.5})]],
    pytest.param(spec_text({"a": [2, 3, 4], "b": [3, 1], "y": [2, 3, 4]}, [{"op": "softplus", "in": "b", "out": "pb"},
                                                                         {"op": "div", "in": ["a", "pb"]}], SQ, ["a", "b"]),
                 id="div-broadcast"),
    pytest.param(spec_text({"a": [2, 3], "y": [2, 3]}, [{"op": "div", "other": 4}], SQ, ["a"]), id="div-constant"),
    *[pytest.param(spec_text({"p": [3, 2, 4], "y": [3, 2, 4]}, [], {"op": loss, "in": "p", "target": "y", **args}, ["p", "y"]),
                   id=f"{loss}-{'-'.join(f'{k}={v}' for k, v in args.items()) or 'defaults'}")
      for loss, args in [("mse_loss", {}), ("mse_loss", {"reduction": "sum"}), ("l1_loss", {}),
                         ("l1_loss", {"reduction": "per_sample"}), ("smooth_l1_loss", {}),
                         ("smooth_l1_loss", {"beta": 0.5, "reduction": "sum"}), ("huber_loss", {}),
                         ("huber_loss", {"delta": 2.0, "reduction": "per_sample"})]],
    pytest.param(torch_case("flatten", {"x": [2, 3, 4, 5]}, ["x"], torch.flatten, start_dim=1), id="flatten"),
    pytest.param(torch_case("reshape", {"x": [2, 3, 4]}, ["x"], lambda x, shape: x.reshape(shape), shape=[2, -1]), id="reshape-minus-one"),
    pytest.param(torch_case("reshape", {"x": [2, 3, 4]}, ["x"], lambda x, shape: x.reshape(shape), shape=[6, 4]), id="reshape"),
    pytest.param(spec_text({"x": [2, 3, 4, 5], "y": [2, 3, 20]},
                           [{"op": "reshape", "shape": [{"like": "x"}, {"like": "x"}, {"like": "x", "dims": [2, 3]}],
                             "out": "out"}], SQ, ["x"]), id="reshape-sizes-read-at-run-time"),
    pytest.param(torch_case("permute", {"x": [2, 3, 4]}, ["x"], lambda x, dims: x.permute(dims), dims=[2, 0, 1]), id="permute"),
    *[pytest.param(spec_text({"x": [2, 3, 5], "y": [2, 3, 5]}, [{"op": "mul", "other": 4}, {"op": op}], SQ, ["x"]),
                   id=f"{op}-past-its-kinks") for op in ("hardsigmoid", "hardswish")],  # 4 N(0, 1): all three pieces
    pytest.param(torch_case("unsqueeze", {"x": [2, 3, 4]}, ["x"], torch.unsqueeze, dim=1), id="unsqueeze"),
    pytest.param(torch_case("unsqueeze", {"x": [2, 3]}, ["x"], torch.unsqueeze, dim=-1), id="unsqueeze-last"),
    pytest.param(torch_case("squeeze", {"x": [2, 1, 4]}, ["x"], torch.squeeze, dim=1), id="squeeze"),
    pytest.param(torch_case("mean", {"x": [2, 3, 4, 5]}, ["x"], torch.mean, dim=[1], keepdim=True), id="mean-channels-keepdim"),
    pytest.param(torch_case("mean", {"x": [2, 3, 4, 5]}, ["x"], torch.mean, dim=[-1, 2]), id="mean-spatial"),
    pytest.param(torch_case("sum", {"x": [2, 3, 4, 5]}, ["x"], torch.sum, dim=[2, 3], keepdim=True), id="sum-spatial-keepdim"),
    pytest.param(torch_case("sum", {"x": [3, 4, 5]}, ["x"], torch.sum, dim=[0, 2]), id="sum-batch-and-last"),
    pytest.param(torch_case("var", {"x": [2, 3, 4, 5]}, ["x"], torch.var, dim=[1], keepdim=True, unbiased=False),
                 id="var-channels-keepdim-biased"),
    pytest.param(torch_case("var", {"x": [3, 4, 5]}, ["x"], torch.var, dim=[0, 2]), id="var-unbiased"),
    pytest.param(torch_case("std", {"x": [2, 3, 4, 5]}, ["x"], torch.std, dim=[-1], keepdim=True, correction=0),
                 id="std-last-keepdim-correction0"),
    pytest.param(torch_case("std", {"x": [2, 3, 4]}, ["x"], torch.std, dim=[1, 2]), id="std-spatial"),
    pytest.param(torch_case("normalize", {"x": [2, 3, 4, 5]}, ["x"], F.normalize, dim=-1), id="normalize-last"),
    pytest.param(torch_case("normalize", {"x": [2, 3, 4]}, ["x"], F.normalize, dim=1, eps=0.5),
                 id="normalize-some-clamped"),
    pytest.param(torch_case("softmax", {"x": [2, 3, 4, 5]}, ["x"], torch.softmax, dim=1), id="softmax-channels"),
    pytest.param(torch_case("softmax", {"x": [2, 6, 5]}, ["x"], torch.softmax, dim=-1), id="softmax-last"),
    pytest.param(torch_case("log_softmax", {"x": [3, 4, 5]}, ["x"], torch.log_softmax, dim=0), id="log_softmax-first"),
    pytest.param(torch_case("log_softmax", {"x": [2, 3, 4]}, ["x"], torch.log_softmax, dim=-2), id="log_softmax-middle"),
    pytest.param(torch_case("squeeze", {"x": [2, 3, 1]}, ["x"], torch.squeeze, dim=-1), id="squeeze-last"),
    pytest.param(torch_case("pad", {"x": [2, 3, 5]}, ["x"], F.pad, pad=[1, 2]), id="pad"),
    pytest.param(torch_case("pad", {"x": [2, 3, 5]}, ["x"], F.pad, pad=[-1, 1, 2, 0], value=0.5), id="pad-crop-value"),
    *[pytest.param(torch_case("pad", {"x": shape}, ["x"], F.pad, pad=pad, mode=mode), id=f"pad-{mode}-{len(pad) // 2}d")
      for mode in ("reflect", "replicate", "circular")
      for shape, pad in (([2, 3, 6], [2, 3]), ([2, 3, 5, 4], [1, 0, 2, 3]), ([1, 2, 4, 3, 5], [1, 2, 0, 1, 2, 2]))],
    pytest.param(torch_case("pad", {"x": [3, 5, 4]}, ["x"], F.pad, pad=[3, 3, 0, 4], mode="circular"),
                 id="pad-circular-unbatched-full-wrap"),
    pytest.param(torch_case("pixel_shuffle", {"x": [2, 8, 3, 3]}, ["x"], F.pixel_shuffle, upscale_factor=2), id="pixel_shuffle"),
    pytest.param(spec_text({"x": [2, 1, 4, 1], "y": [3, 2, 5, 4, 6]},
                           [{"op": "expand", "shape": [3, -1, 5, -1, 6], "out": "out"}], SQ, ["x"]),
                 id="expand-new-and-size-one-dims"),
    pytest.param(spec_text({"x": [2, 3, 1, 1], "s": [2, 3, 4, 5], "y": [2, 3, 4, 5]},
                           [{"op": "expand", "in": "x", "shape": [{"like": "s"} for _ in range(4)], "out": "e"},
                            {"op": "mul", "in": ["e", "s"], "out": "out"}], SQ, ["x", "s"]),
                 id="expand-like-another-node"),
    pytest.param(torch_case("repeat", {"x": [2, 3, 4]}, ["x"], lambda x, counts: x.repeat(counts), counts=[1, 2, 3]),
                 id="repeat"),
    pytest.param(torch_case("repeat", {"x": [3, 2]}, ["x"], lambda x, counts: x.repeat(counts), counts=[2, 1, 2]),
                 id="repeat-new-leading-dim"),
    pytest.param(torch_case("pixel_unshuffle", {"x": [2, 3, 4, 6]}, ["x"], F.pixel_unshuffle, downscale_factor=2),
                 id="pixel_unshuffle"),
    pytest.param(torch_case("avg_pool2d", {"x": [2, 3, 7, 7]}, ["x"], F.avg_pool2d, kernel_size=3, stride=2, padding=1),
                 id="avg_pool2d-stride-padding"),
    pytest.param(torch_case("avg_pool1d", {"x": [2, 3, 9]}, ["x"], F.avg_pool1d, kernel_size=2), id="avg_pool1d-default-stride"),
    pytest.param(torch_case("avg_pool2d", {"x": [2, 2, 8, 7]}, ["x"], F.avg_pool2d, kernel_size=3, stride=2, padding=1, ceil_mode=True),
                 id="avg_pool2d-ceil_mode"),
    # a window past the input's end (VoVNet's 3x3 stride-2 ceil-mode pool of a 2x2 map): PyTorch takes it
    pytest.param(torch_case("max_pool2d", {"x": [2, 3, 2, 2]}, ["x"], F.max_pool2d, kernel_size=3, stride=2, ceil_mode=True),
                 id="max_pool2d-ceil_mode-kernel-beyond-input"),
    pytest.param(torch_case("avg_pool2d", {"x": [2, 3, 2, 3]}, ["x"], F.avg_pool2d, kernel_size=3, stride=2, ceil_mode=True),
                 id="avg_pool2d-ceil_mode-kernel-beyond-input"),
    pytest.param(torch_case("avg_pool2d", {"x": [2, 2, 7, 6]}, ["x"], F.avg_pool2d, kernel_size=[3, 2], stride=2, padding=1,
                            count_include_pad=False), id="avg_pool2d-padding-not-counted"),
    pytest.param(torch_case("avg_pool3d", {"x": [1, 2, 5, 4, 5]}, ["x"], F.avg_pool3d, kernel_size=2, stride=[2, 1, 2], padding=1,
                            ceil_mode=True, divisor_override=3), id="avg_pool3d-ceil_mode-divisor_override"),
    pytest.param(torch_case("avg_pool1d", {"x": [2, 2, 10]}, ["x"], F.avg_pool1d, kernel_size=2, stride=3, ceil_mode=True,
                            count_include_pad=False), id="avg_pool1d-ceil_mode-ragged-not-counted"),
    pytest.param(torch_case("avg_pool3d", {"x": [1, 2, 5, 4, 6]}, ["x"], F.avg_pool3d, kernel_size=[2, 2, 3], stride=[2, 1, 2]),
                 id="avg_pool3d"),
    pytest.param(torch_case("narrow", {"x": [2, 5, 3]}, ["x"], torch.narrow, dim=1, start=1, length=3), id="narrow"),
    pytest.param(torch_case("narrow", {"x": [2, 5, 4]}, ["x"], torch.narrow, dim=-1, start=0, length=2), id="narrow-last-dim"),
    pytest.param(torch_case("interpolate", {"x": [2, 3, 3, 4]}, ["x"], F.interpolate, scale_factor=2), id="interpolate-nearest"),
    pytest.param(torch_case("interpolate", {"x": [2, 2, 3, 2, 2]}, ["x"], F.interpolate, scale_factor=[1, 2, 3]),
                 id="interpolate-nearest-3d-per-axis"),
    *[pytest.param(torch_case("interpolate", {"x": shape}, ["x"], F.interpolate, **args),
                   id="interpolate-" + "-".join(f"{k}={v}" for k, v in args.items()).replace(" ", ""))
      for shape, args in [([2, 3, 5, 4], {"scale_factor": 1.5, "mode": "bilinear"}),
                          ([2, 2, 5, 4], {"size": [7, 3], "mode": "bilinear", "align_corners": True}),
                          ([1, 2, 4, 5], {"scale_factor": [2, 0.6], "mode": "bicubic", "align_corners": False}),
                          ([2, 2, 9, 8], {"size": [4, 3], "mode": "bicubic", "antialias": True}),
                          ([2, 2, 8, 7], {"scale_factor": 0.5, "mode": "bilinear", "antialias": True}),
                          ([2, 3, 6], {"size": 11, "mode": "linear"}),
                          ([1, 2, 3, 4, 3], {"scale_factor": [2, 1.5, 1], "mode": "trilinear", "align_corners": True}),
                          ([2, 2, 7, 5], {"size": [3, 2], "mode": "area"}),
                          ([2, 2, 5, 4], {"scale_factor": 1.5, "mode": "nearest"}),
                          ([2, 2, 5, 4], {"size": [8, 3], "mode": "nearest-exact"}),
                          ([2, 2, 5, 4], {"scale_factor": 1.7, "mode": "bilinear", "recompute_scale_factor": True})]],
    pytest.param(torch_case("adaptive_avg_pool1d", {"x": [2, 3, 7]}, ["x"], F.adaptive_avg_pool1d, output_size=3),
                 id="adaptive_avg_pool1d"),
    pytest.param(torch_case("adaptive_avg_pool2d", {"x": [2, 3, 7, 5]}, ["x"], F.adaptive_avg_pool2d, output_size=[3, None]),
                 id="adaptive_avg_pool2d-keep-one-dim"),
    pytest.param(torch_case("adaptive_avg_pool2d", {"x": [3, 9, 6]}, ["x"], F.adaptive_avg_pool2d, output_size=4),
                 id="adaptive_avg_pool2d-unbatched"),
    pytest.param(torch_case("adaptive_avg_pool3d", {"x": [1, 2, 5, 4, 3]}, ["x"], F.adaptive_avg_pool3d, output_size=[2, 3, 1]),
                 id="adaptive_avg_pool3d"),
    pytest.param(spec_text({"a": [2, 3, 4], "b": [2, 1, 4], "c": [2, 2, 4], "y": [2, 6, 4]},
                           [{"op": "cat", "in": ["a", "b", "c"], "dim": 1}], SQ, ["a", "b", "c"]), id="cat-three"),
    pytest.param(spec_text({"a": [2, 3], "b": [2, 3], "c": [2, 3], "y": [2, 3, 3]},
                           [{"op": "stack", "in": ["a", "b", "c"], "dim": -1}], SQ, ["a", "c"]), id="stack-last"),
    pytest.param(spec_text({"a": [2, 4, 3], "y": [2, 2, 4, 3]}, [{"op": "stack", "in": ["a", "a"], "dim": 1}], SQ, ["a"]),
                 id="stack-one-tensor-twice"),
    pytest.param(spec_text({"a": [2, 3], "y": [2, 6]}, [{"op": "cat", "in": ["a", "a"], "dim": -1}], SQ, ["a"]),
                 id="cat-same-tensor-twice"),
    pytest.param(spec_text({"x": [2, 3, 5, 4], "w": [2, 4, 3, 3], "y": [2, 2, 3, 2]},
                           [{"op": "full", "size": [{"like": "x"}, 1, {"like": "x"}, {"like": "x"}], "fill_value": 0.25,
                             "out": "level"},
                            {"op": "cat", "in": ["x", "level"], "dim": 1, "out": "joined"},
                            {"op": "conv2d", "in": "joined", "weight": "w", "out": "out"}], SQ, ["x", "w"]),
                 id="full-map-sized-like-x-concatenated"),
    pytest.param(torch_case("max_pool2d", {"x": [2, 3, 7, 7]}, ["x"], F.max_pool2d, kernel_size=3, stride=2, padding=1),
                 id="max_pool2d-overlapping-windows"),
    pytest.param(torch_case("max_pool1d", {"x": [2, 2, 9]}, ["x"], F.max_pool1d, kernel_size=2), id="max_pool1d"),
    pytest.param(torch_case("max_pool2d", {"x": [3, 7, 6]}, ["x"], F.max_pool2d, kernel_size=2, stride=[2, 1], padding=1),
                 id="max_pool2d-unbatched"),
    pytest.param(torch_case("avg_pool2d", {"x": [3, 7, 6]}, ["x"], F.avg_pool2d, kernel_size=3, stride=2, padding=1),
                 id="avg_pool2d-unbatched"),
    pytest.param(torch_case("max_pool2d", {"x": [2, 2, 8, 7]}, ["x"], F.max_pool2d, kernel_size=3, stride=2, padding=1, ceil_mode=True),
                 id="max_pool2d-ceil_mode"),
    pytest.param(torch_case("max_pool1d", {"x": [2, 2, 10]}, ["x"], F.max_pool1d, kernel_size=2, stride=3, ceil_mode=True),
                 id="max_pool1d-ceil_mode-ragged-last-window"),
    pytest.param(torch_case("max_pool2d", {"x": [2, 2, 2, 3]}, ["x"], F.max_pool2d, kernel_size=3, stride=2, ceil_mode=True),
                 id="max_pool2d-ceil_mode-kernel-overhangs-small-input"),
    pytest.param(torch_case("avg_pool2d", {"x": [2, 2, 2, 3]}, ["x"], F.avg_pool2d, kernel_size=3, stride=2, ceil_mode=True),
                 id="avg_pool2d-ceil_mode-kernel-overhangs-small-input"),
    pytest.param(torch_case("max_pool3d", {"x": [1, 2, 4, 5, 4]}, ["x"], F.max_pool3d, kernel_size=2, dilation=[1, 2, 1]),
                 id="max_pool3d-dilation"),
    pytest.param(spec_text({"x": [3, 2, 5], "w": [5], "b": [5], "y": [3, 2, 5]},
                           [{"op": "layer_norm", "weight": "w", "bias": "b", "normalized_shape": [5]}], SQ, ["x", "w", "b"]),
                 id="layer_norm-affine"),
    pytest.param(spec_text({"x": [2, 3, 4], "y": [2, 3, 4]}, [{"op": "layer_norm", "normalized_shape": [3, 4], "eps": 0.001}],
                           SQ, ["x"]), id="layer_norm-two-dims"),
    pytest.param(spec_text({"x": [4, 3, 2, 3], "w": [3], "b": [3], "y": [4, 3, 2, 3]},
                           [{"op": "batch_norm", "weight": "w", "bias": "b", "training": True}], SQ, ["x", "w", "b"]),
                 id="batch_norm-training"),
    pytest.param(spec_text({"x": [4, 3, 5], "m": [3], "v": [3], "w": [3], "y": [4, 3, 5]},
                           [{"op": "softplus", "in": "v", "out": "positive_var"},  # a variance is positive
                            {"op": "batch_norm", "in": "x", "running_mean": "m", "running_var": "positive_var", "weight": "w"}],
                           SQ, ["x", "w"]), id="batch_norm-eval"),
    pytest.param(spec_text({"x": [2, 4, 3, 3], "w": [4], "b": [4], "y": [2, 4, 3, 3]},
                           [{"op": "group_norm", "num_groups": 2, "weight": "w", "bias": "b"}], SQ, ["x", "w", "b"]),
                 id="group_norm"),
    pytest.param(spec_text({"table": [9, 2], "i": {"shape": [4, 4], "dtype": "int64"}, "y": [4, 4, 2]},
                           [{"op": "index", "in": "table", "index": "i"}], SQ, ["table"]), id="index-table-2d-index"),
    pytest.param(spec_text({"x": [2, 5, 3], "i": {"shape": [4], "dtype": "int64"}, "y": [2, 4, 3]},
                           [{"op": "index", "in": "x", "index": "i", "dim": 1}], SQ, ["x"]), id="index-dim1"),
    pytest.param(spec_text({"x": [2, 5, 3], "i": {"shape": [2, 4, 3], "dtype": "int64"}, "y": [2, 4, 3]},
                           [{"op": "gather", "in": "x", "index": "i", "dim": 1}], SQ, ["x"]), id="gather-dim1"),
    pytest.param(spec_text({"x": [3, 4, 5], "i": {"shape": [2, 4, 7], "dtype": "int64"}, "y": [2, 4, 7]},
                           [{"op": "gather", "in": "x", "index": "i", "dim": -1}], SQ, ["x"]),
                 id="gather-last-dim-index-smaller-and-longer"),
    pytest.param(spec_text({"w": [5, 3], "i": {"shape": [2, 4], "dtype": "int64"}, "y": [2, 4, 3]},
                           [{"op": "embedding", "in": "i", "weight": "w"}], SQ, ["w"]), id="embedding"),
    pytest.param(torch_case("addmm", {"b": [4], "x": [3, 5], "w": [5, 4]}, ["b", "x", "w"], torch.addmm,
                            in_names=["b", "x", "w"]), id="addmm-bias-broadcast"),
    pytest.param(spec_text({"q": [2, 2, 3, 4], "k": [2, 2, 5, 4], "y": [2, 2, 3, 5]},
                           [{"op": "attention_probabilities", "in": ["q", "k"]}], SQ, ["q", "k"]),
                 id="attention_probabilities"),
    pytest.param(spec_text({"q": [2, 4, 3], "k": [2, 4, 3], "y": [2, 4, 4]},
                           [{"op": "attention_probabilities", "in": ["q", "k"], "is_causal": True, "scale": 0.3}],
                           SQ, ["q", "k"]), id="attention_probabilities-causal-scale"),
    pytest.param(spec_text({"q": [2, 3, 4], "k": [2, 5, 4], "m": [3, 5], "y": [2, 3, 5]},
                           [{"op": "attention_probabilities", "in": ["q", "k"], "attn_mask": "m"}], SQ, ["q", "k", "m"]),
                 id="attention_probabilities-mask"),
    pytest.param(spec_text({"t": [3], "y": [3, 4]},
                           [{"op": "unsqueeze", "in": "t", "dim": 1, "out": "column"},
                            {"op": "constant", "in": "t", "values": [1.0, 0.1, 0.01, 0.001], "shape": [1, 4], "out": "freqs"},
                            {"op": "mul", "in": ["column", "freqs"], "out": "args"}, {"op": "sin", "in": "args"}],
                           SQ, ["t"]), id="constant-timestep-frequencies"),
    pytest.param(spec_text({"t": [3], "y": [2, 2]},
                           [{"op": "constant", "in": "t", "values": [1.0, 0.5, -2.0, 0.25], "shape": [2, 2], "out": "c"},
                            {"op": "sum", "in": "t", "dim": [0], "keepdim": True, "out": "s"},
                            {"op": "mul", "in": ["c", "s"]}], SQ, ["t"]), id="constant-read-for-dtype-only"),
    pytest.param(spec_text({"a": [2, 3], "t": {"shape": [2], "dtype": "int64"}, "y": [2, 3]},
                           [{"op": "cast", "in": "t", "like": "a", "out": "time"},
                            {"op": "unsqueeze", "in": "time", "dim": 1, "out": "column"},
                            {"op": "mul", "in": ["a", "column"], "out": "scaled"},
                            {"op": "cast", "in": "scaled", "like": "y"}], SQ, ["a"]), id="cast-int64-and-float"),
    pytest.param(spec_text({"x": [2, 4], "y": [2, 4]},
                           [{"op": "size_check", "in": "x", "left": {"like": "x", "size": "2 * ceil(shape[1] / 2)"},
                             "right": {"like": "x", "dims": [1]}, "relation": "ne", "holds": False, "line": "m.py:3",
                             "text": "2*ceil(x.shape[1]/2) != x.shape[1]", "out": "checked"},
                            {"op": "mul", "in": "checked", "other": 2}], SQ, ["x"]), id="size_check-even-width"),
    pytest.param(torch_case("clamp", {"x": [2, 3, 4]}, ["x"], torch.clamp, max=0.5), id="clamp-max-only"),
    pytest.param(torch_case("clamp", {"x": [2, 3, 4]}, ["x"], torch.clamp, min=-0.25, max=0.75), id="clamp-both"),
    pytest.param(torch_case("sin", {"x": [2, 3, 4]}, ["x"], torch.sin), id="sin"),
    pytest.param(torch_case("cos", {"x": [2, 3, 4]}, ["x"], torch.cos), id="cos"),
    pytest.param(torch_case("prelu", {"x": [2, 3, 4, 5], "w": [3]}, ["x", "w"], F.prelu, in_names=["x"])
                 .replace("op: prelu", "op: prelu\n  weight: w"), id="prelu-per-channel"),
    pytest.param(torch_case("prelu", {"x": [2, 3, 4], "w": [1]}, ["x", "w"], F.prelu, in_names=["x"])
                 .replace("op: prelu", "op: prelu\n  weight: w\n  shared: true"), id="prelu-shared"),
    pytest.param(torch_case("addcmul", {"a": [2, 3, 4, 5], "b": [2, 3, 1, 1], "c": [3, 4, 5]}, ["a", "b", "c"],
                            torch.addcmul, in_names=["a", "b", "c"], value=0.5), id="addcmul-broadcast"),
    pytest.param(torch_case("vector_norm", {"x": [2, 3, 4, 5]}, ["x"], torch.linalg.vector_norm, dim=[1, 2],
                            keepdim=True), id="vector_norm-keepdim"),
    pytest.param(torch_case("vector_norm", {"x": [2, 3, 4]}, ["x"], torch.linalg.vector_norm, dim=[-1]),
                 id="vector_norm-last"),
    pytest.param(torch_case("roll", {"x": [2, 5, 4, 3]}, ["x"], torch.roll, shifts=[-2, 3], dims=[1, 2]),
                 id="roll-two-dims"),
    pytest.param(torch_case("adaptive_max_pool2d", {"x": [2, 3, 7, 5]}, ["x"], F.adaptive_max_pool2d, output_size=[3, 2]),
                 id="adaptive_max_pool2d-overlapping-windows"),
    pytest.param(torch_case("adaptive_max_pool1d", {"x": [2, 3, 9]}, ["x"], F.adaptive_max_pool1d, output_size=1),
                 id="adaptive_max_pool1d-global"),
    pytest.param(torch_case("adaptive_max_pool3d", {"x": [1, 2, 4, 3, 5]}, ["x"], F.adaptive_max_pool3d,
                            output_size=[2, 2, 3]), id="adaptive_max_pool3d"),
    pytest.param(torch_case("amax", {"x": [2, 3, 4, 5]}, ["x"], torch.amax, dim=[2, 3], keepdim=True), id="amax-space-keepdim"),
    pytest.param(torch_case("amax", {"x": [2, 3, 4, 5]}, ["x"], torch.amax, dim=[1]), id="amax-channels"),
    pytest.param(torch_case("max", {"x": [2, 3, 4, 5]}, ["x"], lambda x, **a: torch.max(x, **a).values, dim=1,
                            keepdim=True), id="max-channels-keepdim"),
    pytest.param(torch_case("max", {"x": [2, 3, 4]}, ["x"], lambda x, **a: torch.max(x, **a).values, dim=-1),
                 id="max-last-dim"),
    pytest.param(torch_case("min", {"x": [2, 3, 4, 5]}, ["x"], lambda x, **a: torch.min(x, **a).values, dim=2),
                 id="min-dim2"),
    pytest.param(spec_text({"x": [2, 3, 7, 5], "y": [2, 3, 4, 5]}, [{"op": "slice", "dim": 2, "step": 2}], SQ, ["x"]),
                 id="slice-every-2nd-odd-size"),
    pytest.param(spec_text({"x": [2, 3, 4, 9], "y": [2, 3, 4, 3]},
                           [{"op": "slice", "dim": -1, "start": 1, "end": 8, "step": 3}], SQ, ["x"]), id="slice-start-end-step3"),
    pytest.param(spec_text({"x": [2, 3, 4, 3], "w": [3], "b": [3], "y": [2, 3, 4, 3]},
                           [{"op": "instance_norm", "weight": "w", "bias": "b"}], SQ, ["x", "w", "b"]),
                 id="instance_norm-affine"),
    pytest.param(spec_text({"x": [2, 3, 2, 3, 2], "y": [2, 3, 2, 3, 2]}, [{"op": "instance_norm", "eps": 0.001}], SQ, ["x"]),
                 id="instance_norm-3d"),
    pytest.param(spec_text({"x": [2, 3, 5], "m": [3], "v": [3], "w": [3], "y": [2, 3, 5]},
                           [{"op": "softplus", "in": "v", "out": "positive_var"},
                            {"op": "instance_norm", "in": "x", "running_mean": "m", "running_var": "positive_var",
                             "weight": "w", "use_input_stats": False}], SQ, ["x", "w"]), id="instance_norm-running-stats"),
    pytest.param(torch_case("linear", {"x": [4, 5], "w": [3, 5], "b": [3]}, ["x", "w", "b"],
                            lambda x, w, b: F.linear(x, w, b), in_names=None).replace("op: linear", "op: linear\n  weight: w\n  bias: b"),
                 id="linear-bias"),
    pytest.param(torch_case("linear", {"x": [2, 4, 5], "w": [3, 5]}, ["x", "w"], lambda x, w: F.linear(x, w))
                 .replace("op: linear", "op: linear\n  weight: w"), id="linear-rank3"),
    pytest.param(torch_case("matmul", {"a": [2, 3, 4], "b": [2, 4, 5]}, ["a", "b"], torch.matmul, in_names=["a", "b"]),
                 id="matmul-batched"),
    pytest.param(torch_case("matmul", {"a": [2, 3, 4, 5], "b": [5, 3]}, ["a", "b"], torch.matmul, in_names=["a", "b"]),
                 id="matmul-broadcast-rank"),
    pytest.param(torch_case("matmul", {"a": [2, 1, 3, 4], "b": [3, 4, 2]}, ["a", "b"], torch.matmul, in_names=["a", "b"]),
                 id="matmul-broadcast-size-1"),
    pytest.param(torch_case("scaled_dot_product_attention", {"q": [2, 2, 4, 3], "k": [2, 2, 5, 3], "v": [2, 2, 5, 6]},
                            ["q", "k", "v"], F.scaled_dot_product_attention, in_names=["q", "k", "v"]),
                 id="scaled_dot_product_attention"),
    pytest.param(torch_case("scaled_dot_product_attention", {"q": [2, 3, 4, 3], "k": [2, 3, 4, 3], "v": [2, 3, 4, 2]},
                            ["q", "k", "v"], F.scaled_dot_product_attention, in_names=["q", "k", "v"], is_causal=True,
                            scale=0.7), id="scaled_dot_product_attention-causal-scale"),
    pytest.param(torch_case("scaled_dot_product_attention", {"q": [2, 3, 3, 2], "k": [2, 3, 5, 2], "v": [2, 3, 5, 2]},
                            ["q", "k", "v"], F.scaled_dot_product_attention, in_names=["q", "k", "v"], is_causal=True),
                 id="scaled_dot_product_attention-causal-fewer-queries"),
    pytest.param(spec_text({"q": [2, 2, 4, 3], "k": [2, 2, 5, 3], "v": [2, 2, 5, 3], "m": [2, 1, 4, 5], "y": [2, 2, 4, 3]},
                           [{"op": "scaled_dot_product_attention", "in": ["q", "k", "v"], "attn_mask": "m", "out": "out"}],
                           SQ, ["q", "k", "v", "m"]), id="scaled_dot_product_attention-additive-mask"),
    pytest.param(torch_case("einsum", {"q": [2, 3, 4, 5], "k": [2, 3, 6, 5]}, ["q", "k"],
                            lambda q, k: torch.einsum("bhid,bhjd->bhij", q, k), in_names=["q", "k"])
                 .replace("  out: out", "  equation: bhid,bhjd->bhij\n  out: out"), id="einsum-attention-scores"),
    pytest.param(torch_case("einsum", {"a": [3, 4], "b": [4, 5], "c": [5, 2]}, ["a", "b", "c"],
                            lambda a, b, c: torch.einsum("ij,jk,kl->il", a, b, c), in_names=["a", "b", "c"])
                 .replace("  out: out", "  equation: ij,jk,kl->il\n  out: out"), id="einsum-three-operands"),
    pytest.param(torch_case("einsum", {"a": [3, 4], "b": [4, 5]}, ["a", "b"],
                            lambda a, b: torch.einsum("ij,jk", a, b), in_names=["a", "b"])
                 .replace("  out: out", "  equation: ij,jk\n  out: out"), id="einsum-implicit-output"),
    *[pytest.param(spec_text({"x": [4, 5], "w": [3, 5], "t": {"shape": [4], "dtype": "int64"}},
                             [{"op": "linear", "weight": "w", "out": "logits"}],
                             {"op": loss, "in": "logits", "target": "t", **({"reduction": r} if r else {})}, ["x", "w"]),
                   id=f"{loss}-{r or 'default'}")
      for loss in ("cross_entropy", "nll_loss") for r in (None, "sum", "per_sample")],
    pytest.param(spec_text({"x": [2, 3, 4, 5], "w": [4, 3, 1, 1], "t": {"shape": [2, 4, 5], "dtype": "int64"}},
                           [{"op": "conv2d", "weight": "w", "out": "scores"}],
                           {"op": "cross_entropy", "in": "scores", "target": "t", "reduction": "per_sample"}, ["x", "w"]),
                 id="cross_entropy-segmentation-per_sample"),
    # found by the fuzzer: sympy folds x - x to the number 0; forward and gradient must stay tensors
    pytest.param(spec_text({"x": [2, 3], "y": [2, 3]}, [{"op": "sub", "in": ["x", "x"]}], SQ, ["x"]),
                 id="sub-same-node-cancels"),
    pytest.param(spec_text({"x": [1, 1, 5, 5], "w": [1, 1, 1, 1], "y": [1, 1, 5, 5]},
                           [{"op": "sub", "in": ["x", "x"], "out": "d"}, {"op": "conv2d", "weight": "w", "out": "c"}],
                           SQ, ["x", "w"]), id="conv-of-cancelled-difference"),
]


def _seeded(module):
    """The generated module's functions, each run from torch's seed 0."""
    import types

    def seeded(function):
        def run(*arguments, **keywords):
            with torch.random.fork_rng():
                torch.manual_seed(0)
                return function(*arguments, **keywords)
        return run

    names = ("forward", "gradients", "hvp", "loss_with_explicit_backward")
    return types.SimpleNamespace(**{**vars(module), **{name: seeded(getattr(module, name)) for name in names}})


@pytest.mark.parametrize("text", CASES)
def test_rule_matches_autograd_and_is_twice_differentiable(text):
    built = build_text(text, extras=("hvp",))
    module = generated_module(built)
    if any(getattr(node.rule, "random", False) for node in built.graph.nodes.values() if node.rule):
        module = _seeded(module)  # dropout: every call draws the same masks, as two runs of a model from one seed
    report = verify(built.graph, module, built.shapes, seed=11)
    assert report.forward_error <= 1e-12
    for name, error in report.gradient_errors.items():
        assert error <= 1e-10, (name, error)

    inputs = random_inputs(built.shapes[0], built.graph.wrt, seed=12, classes=built.graph.class_counts(built.shapes[0]))
    fixed = {name: value.detach() for name, value in inputs.items() if name not in built.graph.wrt}
    wrt = [inputs[name] for name in built.graph.wrt]

    def loss(*values):
        return module.loss_with_explicit_backward(**fixed, **dict(zip(built.graph.wrt, values)))

    assert torch.autograd.gradcheck(loss, wrt)
    assert torch.autograd.gradgradcheck(loss, wrt)

    # the closed-form Hessian-vector product against forward-over-reverse autograd
    inputs = random_inputs(built.shapes[0], built.graph.wrt, seed=15, classes=built.graph.class_counts(built.shapes[0]))
    names = list(inputs)
    cotangent = torch.randn(module.forward(**inputs).shape, dtype=torch.float64, generator=torch.Generator().manual_seed(16))
    primals = tuple(inputs[name].detach() for name in built.graph.wrt)
    directions = tuple(torch.randn_like(p) for p in primals)

    def weighted_loss(*values):
        arguments = {**{name: inputs[name].detach() for name in names}, **dict(zip(built.graph.wrt, values))}
        return (cotangent * module.forward(**arguments)).sum()

    try:  # scaled_dot_product_attention through PyTorch's math kernel, the one with forward AD on a CPU
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            _, expected = torch.func.jvp(torch.func.grad(weighted_loss, argnums=tuple(range(len(primals)))), primals,
                                         directions)
    except NotImplementedError:  # PyTorch cannot differentiate hardsigmoid_backward at all: forward AD through the
        def explicit(*values):  # explicit gradients instead (checked against autograd below, and by gradgradcheck above)
            result = module.gradients(**{**{name: inputs[name].detach() for name in names},
                                         **dict(zip(built.graph.wrt, values))}, grad_loss=cotangent)
            return tuple(getattr(result, name) for name in built.graph.wrt)

        _, expected = torch.func.jvp(explicit, primals, directions)
    actual = module.hvp(**{name: inputs[name].detach() for name in names},
                        **{f"tangent_{name}": d for name, d in zip(built.graph.wrt, directions)}, grad_loss=cotangent)
    for name, reference in zip(built.graph.wrt, expected):
        assert relative_error(getattr(actual, name), reference) <= 1e-10, ("hvp", name)

    # gradients with the inputs' own cotangent at every test shape: the same gradients, inputs untouched
    for shapes in built.shapes:
        inputs = random_inputs(shapes, built.graph.wrt, seed=13, classes=built.graph.class_counts(shapes))
        before = {name: value.detach().clone() for name, value in inputs.items()}
        reference = module.forward(**inputs)
        cotangent = torch.randn(reference.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(14))
        expected = torch.autograd.grad(reference, [inputs[name] for name in built.graph.wrt], cotangent)
        actual = module.gradients(**inputs, grad_loss=cotangent)
        for name, gradient in zip(built.graph.wrt, expected):
            assert relative_error(getattr(actual, name), gradient) <= 1e-10, name
        for name, value in inputs.items():
            assert torch.equal(value, before[name]), name


def _moves_to_channels_last(text: str) -> bool:
    """Whether the case has a 2-d convolution that channels_last is chosen for once size is no object."""
    return bool(channels_last_inputs(build_graph(parse_spec(text, "case.yaml")), min_positions=1))


CHANNELS_LAST_CASES = [case for case in CASES if _moves_to_channels_last(case.values[0])]


def test_no_rule_emits_a_view_which_a_channels_last_tensor_can_refuse():
    """The layout choice relies on every emitted op taking any strides (a shape `.view` raises on some;
    a view as a dtype of the same size, a mask's `.bool().view(torch.uint8)`, takes any strides)."""
    from pathlib import Path

    import symgrad

    sources = [*(Path(symgrad.__file__).parent / "rules").glob("*.py"), Path(symgrad.__file__).parent / "printing.py"]
    assert [path.name for path in sources if re.search(r"\.view\((?!torch\.uint8\))", path.read_text())] == []
    for layout in (torch.contiguous_format, torch.channels_last):
        mask = torch.randn(2, 3, 4, 5).contiguous(memory_format=layout)[:, 1:, ::2].bool()
        assert torch.equal(mask.view(torch.uint8), mask.to(torch.uint8))


def test_enough_cases_reach_the_channels_last_layout():
    assert len(CHANNELS_LAST_CASES) >= 10


@pytest.mark.parametrize("text", CHANNELS_LAST_CASES)
def test_channels_last_internal_layout_keeps_the_gradients_and_the_callers_layout(text, monkeypatch):
    monkeypatch.setattr(roles, "CHANNELS_LAST_MIN_POSITIONS", 1)  # the small test shapes take the path too
    built = build_text(text)
    module = generated_module(built)
    assert "memory_format=torch.channels_last" in built.rendered.files[f"{built.rendered.name}.py"]
    report = verify(built.graph, module, built.shapes, seed=21)
    assert report.problem is None, report.problem
    for name, error in report.gradient_errors.items():
        assert error <= 1e-10, (name, error)

    wrt = built.graph.wrt
    for layout in (torch.contiguous_format, torch.channels_last):
        inputs = random_inputs(built.shapes[0], wrt, seed=22, classes=built.graph.class_counts(built.shapes[0]))
        inputs = {name: (value.detach().contiguous(memory_format=layout).requires_grad_(value.requires_grad)
                         if value.dim() == 4 and value.is_floating_point() else value) for name, value in inputs.items()}
        reference = module.forward(**inputs)
        cotangent = torch.randn(reference.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(23))
        expected = torch.autograd.grad(reference, [inputs[name] for name in wrt], cotangent)
        detached = {name: value.detach() for name, value in inputs.items()}
        results = {"gradients": module.gradients(**detached, grad_loss=cotangent)}
        for recompute in (False, True):
            copies = {name: value.detach().clone(memory_format=torch.preserve_format).requires_grad_(name in wrt)
                      for name, value in inputs.items()}
            module.loss_with_explicit_backward(**copies, recompute=recompute).backward(cotangent)
            results[f"ExplicitGradient, recompute={recompute}"] = {name: copies[name].grad for name in wrt}
        for function, result in results.items():
            for name, gradient in zip(wrt, expected):
                actual = result[name] if isinstance(result, dict) else getattr(result, name)
                assert relative_error(actual, gradient) <= 1e-10, (function, name)
                if inputs[name].dim() == 4:  # returned in the layout the caller's tensor has
                    assert actual.is_contiguous(memory_format=layout), (function, name, layout)

        fixed = {name: value for name, value in detached.items() if name not in wrt}
        leaves = [detached[name].clone(memory_format=torch.preserve_format).requires_grad_() for name in wrt]

        def loss(*values):
            return module.loss_with_explicit_backward(**fixed, **dict(zip(wrt, values)))

        assert torch.autograd.gradcheck(loss, leaves)
        assert torch.autograd.gradgradcheck(loss, leaves)


def test_every_rule_has_a_case():
    covered = {line.split("op: ")[1].split()[0].strip(",}") for case in CASES for line in case.values[0].splitlines()
               if "op: " in line}
    assert {rule.op for rule in all_rules()} <= covered


def test_relu_mask_is_derived_by_sympy_with_pytorchs_kink_convention():
    import sympy

    from symgrad.rules import LAYER_RULES
    from symgrad.rules.elementwise import INPUT as x

    relu = LAYER_RULES["relu"]
    assert relu.local_derivative(x) == sympy.Heaviside(x, 0)  # sympy's d/dx max(0, x), with H(0) = 0
    # the emitted mask reads the output instead: H(x) == H(relu(x)) everywhere, the kink included
    for value in (-2, -sympy.Rational(1, 3), 0, sympy.Rational(1, 7), 5):
        assert relu.local_derivative(x).subs(x, value) == relu.from_output(sympy.Max(0, value))

    built = build_text(spec_text({"x": [4], "y": [4]}, [{"op": "relu"}], SQ, ["x"]))
    mask = next(s for s in built.program.backward if s.target.name.startswith("mask_"))
    assert mask.value == sympy.Heaviside(sympy.Symbol("relu_1"), 0)
    module = generated_module(built)
    inputs = torch.tensor([-1.0, 0.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    y = torch.zeros(4, dtype=torch.float64)
    expected, = torch.autograd.grad(module.forward(inputs, y), inputs)
    assert torch.equal(module.gradients(inputs, y).x, expected)  # relu'(0) = 0, as PyTorch


PER_SAMPLE_CASES = [case for case in CASES if case.id.startswith("conv") and "weight-only" not in case.id
                    and "unbatched" not in case.id]  # one unbatched input is one sample: refused, tested below


@pytest.mark.parametrize("text", PER_SAMPLE_CASES)
def test_per_sample_kernel_gradients_match_vmap_of_grad(text):
    text = text.replace("reduction: sum", "reduction: per_sample")
    built = build_text(text, extras=("per_sample",))
    module = generated_module(built)
    inputs = {name: value.detach() for name, value in random_inputs(built.shapes[1], (), seed=21).items()}
    cotangent = torch.randn(module.forward(**inputs).shape, dtype=torch.float64, generator=torch.Generator().manual_seed(22))
    from symgrad.shapes import batch_inputs

    batched = batch_inputs(built.graph)
    assert "x" in batched and "y" in batched and "w" not in batched
    parameters = [name for name in built.graph.wrt if name not in batched]

    def one_sample_loss(parameter_values, sample_values, weight):
        values = {**inputs, **dict(zip(parameters, parameter_values)),
                  **{name: value.unsqueeze(0) for name, value in zip(batched, sample_values)}}
        return weight * module.forward(**values)[0]

    expected = torch.func.vmap(torch.func.grad(one_sample_loss), in_dims=(None, 0, 0))(
        tuple(inputs[name] for name in parameters), tuple(inputs[name] for name in batched), cotangent)
    actual = module.per_sample_gradients(**inputs, grad_loss=cotangent)
    assert list(actual._fields) == parameters
    for name, reference in zip(parameters, expected):
        assert relative_error(getattr(actual, name), reference) <= 1e-10, name

    def per_sample_of_parameters(*parameter_values):
        return tuple(module.per_sample_gradients(**{**inputs, **dict(zip(parameters, parameter_values))},
                                                 grad_loss=cotangent))
    wanted = tuple(inputs[name].clone().requires_grad_() for name in parameters)
    assert torch.autograd.gradcheck(per_sample_of_parameters, wanted, fast_mode=True)
    assert torch.autograd.gradgradcheck(per_sample_of_parameters, wanted, fast_mode=True)


def test_per_sample_products_run_as_soon_as_their_gradient_exists_and_free_it():
    """Each per-sample product is scheduled right after the output gradient it reads, which is then
    deleted, instead of every gradient living to the end of the function."""
    import ast

    tree = ast.parse((ROOT / "generated" / "seed3_conv_relu_conv.py").read_text())
    function = next(node for node in tree.body if getattr(node, "name", "") == "per_sample_gradients")
    lines = [ast.unparse(statement) for statement in function.body[:-1]  # statements, however each is wrapped
             if not isinstance(statement, ast.Expr)]  # (not the docstring)
    product = next(i for i, line in enumerate(lines) if line.startswith("per_sample_grad_w2 ="))
    assert lines[product - 2].startswith("grad_conv2 =")  # made, its forward inputs freed, then read at once
    assert lines[product + 1].startswith("grad_relu1 =") and lines[product + 2] == "del grad_conv2"
    assert lines[-1] == "del grad_conv1"


def test_per_sample_refuses_what_it_cannot_derive():
    from symgrad.errors import SpecError

    scale = spec_text({"x": [2, 3], "s": [1, 3], "y": [2, 3]}, [{"op": "mul", "in": ["x", "s"]}],
                      {**SQ, "reduction": "per_sample"}, ["x", "s"])
    with pytest.raises(SpecError, match="per-sample gradients of 's' as the other of mul"):
        build_text(scale, extras=("per_sample",))
    with pytest.raises(SpecError, match="reduction: per_sample"):
        build_text(CASES[0].values[0], extras=("per_sample",))
    unbatched = next(case.values[0] for case in CASES if case.id == "conv2d-unbatched-groups-bias")
    with pytest.raises(SpecError, match="per-sample gradients of 'x' as the input of conv2d 'out' are not supported"):
        build_text(unbatched.replace("reduction: sum", "reduction: per_sample"), extras=("per_sample",))


def test_generated_test_file_of_a_classification_spec_passes(tmp_path):
    """The generated test draws class indices below each shape set's class count."""
    import subprocess
    import sys

    text = spec_text({"x": [4, 5], "w": [3, 5], "t": {"shape": [4], "dtype": "int64"}},
                     [{"op": "linear", "weight": "w", "out": "logits"}], {"op": "cross_entropy", "in": "logits", "target": "t"},
                     ["x", "w"], name="classifier")
    for name, content in build_text(text).rendered.files.items():
        (tmp_path / name).write_text(content)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_classifier.py")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:]


def _declared_lacks(rule, tested_ops: set[str], certified_ops: set[str]) -> list[str]:
    """What a rule still lacks of the op contract (``symgrad/rules/base.py``), in words a contributor
    can act on: every fact the tracer, the checker, the docs and the certificates read from it."""
    from symgrad.rules.base import Rule
    from symgrad.trace.torch_names import torch_signature

    lacks = []
    if not rule.summary:
        lacks.append("summary (its one-line description in `symgrad ops`)")
    try:
        rule.table_row()
    except NotImplementedError:
        lacks.append("table_row (forward and local gradient for `symgrad ops` and docs/ops.md)")
    if not rule.calls and not rule.traced_elsewhere:
        lacks.append("calls (the torch calls `symgrad trace` records as this op), or traced_elsewhere saying why none")
    elif rule.calls and rule.signature is None:
        try:
            torch_signature(rule.op)
        except (LookupError, AttributeError):
            lacks.append("signature (PyTorch's positional argument names: it has none to read)")
    if type(rule).reference is Rule.reference and not (hasattr(torch.nn.functional, rule.op) or hasattr(torch, rule.op)):
        lacks.append("reference (how PyTorch computes the op, for `symgrad verify`)")
    if rule.op not in tested_ops:
        lacks.append("a case in tests/rules/test_rules.py CASES")
    if rule.linear_in and rule.op not in certified_ops:
        lacks.append("a certificate case in its rule file's CERTIFICATES (it is linear in "
                     + ", ".join(rule.linear_in) + ")")
    return lacks


def _tested_and_certified() -> tuple[set[str], set[str]]:
    from symgrad.rules import CERTIFICATE_CASES

    tested = {line.split("op: ")[1].split()[0].strip(",}") for case in CASES for line in case.values[0].splitlines()
              if "op: " in line}
    certified = {layer["op"] for _, _, layer, _ in CERTIFICATE_CASES} | {f"conv{dims}d" for dims in (1, 2, 3)}
    return tested, certified


def test_every_rule_declares_what_the_pipeline_reads():
    tested, certified = _tested_and_certified()
    lacking = {rule.op: _declared_lacks(rule, tested, certified) for rule in all_rules()}
    report = [f"rule {op} lacks: " + "; ".join(lacks) for op, lacks in lacking.items() if lacks]
    assert not report, "\n".join(report)


def test_a_new_rule_is_told_exactly_what_it_lacks():
    from symgrad.rules.base import Operand, Rule

    class Softsign(Rule):  # a contributor's first draft: the math is there, nothing else
        op = "softsign"
        operands = (Operand("input", from_in=True),)
        linear_in = ("input",)  # (not true; it makes the certificate check speak)

    tested, certified = _tested_and_certified()
    lacks = _declared_lacks(Softsign(), tested, certified)
    assert [item.split(" (")[0] for item in lacks] == [
        "summary", "table_row", "calls", "a case in tests/rules/test_rules.py CASES", "a certificate case in its rule file's CERTIFICATES"]


def test_each_torch_call_is_claimed_by_one_rule_and_bound_by_pytorchs_own_names():
    from symgrad.trace.torch_names import SIGNATURES

    assert SIGNATURES["relu_"] == ("relu", ("input", "inplace"))
    assert SIGNATURES["__radd__"][0] == "add" and SIGNATURES["squeeze"][1] == ("input", "dim")
    assert SIGNATURES["conv2d"][1] == ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    assert SIGNATURES["log"][1] == ("input",)  # torch.log's tensor schema, not math's log(a, b)
    claimed = [name for rule in all_rules() for name in rule.calls]
    assert len(claimed) == len(set(claimed))
