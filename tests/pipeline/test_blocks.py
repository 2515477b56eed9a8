"""Blocks (issue 23): a sub-chain written once and used per instance, in hand-written specs and in
traced models. Each block is derived once; the structured module agrees with the flat one (every
instance written out) and with autograd through the original module at another batch and spatial
size; bad block specs are refused in one line at their own line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import symgrad.pipeline
from benchmarks.structure import MOBILENET_V2
from symgrad.check import by_name, graph_inputs, module_from_source
from symgrad.errors import SpecError
from symgrad.pipeline import build, build_text
from symgrad.testdata import relative_errors
from symgrad.trace import LossChoice, trace
from tests.helpers import load_yaml, run_generated_tests
from tests.models import classic as models, zoo_nets
from tests.models.compare import Case, randomize, reference_loss, source_name
from tests.models.test_classic_cnns import CASES as MODELS
from tests.models.test_zoo_nets import CASES as NETS

ROOT = Path(__file__).resolve().parents[2]
UNROLLED = ROOT / "examples" / "unrolled_blocks.yaml"


def _derivations(monkeypatch) -> list:
    """The graph of each body the pipeline's walk derives from here on, a block's or a top body's,
    each twice, readable and fused."""
    derived = []
    real = symgrad.pipeline.derive
    monkeypatch.setattr(symgrad.pipeline, "derive", lambda graph, **kw: derived.append(graph) or real(graph, **kw))
    return derived


def test_a_block_used_four_times_is_derived_once_and_agrees_with_the_flat_form(monkeypatch):
    derived = _derivations(monkeypatch)
    # k is shared by the four steps: its gradients add
    source = _agrees_with_flat_and_autograd(UNROLLED.read_text(), str(UNROLLED))
    # the block's body readable and fused, not once per instance; the top body of each build (with blocks, flat)
    assert [graph.spec.name for graph in derived].count("gradient_step") == 2 and len(derived) == 2 + 2 + 2
    assert source.count("def gradient_step_backward(") == 1
    assert len(re.findall(r"= gradient_step_backward\(", source)) == 4
    assert "def gradient_step" not in build(UNROLLED, flat=True).rendered.files["unrolled_blocks.py"]
    document = build(UNROLLED).rendered.files["unrolled_blocks.md"]
    assert document.count("## Block gradient_step") == 1 and "Instances: x1, x2, x3, x4" in document


def test_extras_are_derived_on_the_flat_form():
    built = build(UNROLLED, extras=("hvp",))
    source = built.rendered.files["unrolled_blocks.py"]
    assert "def hvp(" in source and "def gradient_step_forward" not in source
    assert "# extras=hvp" in source.splitlines()[1]


BASE = """name: blocky
inputs:
  x: {shape: [2, 3, 8, 8]}
  w1: {shape: [3, 3, 3, 3]}
  w2: {shape: [3, 3, 3, 3]}
  t: {shape: [2, 3, 8, 8]}
blocks:
  unit:
    inputs: [h]
    params: [w]
    layers:
      - {op: conv2d, weight: w, padding: 1, out: c}
      - {op: relu, out: r}
layers:
  - {block: unit, in: x, params: {w: w1}, out: a}
  - {block: unit, in: a, params: {w: w2}, out: b}
loss: {op: mse_loss, target: t}
wrt: [x, w1, w2]
"""


@pytest.mark.parametrize(
    "old, new, line, words",
    [
        ("{block: unit, in: a,", "{block: unt, in: a,", 16, "unknown block 'unt'; did you mean 'unit'?"),
        ("in: a, params: {w: w2}", "in: a, params: {v: w2}", 16, "block 'unit' has no parameter 'v'"),
        ("in: a, params: {w: w2}, out: b}", "in: a, out: b}", 16, "does not bind its parameter 'w'"),
        ("in: a, params", "in: [a, x], params", 16, "takes 1 input(s) (h) but 2 are given"),
        ("      - {op: relu, out: r}", "      - {block: unit, out: r}", 13, "uses block 'unit' inside it"),
        (
            "    params: [w]\n",
            "    params: [w]\n    output: missing\n",
            11,
            "outputs 'missing', which none of its layers makes",
        ),
        ("    params: [w]\n", "    params: [w]\n    extra: 1\n", 11, "unknown key 'extra' at block 'unit'"),
        ("  unit:\n", "  relu:\n", 8, "block name 'relu' is already an op or a tensor name"),
        ("weight: w, padding", "weight: v, padding", 12, "'weight' names 'v', which is not defined"),
        ("params: {w: w2}, out: b}", "params: {w: w2}, offset: 2, out: b}", 16, "`offset:` numbers the children of a"),
        (
            "{block: unit, in: a, params: {w: w2}, out: b}",
            "{block: unit, in: a, prefix: p, offset: -1, out: b}",
            16,
            "offset must be a child's index, an int from 0, not '-1'",
        ),
        (
            "{block: unit, in: a, params: {w: w2}, out: b}",
            "{block: unit, in: a, prefix: p, offset: 1, out: b}",
            16,
            "with an offset, the key of parameter 'w' must start with a child's index",
        ),
    ],
)
def test_a_bad_block_is_refused_at_its_line(old, new, line, words):
    text = BASE.replace(old, new)
    assert text != BASE
    with pytest.raises(SpecError) as raised:
        build_text(text, "blocky.yaml")
    message = str(raised.value)
    assert f"blocky.yaml:{line}:" in message and words in message and "\n" not in message, message


def test_instances_whose_operands_differ_in_rank_are_refused():
    text = (
        BASE.replace("  x: {shape: [2, 3, 8, 8]}", "  x: {shape: [3, 8, 8]}")
        .replace("  t: {shape: [2, 3, 8, 8]}", "  t: {shape: [3, 8, 8]}")
        .replace(
            "  - {block: unit, in: a, params: {w: w2}, out: b}",
            "  - {op: unsqueeze, in: a, dim: 0, out: a4}\n  - {block: unit, in: a4, params: {w: w2}, out: b}\n"
            "  - {op: squeeze, in: b, dim: 0, out: b3}",
        )
    )
    with pytest.raises(SpecError, match="of other ranks or other size-1 axes") as raised:
        build_text(text, "blocky.yaml")
    assert "blocky.yaml:17:" in str(raised.value)
    assert build_text(text, "blocky.yaml", flat=True).rendered.files  # inlined, the same spec builds


HYPER = """name: strided
inputs:
  x: {shape: [2, 3, 16, 16]}
  w1: {shape: [4, 3, 3, 3]}
  w2: {shape: [4, 4, 3, 3]}
  w3: {shape: [4, 4, 1, 1]}
  t: {shape: [2, 4, 4, 4]}
blocks:
  down:
    inputs: [h]
    params: [w]
    hyper: {stride: 1, padding: 1}
    layers:
      - {op: conv2d, weight: w, stride: stride, padding: padding, out: c}
      - {op: relu, out: r}
layers:
  - {block: down, in: x, params: {w: w1}, out: a}
  - {block: down, in: a, params: {w: w2}, hyper: {stride: 2}, out: b}
  - {block: down, in: b, params: {w: w3}, hyper: {stride: 2, padding: 0}, out: c}
loss: {op: mse_loss, target: t}
wrt: [x, w1, w2, w3]
"""


def _agrees_with_flat_and_autograd(text: str, label: str) -> str:
    """The structured module of ``text`` against its flat module and autograd, float64, at the two
    small shape sets (other batch and spatial sizes than the spec's); returns its source."""
    structured, flat = build_text(text, label), build_text(text, label, flat=True)
    name = flat.graph.spec.name
    source = structured.rendered.files[f"{name}.py"]
    ours = by_name(module_from_source(source, name), flat.graph)
    theirs = by_name(module_from_source(flat.rendered.files[f"{name}.py"], f"{name}_flat"), flat.graph)
    graph = flat.graph
    for seed, shapes in enumerate(flat.shapes):
        inputs = graph_inputs(graph, shapes, seed=seed)
        cotangent = torch.randn(
            theirs.forward(**inputs).shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 7)
        )
        expected = torch.autograd.grad(theirs.forward(**inputs), [inputs[name] for name in graph.wrt], cotangent)
        structured_grads = ours.gradients(**inputs, grad_loss=cotangent)
        flat_grads = theirs.gradients(**inputs, grad_loss=cotangent)
        for name, reference in zip(graph.wrt, expected):
            ours_value = {name: getattr(structured_grads, name)}
            assert relative_errors(ours_value, {name: getattr(flat_grads, name)})[name] <= 1e-12
            assert relative_errors(ours_value, {name: reference})[name] <= 1e-10
    return source


def test_instances_that_differ_in_a_hyper_share_one_block_derived_once_per_value(monkeypatch):
    derived = _derivations(monkeypatch)
    source = _agrees_with_flat_and_autograd(HYPER, "strided.yaml")
    assert "def down_forward(h, p, stride=1, padding=1, save=False):" in source
    assert 'w_autocast = _in_autocast_dtype(p["w"])' in source  # the weight as the convolution reads it
    assert "F.conv2d(h, w_autocast, stride=stride, padding=padding)" in source  # every instance's value, by name
    assert 'down_forward(a, {"w": w2}, stride=2)' in source and "stride=2, padding=0)" in source
    assert source.count("def down_backward(") == 1
    # the block three times (once per distinct set of values and size-1 axes: the printed code must
    # agree), the top body once per build (with blocks, flat); readable and fused each
    assert [graph.spec.name for graph in derived].count("down") == 2 * 3 and len(derived) == 2 * 3 + 2 + 2
    document = build_text(HYPER, "strided.yaml").rendered.files["strided.md"]
    assert "hyperparameters, set per instance: stride (default 1), padding (default 1)" in document


@pytest.mark.parametrize(
    "old, new, line, words",
    [
        ("hyper: {stride: 2}, out: b", "hyper: {strides: 2}, out: b", 18, "block 'down' has no hyper 'strides'"),
        ("hyper: {stride: 2}, out: b", "hyper: {stride: two}, out: b", 18, "hyper 'stride' must be an int, not 'two'"),
        ("hyper: {stride: 2}, out: b", "hyper: {stride: 0}, out: b", 18, "argument 'stride' is 0, below"),
        (
            "hyper: {stride: 1, padding: 1}",
            "hyper: {stride: 1, padding: 1, groups: 1}",
            12,
            "declares hyper 'groups' but none of its layers reads it",
        ),
        (
            "hyper: {stride: 1, padding: 1}",
            "hyper: {stride: 1, padding: 1, w: 1}",
            10,
            "names 'w' twice among its inputs, params and hypers",
        ),
        ("hyper: {stride: 1, padding: 1}", "hyper: [stride]", 12, "must map names to default ints"),
    ],
)
def test_a_bad_hyper_is_refused_at_its_line(old, new, line, words):
    text = HYPER.replace(old, new)
    assert text != HYPER
    with pytest.raises(SpecError) as raised:
        build_text(text, "strided.yaml")
    message = str(raised.value)
    assert f"strided.yaml:{line}:" in message and words in message and "\n" not in message, message


def test_a_hyper_for_which_the_derivation_differs_is_refused_at_the_instance():
    """A softmax's dim is normalised against the rank (-1 is 3): the printed code shows the value, so
    one derivation cannot serve dim 1 and dim -1."""
    text = HYPER.replace(
        "      - {op: relu, out: r}", "      - {op: relu, out: r0}\n      - {op: softmax, dim: dim, out: r}"
    )
    text = text.replace("hyper: {stride: 1, padding: 1}", "hyper: {stride: 1, padding: 1, dim: 1}")
    with pytest.raises(SpecError, match="derivation differs from that of instance 'a'") as raised:
        build_text(text.replace("hyper: {stride: 2}, out: b", "hyper: {stride: 2, dim: -1}, out: b"), "strided.yaml")
    assert "strided.yaml:19:" in str(raised.value)


def test_the_command_line_refuses_a_bad_block_in_one_line_and_writes_nothing(tmp_path):
    spec = tmp_path / "blocky.yaml"
    spec.write_text(BASE.replace("{block: unit, in: a,", "{block: unt, in: a,"))
    result = subprocess.run(
        [sys.executable, "-m", "symgrad", "generate", str(spec), "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "blocky.yaml:16:" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------------------------
# Traced models: the repeated submodules become blocks
# --------------------------------------------------------------------------------------------

TRACED = {
    "resnet18": (MODELS["resnet18"], {"x": (2, 3, 32, 32)}, True),
    "unet_bilinear": (MODELS["unet_bilinear"], None, True),
    "vgg11_bn": (MODELS["vgg11_bn"], None, True),  # its features: runs of Conv2d, BatchNorm2d, ReLU
    "dncnn": (MODELS["dncnn"], None, True),  # conv, BatchNorm, ReLU five times in one Sequential
    "nafnet": (MODELS["nafnet"], None, True),
    "deeplabv3": (MODELS["deeplabv3"], None, True),  # its ASPP branches: one block, the dilation a hyper
    "resnet50": (NETS["resnet50"], None, True),
    "mobilenet_v2": (NETS["mobilenet_v2"], None, True),
    "densenet": (NETS["densenet"], None, True),
    "efficientnet_b0": (NETS["efficientnet_b0"], None, True),
    "regnety": (NETS["regnety"], None, True),
    "rcan": (NETS["rcan"], None, True),
    # traced at 4 x 4: the later SE gates' maps are 1 x 1, where expand_as derives otherwise than at 2 x 2
    "se_resnet_expand_as_gate": (NETS["se_resnet_expand_as_gate"], None, True),
    # torchvision's 17 inverted residuals (narrow): strides and depthwise groups as hypers, one loop
    "mobilenet_v2_17_blocks": (
        Case(
            zoo_nets.MobileNetV2,
            {"x": (2, 3, 32, 32)},
            {"x": (3, 3, 40, 24)},
            ("cross_entropy",),
            {"inverted_residual_setting": MOBILENET_V2},
        ),
        None,
        True,
    ),
    # VGG-16-BN (narrow): its features one Sequential, runs of conv, BatchNorm, ReLU between max-pools
    "vgg16_bn": (
        Case(
            models.VGG,
            {"x": (2, 3, 32, 32)},
            {"x": (3, 3, 32, 40)},
            ("cross_entropy",),
            {"configuration": "vgg16", "batch_norm": True, "classes": 5, "width": 8, "hidden": 16, "dropout": 0.0},
        ),
        None,
        True,
    ),
}
"""label: (case, traced shapes where another size gives more repeated blocks, whether blocks are expected)."""


def _structured_arguments(module, spec: dict, values: dict) -> dict:
    """The module's arguments: inputs with a ``source`` in one ``params`` mapping, the others by name."""
    sources = {name: entry["source"] for name, entry in spec["inputs"].items() if "source" in entry}
    if not sources:
        return values
    return {
        **{name: value for name, value in values.items() if name not in sources},
        "params": {sources[name]: values[name] for name in sources},
    }


SLOW = {"mobilenet_v2_17_blocks", "vgg16_bn"}
"""The deepest two (a minute each on 2 cores): marked slow, and run in CI."""


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize(
    "label", [pytest.param(label, marks=pytest.mark.slow) if label in SLOW else label for label in TRACED]
)
def test_a_traced_model_with_blocks_matches_autograd_on_the_original_module(label, mode):
    case, traced, expect_blocks = TRACED[label]
    traced = traced or case.traced
    kind = next(kind for kind in case.losses if kind not in ("half_sq_error_function", "nll_loss"))
    generator = torch.Generator().manual_seed(11)
    torch.manual_seed(0)
    model = case.model(**case.init).double()
    randomize(model, generator)
    model.train(mode == "train")
    text = trace(model, traced, name="traced", loss=LossChoice(kind), mode=mode, blocks=True)
    assert ("\nblocks:\n" in text) == expect_blocks, text[:2000]
    spec = load_yaml(text)
    built = build_text(text, f"{label}.yaml", documents=False, tests=False)  # the module alone: imported here
    widest = max(len(line) for line in built.rendered.files["traced.py"].splitlines())
    assert widest <= 100, (label, widest)
    module = module_from_source(built.rendered.files["traced.py"], "traced")
    inputs = {
        key: torch.randn(shape, generator=generator, dtype=torch.float64, requires_grad=True)
        for key, shape in case.checked.items()
    }  # another batch and spatial size than traced
    with torch.no_grad():
        prediction = model(*inputs.values())
    classes = spec["inputs"]["target"].get("dtype") == "int64"
    target = (
        torch.randint(prediction.shape[1], (prediction.shape[0],), generator=generator)
        if classes
        else torch.randn(prediction.shape, generator=generator, dtype=torch.float64)
    )
    named = {source_name("", path, model): value for path, value in [*model.named_parameters(), *model.named_buffers()]}
    values = {
        key: inputs.get(key) if key in inputs else target if key == "target" else named[key] for key in spec["inputs"]
    }
    weight = torch.randn((), generator=generator, dtype=torch.float64)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    loss = reference_loss(kind, model, list(inputs.values()), target)
    expected = torch.autograd.grad(loss, [values[key] for key in spec["wrt"]], grad_outputs=weight)
    model.load_state_dict(before)  # the train-mode forward moved the running statistics
    result = module.gradients(**_structured_arguments(module, spec, values), grad_loss=weight)
    fields = result._asdict()
    sources = {name: entry["source"] for name, entry in spec["inputs"].items() if "source" in entry}
    scale = max(reference.abs().max().item() for reference in expected)
    for key, reference in zip(spec["wrt"], expected):
        value = fields["params"][sources[key]] if key in sources and "params" in fields else fields[key]
        error = relative_errors({key: value}, {key: reference})[key]
        assert error <= 1e-10 or (value - reference).abs().max() <= 1e-14 * scale, (label, mode, key, error)


def test_the_generated_test_file_of_a_traced_model_with_blocks_passes(tmp_path):
    case = MODELS["resnet18"]
    torch.manual_seed(0)
    model = case.model(**case.init).double().train()
    text = trace(
        model, {"x": (2, 3, 32, 32)}, name="resnet_blocks", loss=LossChoice("cross_entropy"), mode="train", blocks=True
    )
    built = build_text(text, "resnet_blocks.yaml", documents=False)
    source = built.rendered.files["resnet_blocks.py"]
    assert source.count("def basic_block_backward(") == 1
    # the eight instances, one after another: a table and a loop, as the model's Sequentials are
    assert '("basic_block", "layer1.1", {}),' in source and "_run_backward(LAYER1_0_TO_LAYER4_1, " in source
    assert max(len(line) for line in source.splitlines()) <= 100
    for name, content in built.rendered.files.items():
        (tmp_path / name).write_text(content)
    outcomes = run_generated_tests(tmp_path / "test_resnet_blocks.py")
    assert outcomes.ok, outcomes.report


def test_first_blocks_of_stages_that_differ_in_stride_or_kernel_size_are_one_block():
    """A ResNet's first bottleneck of each stage (stride 1 in the first stage, 2 after) and a
    MobileNet's ConvBNReLU (3 x 3 stride 2 in the stem, 3 x 3 depthwise inside the first inverted
    residual, 1 x 1 at the end): one block each, their strides, paddings and groups hypers."""

    def traced(case):
        torch.manual_seed(0)
        model = case.model(**case.init).double().train()
        return load_yaml(
            trace(model, case.traced, name="traced", loss=LossChoice("cross_entropy"), mode="train", blocks=True)
        )

    spec = traced(NETS["resnet50"])
    instances = {layer["prefix"]: layer for layer in spec["layers"] if "block" in layer}
    assert {layer["block"] for layer in instances.values()} == {"bottleneck"}  # downsample or not: 64 item 5
    assert spec["blocks"]["bottleneck"]["hyper"] == {"stride": 1, "downsample": False}
    assert instances["layer1.0"]["hyper"] == {"downsample": True}
    assert instances["layer2.0"]["hyper"] == {"stride": 2, "downsample": True}
    spec = traced(NETS["mobilenet_v2"])
    stems = [layer for layer in spec["layers"] if layer.get("block") == "conv_bn_relu"]
    assert [layer["prefix"] for layer in stems][:2] == ["features.0", "features.1.conv.0"]
    assert len(stems) == 3 and set(spec["blocks"]["conv_bn_relu"]["hyper"]) == {"stride", "padding", "groups"}


def test_instances_of_one_class_with_and_without_a_submodule_are_one_block_with_its_branch_switched():
    """A bottleneck with a downsample and one without are one block (issue 64 item 5): the downsample's
    layers its optional branch, switched by a bool hyper named after it (two blocks of one class that
    differ otherwise keep the name of the submodule one has beyond the other:
    tests/trace/test_optional_branch.py)."""
    case = NETS["resnet50"]
    torch.manual_seed(0)
    model = case.model(**{**case.init, "layers": (3, 2, 1)}).double().train()
    spec = load_yaml(
        trace(model, case.traced, name="traced", loss=LossChoice("cross_entropy"), mode="train", blocks=True)
    )
    assert set(spec["blocks"]) == {"bottleneck"}
    block = spec["blocks"]["bottleneck"]
    assert "downsample_0_weight" in block["params"] and block["hyper"]["downsample"] is False
    assert block["optional"] == {"downsample": {"nodes": ["downsample_0", "downsample_1"], "absent": "x"}}


@pytest.mark.parametrize("label, listed", [("resnet18", False), ("nafnet", True)])
def test_a_structured_module_runs_channels_last_where_it_pays_and_returns_each_gradient_in_its_callers_layout(
    monkeypatch, label, listed
):
    """The flat module's per-call layout rule, in the structured one: the convolution weights move to
    channels_last where the call's size pays (forced here at every size), the activations follow,
    the gradients agree with autograd and come back in the layout the caller's tensors are in.
    NAFNet's layer scales are 4-d without being convolution weights, so its module lists the weights
    it moves; ResNet-18's 4-d entries are all convolution weights, and its module says so."""
    import symgrad.roles

    monkeypatch.setattr(symgrad.roles, "CHANNELS_LAST_MIN_POSITIONS", 1)
    case = MODELS[label]
    torch.manual_seed(0)
    # ResNet-18 of width 16: a 1x1 stride-2 shortcut with fewer input channels keeps the default layout (roles.py)
    model = case.model(**case.init, **({"width": 16} if label == "resnet18" else {})).double().train()
    randomize(model, torch.Generator().manual_seed(5))
    kind = next(kind for kind in case.losses if kind not in ("half_sq_error_function", "nll_loss"))
    text = trace(model, case.traced, name="traced", loss=LossChoice(kind), mode="train", blocks=True)
    spec = load_yaml(text)
    source = build_text(text, f"{label}.yaml", documents=False).rendered.files["traced.py"]
    assert "params = _channels_last(params)" in source and ("\nCHANNELS_LAST = (" in source) == listed
    module = module_from_source(source, "traced")
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(case.checked["x"], generator=generator, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        prediction = model(x)
    target = (
        torch.randint(prediction.shape[1], (prediction.shape[0],), generator=generator)
        if spec["inputs"]["target"].get("dtype") == "int64"
        else torch.randn(prediction.shape, generator=generator, dtype=torch.float64)
    )
    state = {key: value.clone() for key, value in model.state_dict().items()}
    for layout in (torch.contiguous_format, torch.channels_last):
        model.load_state_dict(state)
        model.to(memory_format=layout)
        named = {
            source_name("", path, model): value for path, value in [*model.named_parameters(), *model.named_buffers()]
        }
        values = {key: x if key == "x" else target if key == "target" else named[key] for key in spec["inputs"]}
        arguments = _structured_arguments(module, spec, values)
        _, *saved = module._forward_saving(**arguments)
        # the activations follow the weights (the first in the caller's layout: the convolutions' input)
        assert any(
            value.is_contiguous(memory_format=torch.channels_last) and not value.is_contiguous()
            for value in saved
            if isinstance(value, torch.Tensor) and value.dim() == 4
        )
        model.load_state_dict(state)
        loss = reference_loss(kind, model, [x], target)
        parameters = dict(model.named_parameters())
        wrt = [key for key in spec["wrt"] if key != "x"]
        sources = {name: entry["source"] for name, entry in spec["inputs"].items() if "source" in entry}
        expected = dict(zip(["x", *wrt], torch.autograd.grad(loss, [x, *[parameters[sources[key]] for key in wrt]])))
        model.load_state_dict(state)
        result = module.gradients(**arguments)
        got = {"x": result.x, **{key: result.params[sources[key]] for key in wrt}}
        for key, reference in expected.items():
            assert relative_errors({key: got[key]}, {key: reference})[key] <= 1e-10, (label, layout, key)
            caller = x if key == "x" else parameters[sources[key]]
            if caller.dim() == 4:  # each gradient in its caller's layout
                assert got[key].is_contiguous(memory_format=layout) == caller.is_contiguous(memory_format=layout)
