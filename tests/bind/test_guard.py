"""``symgrad.bind`` binds only what was traced, from the user's side: a model written in a file, traced,
its module generated into a file (flat, ``--flat``, and as blocks), then the file or the model changed
the ways people change them. Every case either trains as autograd does through the model itself
(float64, another batch and spatial size, <= 1e-10) or is refused in one line naming what differs."""

from __future__ import annotations

import copy
import io
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F

import symgrad
from symgrad.binding import BindError
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, load_target, trace
from symgrad.trace.errors import TraceError

MODEL = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvBlock(nn.Module):
    """A residual conv-BN-ReLU, as a ResNet stage repeats it."""

    def __init__(self, channels, momentum=0.1):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels, momentum=momentum)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        return x + self.act(self.bn(self.conv(x)))


class Net(nn.Module):
    def __init__(self, width=4, classes=3, stem_kernel=3, stem_stride=1, eps=1e-5, momentum=0.1, freeze_stem=False):
        super().__init__()
        self.stem = nn.Conv2d(3, width, kernel_size=stem_kernel, stride=stem_stride, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width, eps=eps)
        self.blocks = nn.Sequential(ConvBlock(width, momentum), ConvBlock(width, momentum))
        self.head = nn.Linear(width, classes)
        if freeze_stem:
            self.stem.weight.requires_grad_(False)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        x = self.blocks(x)
        return self.head(x.mean((2, 3)))
'''

CHANGED = {
    "relu to gelu in forward": (
        MODEL.replace("x = F.relu(self.bn(", "x = F.gelu(self.bn("),
        {},
        r"the code of the model's class Net changed",
    ),
    "the block's forward edited": (
        MODEL.replace("return x + self.act(", "return x - self.act("),
        {},
        r"the code of blocks\.0's class ConvBlock changed",
    ),
    "stem 3x3 to 5x5, same keys": (
        MODEL,
        {"stem_kernel": 5},
        r"stem \(Conv2d\) has other (hyper-parameters|parameters)",
    ),
    "stem stride 1 to 2": (
        MODEL,
        {"stem_stride": 2},
        r"stem \(Conv2d\) has other hyper-parameters than traced .*stride=\[2, 2\]",
    ),
    "BatchNorm eps": (MODEL, {"eps": 1e-3}, r"bn \(BatchNorm2d\) has other hyper-parameters than traced .*eps=0\.001"),
    "a gained parameter": (
        MODEL.replace(
            "        if freeze_stem:", "        self.scale = nn.Parameter(torch.ones(1))\n        if freeze_stem:"
        ),
        {},
        r"the model \(Net\) has other parameters or shapes than traced \(now scale \[1\]\)",
    ),
    "a gained submodule": (
        MODEL.replace("        if freeze_stem:", "        self.extra = nn.Conv2d(3, 3, 1)\n        if freeze_stem:"),
        {},
        r"extra \(Conv2d\) is a submodule the trace did not see",
    ),
}
FORMS = ["flat", "blocks"]
ALL_FORMS = [*FORMS, "--flat"]
"""``--flat``: the spec traced with blocks, generated flat (``symgrad generate --flat``)."""


def write_model(folder, source=MODEL, name="net_model"):
    path = folder / f"{name}.py"
    path.write_text(source)
    return f"{path}:Net"


def generate(folder, model, form: str, name: str = "net", mode="train", wrt="parameters", shapes=(2, 3, 8, 8)):
    """Trace ``model``, generate its module into ``folder`` (with its header, as ``symgrad generate``
    writes it) and return the file's path."""
    text = trace(
        model,
        {"x": shapes},
        wrt=wrt,
        name=name,
        loss=LossChoice("cross_entropy", "labels"),
        mode=mode,
        blocks=form != "flat",
    )
    built = build_text(text, f"{name}.yaml", flat=form == "--flat")
    path = folder / f"{name}.py"
    path.write_text(built.rendered.files[f"{name}.py"])
    return path


def built_model(reference: str, **init) -> torch.nn.Module:
    torch.manual_seed(0)
    return load_target(reference, init).double().train()


def data(batch=3, height=6, width=10, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return (
        torch.randn(batch, 3, height, width, generator=generator, dtype=torch.float64),
        torch.randint(0, 3, (batch,), generator=generator),
    )


def assert_trains_as_autograd(step, model, reference, steps=2, batch=3):
    for index in range(steps):
        x, labels = data(batch=batch, seed=index + 1)
        step(x=x, labels=labels).backward()
        F.cross_entropy(reference(x), labels).backward()
    assert_same(model, reference)


def assert_same(model, reference):
    expected = dict(reference.named_parameters())
    # against the largest gradient: one that is zero by structure is rounding on both sides
    scale = max([value.grad.abs().max().item() for value in expected.values() if value.grad is not None] + [1e-30])
    for key, value in model.named_parameters():
        if expected[key].grad is None:
            assert value.grad is None, key
        else:
            assert (value.grad - expected[key].grad).abs().max().item() <= 1e-10 * scale, key
    buffers = dict(reference.named_buffers())
    for key, value in model.named_buffers():
        assert (value.double() - buffers[key].double()).abs().max().item() <= 1e-10 * max(
            buffers[key].double().abs().max().item(), 1.0
        ), key


@pytest.mark.parametrize("form", ALL_FORMS)
def test_the_model_traced_trains_as_autograd_and_the_module_is_the_form_asked_for(form, tmp_path):
    reference_path = write_model(tmp_path)
    model = built_model(reference_path)
    path = generate(tmp_path, model, form)
    generated = path.read_text()
    # every form takes the parameters in `params`; only the blocks form writes a block's own backward
    assert ("_backward(saved, grad_output):" in generated) == (form == "blocks") and "\nFINGERPRINT = " in generated
    assert "def forward(x, labels, params):" in generated or "def forward(x, params):" in generated, generated[:3000]
    reference = copy.deepcopy(model)
    assert_trains_as_autograd(symgrad.bind(path, model, verify=False), model, reference)


@pytest.mark.parametrize("form", ALL_FORMS)
@pytest.mark.parametrize("change", list(CHANGED))
def test_a_model_changed_since_it_was_traced_is_refused_in_one_line_naming_the_submodule(change, form, tmp_path):
    path = generate(tmp_path, built_model(write_model(tmp_path)), form)
    source, init, message = CHANGED[change]
    changed = built_model(write_model(tmp_path, source, name="net_changed"), **init)
    with pytest.raises(BindError) as error:
        symgrad.bind(path, changed)
    text = str(error.value)
    # run from here, the fix writes the module where it is: the spec and the folder as the header names them
    assert (
        "\n" not in text
        and "symgrad trace" in text
        and f"symgrad generate {tmp_path / 'net.yaml'} -o {tmp_path})" in text
    ), text
    assert __import__("re").search(message, text), text


@pytest.mark.parametrize("form", FORMS)
def test_a_generated_file_edited_by_hand_is_refused_unless_allowed(form, tmp_path):
    model = built_model(write_model(tmp_path))
    path = generate(tmp_path, model, form)
    text = path.read_text()
    edited = text.replace("grad_loss = ", "grad_loss = 2.5 * ", 1) if "grad_loss = " in text else text + "\n# edited\n"
    assert edited != text
    path.write_text(edited)
    with pytest.raises(
        BindError,
        match=r"^\S+net\.py was edited by hand since symgrad generated it .*"
        rf"\(fix: symgrad generate {tmp_path / 'net.yaml'} -o {tmp_path} again, or bind\(\.\.\., allow_edited=True\)",
    ):
        symgrad.bind(path, model)
    symgrad.bind(path, model, allow_edited=True)  # meant: bound
    path.write_text(text.split("\n", 3)[3])  # the header removed
    with pytest.raises(BindError, match="has no symgrad header"):
        symgrad.bind(path, model)


@pytest.mark.parametrize("form", FORMS)
def test_a_parameter_frozen_when_traced_and_unfrozen_later_is_refused_at_the_step(form, tmp_path):
    model = built_model(write_model(tmp_path), freeze_stem=True)
    reference = copy.deepcopy(model)
    step = symgrad.bind(generate(tmp_path, model, form), model)
    assert_trains_as_autograd(step, model, reference, steps=1)  # frozen, as traced: fine
    model.stem.weight.requires_grad_(True)
    x, labels = data()
    with pytest.raises(
        BindError,
        match=r"^net: stem\.weight requires grad, and the module computes no gradient for it "
        r"\(it was frozen when traced\) \(fix: .*symgrad trace",
    ):
        step(x=x, labels=labels)
    with torch.no_grad():  # no gradient asked for: nothing to refuse
        step(x=x, labels=labels)


@pytest.mark.parametrize("form", FORMS)
def test_an_input_that_requires_grad_outside_wrt_is_refused_as_an_upstream_networks_output(form, tmp_path):
    model = built_model(write_model(tmp_path))
    step = symgrad.bind(generate(tmp_path, model, form), model)
    upstream = torch.nn.Conv2d(3, 3, 1).double()
    x, labels = data()
    with pytest.raises(BindError, match=r"^net: x requires grad, and the module computes no gradient for it"):
        step(x=upstream(x), labels=labels)
    assert all(value.grad is None for value in model.parameters())


@pytest.mark.parametrize("form", FORMS)
def test_a_batchnorm_frozen_when_traced_and_switched_by_model_train_is_refused(form, tmp_path):
    model = built_model(write_model(tmp_path))
    model.blocks[1].bn.eval()  # a frozen BatchNorm, the rest training
    reference = copy.deepcopy(model)
    step = symgrad.bind(generate(tmp_path, model, form, mode=None), model)
    assert_trains_as_autograd(step, model, reference, steps=1)
    model.train()
    x, labels = data()
    with pytest.raises(
        BindError,
        match=r"^net was traced with blocks\.1\.bn \(BatchNorm2d\) in eval mode, and it is "
        r"now in train mode \(fix: call \.eval\(\) on it",
    ):
        step(x=x, labels=labels)
    model.blocks[0].bn.eval()  # the other way: traced training, now frozen
    model.blocks[1].bn.eval()
    with pytest.raises(BindError, match=r"blocks\.0\.bn \(BatchNorm2d\) in train mode, and it is now in eval mode"):
        step(x=x, labels=labels)


@pytest.mark.parametrize("form", FORMS)
def test_one_value_per_channel_raises_pytorchs_value_error_and_moves_nothing(form, tmp_path):
    model = built_model(write_model(tmp_path))
    step = symgrad.bind(generate(tmp_path, model, form), model)
    before = copy.deepcopy(model.state_dict())
    x, labels = data(batch=1, height=1, width=1)
    with pytest.raises(ValueError) as theirs:
        copy.deepcopy(model)(x)
    with pytest.raises(ValueError) as ours:
        step(x=x, labels=labels)
    assert str(ours.value) == str(theirs.value) and "Expected more than 1 value per channel" in str(ours.value)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


@pytest.mark.parametrize("form", FORMS)
def test_a_call_that_fails_moves_no_buffer_and_says_so_in_one_line(form, tmp_path):
    model = built_model(write_model(tmp_path))
    step = symgrad.bind(generate(tmp_path, model, form), model)
    before = copy.deepcopy(model.state_dict())
    wrong = torch.randn(2, 4, 8, 8, dtype=torch.float64)  # four channels, the stem takes three
    with pytest.raises(
        BindError, match=r"^net cannot take x \[2, 4, 8, 8\], labels \[2\]: .*channels.*nothing was moved"
    ):
        step(x=wrong, labels=torch.zeros(2, dtype=torch.int64))
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


@pytest.mark.parametrize("form", FORMS)
def test_two_steps_in_one_graph_train_as_autograd(form, tmp_path):
    """``(step(x=x1) + 2 * step(x=x2)).backward()``: the second step moves the statistics the first
    one's backward must not find changed."""
    model = built_model(write_model(tmp_path))
    reference = copy.deepcopy(model)
    step = symgrad.bind(generate(tmp_path, model, form), model)
    (x1, l1), (x2, l2) = data(seed=1), data(batch=4, height=7, width=5, seed=2)
    (step(x=x1, labels=l1) + 2 * step(x=x2, labels=l2)).backward()
    (F.cross_entropy(reference(x1), l1) + 2 * F.cross_entropy(reference(x2), l2)).backward()
    assert_same(model, reference)
    assert int(model.bn.num_batches_tracked) == 2


SHARED = MODEL.replace("        x = self.blocks(x)\n", "        x = self.blocks(x)\n        x = self.bn(x)\n")
"""The stem's BatchNorm applied twice per forward, as a weight-shared network does."""


@pytest.mark.parametrize("form", FORMS)
def test_a_batchnorm_called_twice_per_forward_moves_its_statistics_as_the_module_does(form, tmp_path):
    model = built_model(write_model(tmp_path, SHARED))
    reference = copy.deepcopy(model)
    assert_trains_as_autograd(symgrad.bind(generate(tmp_path, model, form), model, verify=False), model, reference)
    assert int(model.bn.num_batches_tracked) == 4 and int(model.blocks[0].bn.num_batches_tracked) == 2


@pytest.mark.parametrize("form", FORMS)
def test_a_momentum_none_batchnorm_called_once_per_forward_trains_and_twice_is_refused(form, tmp_path):
    model = built_model(write_model(tmp_path), momentum=None)
    reference = copy.deepcopy(model)
    assert_trains_as_autograd(
        symgrad.bind(generate(tmp_path, model, form), model, verify=False), model, reference, steps=3
    )
    shared = built_model(
        write_model(
            tmp_path, SHARED.replace("nn.BatchNorm2d(width, eps=eps)", "nn.BatchNorm2d(width, eps=eps, momentum=None)")
        )
    )
    with pytest.raises(BindError, match=r"^net: bn is a momentum=None BatchNorm the forward runs 2 times"):
        symgrad.bind(generate(tmp_path, shared, form), shared)


@pytest.mark.parametrize("form", FORMS)
def test_a_bound_model_deepcopies_pickles_and_saves_as_an_ordinary_module(form, tmp_path):
    model = built_model(write_model(tmp_path))
    reference = copy.deepcopy(model)
    step = symgrad.bind(generate(tmp_path, model, form), model, verify=False)
    x, labels = data()
    step(x=x, labels=labels).backward()
    F.cross_entropy(reference(x), labels).backward()
    copies = [copy.deepcopy(step), pickle.loads(pickle.dumps(step))]
    buffer = io.BytesIO()
    torch.save(step, buffer)
    buffer.seek(0)
    copies.append(torch.load(buffer, weights_only=False))
    states = io.BytesIO()
    torch.save(step.state_dict(), states)
    states.seek(0)
    fresh = symgrad.bind(
        generate(tmp_path, model, form, name="net_again"), built_model(write_model(tmp_path)), verify=False
    )
    fresh.load_state_dict(torch.load(states))
    copies.append(fresh)
    x2, l2 = data(batch=4, height=5, width=9, seed=3)
    theirs = copy.deepcopy(reference)
    for parameter in theirs.parameters():
        parameter.grad = None
    F.cross_entropy(theirs(x2), l2).backward()
    for bound in copies:
        assert bound.model is not model
        for parameter in bound.model.parameters():
            parameter.grad = None
        bound(x=x2, labels=l2).backward()
        assert_same(bound.model, theirs)
    assert model.bn.num_batches_tracked == 1  # the copies moved their own buffers


def test_a_bound_module_made_in_memory_deepcopies_and_refuses_pickling_in_one_line(tmp_path):
    from symgrad.check import module_from_source

    model = built_model(write_model(tmp_path))
    text = trace(
        model, {"x": (2, 3, 8, 8)}, wrt="parameters", name="in_memory", loss=LossChoice("cross_entropy", "labels")
    )
    step = symgrad.bind(
        module_from_source(build_text(text, "in_memory.yaml").rendered.files["in_memory.py"], "in_memory"), model
    )
    copied = copy.deepcopy(step)
    assert copied.generated is step.generated and copied.model is not model
    with pytest.raises(
        BindError, match=r"^in_memory was not loaded from a file.*\(fix: bind the generated file's path"
    ):
        pickle.dumps(step)


SPEC = """name: s
inputs:
  x: {shape: [2, 3]}
  w: {shape: [3], source: w}
  y: {shape: [2, 3]}
layers:
  - {op: mul, in: [x, w], out: h}
loss: {op: mse_loss, in: h, target: y}
wrt: [w]
fingerprint:
"""


@pytest.mark.parametrize(
    "entry",
    [
        '"": {class: "os.system(\'x\')", code: null, hyper: {}, state: {}}',
        '"": {class: Net, code: "__import__(\'os\')", hyper: {}, state: {}}',
        '"": {class: Net, code: null, hyper: {p: {nested: 1}}, state: {}}',
        '"": {class: Net, code: null, hyper: {"a b": 1}, state: {}}',
        '"": {class: Net, code: null, hyper: {}, state: {w: [3, "x"]}}',
        '"": {class: Net, code: null, hyper: {}, state: {}, extra: 1}',
        '"": {class: Net, code: null, training: "yes", hyper: {}, state: {}}',
        '"a..b": {class: Net, code: null, hyper: {}, state: {}}',
        '"": [1, 2]',
    ],
)
def test_a_fingerprint_that_is_not_the_traces_literals_is_refused_at_its_line(entry):
    from symgrad.errors import SpecError
    from symgrad.spec import parse_spec

    with pytest.raises(SpecError, match=r"^s\.yaml:1[01]:\d+: error: fingerprint .*\(fix: trace the model again"):
        parse_spec(SPEC + f"  {entry}\n", "s.yaml")


def test_a_fingerprints_strings_reach_the_generated_module_as_literals():
    """A hyper-parameter string holding quotes, a backslash and braces is written as a Python literal."""
    from symgrad.check import module_from_source

    text = SPEC + (
        '  "": {class: Net, code: 0123456789abcdef, hyper: {mode: "a\\"b\\\\{{ 7 }}\'", p: 0.1, k: [3, 3],'
        "}, state: {w: [3]}}\n"
    )
    built = build_text(text, "s.yaml")
    module = module_from_source(built.rendered.files["s.py"], "s")
    name, code, *_ = module.FINGERPRINT[""]
    assert (name, code) == ("Net", "0123456789abcdef") and not hasattr(module, "FROZEN")  # none frozen


@pytest.mark.parametrize("form", FORMS)
def test_a_parameter_the_forward_never_reads_gets_no_gradient_as_with_autograd(form, tmp_path):
    """An auxiliary head the training forward skips: autograd leaves its ``.grad`` None, and so does the step."""
    source = MODEL.replace(
        "        if freeze_stem:", "        self.aux_head = nn.Linear(width, classes)\n        if freeze_stem:"
    )
    model = built_model(write_model(tmp_path, source))
    reference = copy.deepcopy(model)
    assert_trains_as_autograd(
        symgrad.bind(generate(tmp_path, model, form), model, verify=False), model, reference, steps=1
    )
    assert model.aux_head.weight.grad is None and model.aux_head.weight.requires_grad


@pytest.mark.parametrize("form", FORMS)
def test_a_tensor_set_to_none_or_a_hyper_parameter_deleted_or_made_a_tensor_after_bind_is_refused_in_one_line(
    form, tmp_path
):
    changes = {
        "head.bias = None": (lambda net: setattr(net.head, "bias", None), r"^net: head\.bias is None since bind"),
        "del bn.momentum": (
            lambda net: delattr(net.bn, "momentum"),
            r"^net: bn \(BatchNorm2d\) has no momentum since bind, traced with momentum=0\.1 ",
        ),
        "bn.eps a tensor of two": (
            lambda net: setattr(net.bn, "eps", torch.tensor([1e-5, 1e-5])),
            r"^net: bn \(BatchNorm2d\) has eps=tensor\(",
        ),
    }
    reference = write_model(tmp_path)
    path = generate(tmp_path, built_model(reference), form)
    for change, pattern in changes.values():
        model = built_model(reference)
        step = symgrad.bind(path, model)
        x, labels = data()
        step(x=x, labels=labels).backward()
        change(model)
        with pytest.raises(BindError, match=pattern) as raised:
            step(x=x, labels=labels)
        assert "\n" not in str(raised.value)


def _doubled(module, inputs, output):
    return output * 2


@pytest.mark.parametrize("form", FORMS)
def test_forward_hooks_are_traced_into_the_module_and_any_change_to_them_is_refused(form, tmp_path):
    reference = write_model(tmp_path)
    hooked = built_model(reference)
    hooked.stem.register_forward_hook(_doubled)  # present when traced: its math is in the module
    path = generate(tmp_path, hooked, form)
    model, copy_ = built_model(reference), built_model(reference)
    for net in (model, copy_):
        net.stem.register_forward_hook(_doubled)
    with pytest.warns(UserWarning, match=r"^symgrad\.bind: stem ran forward hooks when traced"):
        step = symgrad.bind(path, model)
    assert_trains_as_autograd(step, model, copy_)
    with pytest.raises(
        BindError, match=r"^net does not fit Net: stem \(Conv2d\) ran a forward hook when traced that it no"
    ):
        symgrad.bind(path, built_model(reference))  # the hook traced, gone before bind: refused at bind
    extra = built_model(reference)
    for hook in (_doubled, _doubled):  # the traced hook and one more
        extra.stem.register_forward_hook(hook)
    with pytest.raises(BindError, match=r"^net does not fit Net: stem \(Conv2d\) has other forward hooks than traced"):
        symgrad.bind(path, extra)
    extra = built_model(reference)
    extra.stem.register_forward_hook(_doubled)
    extra.head.register_forward_hook(_doubled)
    with pytest.raises(BindError, match=r"^net does not fit Net: head \(Linear\) has a forward hook the trace did not"):
        symgrad.bind(path, extra)
    changes = {
        "a hook removed": (lambda net: net.stem._forward_hooks.clear(), r"^net: a forward hook of stem was removed"),
        "a hook added": (
            lambda net: net.head.register_forward_hook(_doubled),
            r"^net: head has a forward hook registered",
        ),
        "a hook on the model itself": (
            lambda net: net.register_forward_pre_hook(lambda module, args: None),
            r"^net: the model has a forward hook registered since bind",
        ),
        "weight_norm": (lambda net: torch.nn.utils.weight_norm(net.head), r"^net: head has a forward hook registered"),
        "a backward hook": (
            lambda net: net.head.register_full_backward_hook(lambda *args: None),
            r"^net: head has a backward hook, which the explicit backward does not run",
        ),
    }
    x, labels = data()
    for change, pattern in changes.values():
        model = built_model(reference)
        model.stem.register_forward_hook(_doubled)
        with pytest.warns(UserWarning):
            step = symgrad.bind(path, model)
        step(x=x, labels=labels).backward()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # old-style weight_norm's
            change(model)
        with pytest.raises(BindError, match=pattern) as raised:
            step(x=x, labels=labels)
        assert "\n" not in str(raised.value)


def _bound_with_a_copy(folder, form):
    """The test model's step bound in ``form``, its model, and an equal copy to train by autograd."""
    reference = write_model(folder)
    path = generate(folder, built_model(reference), form)
    model, copy_ = built_model(reference), built_model(reference)
    return symgrad.bind(path, model, verify=False), model, copy_


@pytest.mark.parametrize("form", FORMS)
def test_tensor_hooks_registered_at_every_step_neither_refuse_nor_change_the_step(form, tmp_path):
    step, model, copy_ = _bound_with_a_copy(tmp_path, form)
    for index in range(2):  # each registration moves RemovableHandle's counter: the hooks are looked at, unchanged
        x, labels = data(seed=index + 1)
        x.requires_grad_(False)
        loss = step(x=x, labels=labels)
        loss.register_hook(lambda grad: grad * 3)
        loss.backward()
        expected = F.cross_entropy(copy_(x), labels)
        expected.register_hook(lambda grad: grad * 3)
        expected.backward()
    assert_same(model, copy_)


def test_a_backward_hook_is_refused_at_bind(tmp_path):
    reference = write_model(tmp_path)
    path = generate(tmp_path, built_model(reference), "blocks")
    model = built_model(reference)
    model.bn.register_full_backward_pre_hook(lambda module, grad: None)
    with pytest.raises(BindError, match=r"^net: bn has a backward hook, which the explicit backward does not run"):
        symgrad.bind(path, model)


@pytest.mark.parametrize("form", FORMS)
def test_global_observer_hooks_such_as_flop_counters_neither_refuse_nor_change_the_step(form, tmp_path):
    from torch.utils.flop_counter import FlopCounterMode

    step, model, copy_ = _bound_with_a_copy(tmp_path, form)
    x, labels = data()
    with FlopCounterMode(display=False) as counter:  # registers global module hooks, then removes them
        step(x=x, labels=labels).backward()
    assert counter.get_total_flops() > 0
    F.cross_entropy(copy_(x), labels).backward()
    assert_same(model, copy_)


def test_the_trace_refuses_the_forward_hooks_it_would_not_run(tmp_path):
    model = built_model(write_model(tmp_path))
    handle = model.register_forward_hook(_doubled)
    with pytest.raises(
        TraceError,
        match=r"^\S*test_guard\.py:\d+: error: Net itself has a forward hook, which tracing its forward does not",
    ):
        generate(tmp_path, model, "flat")
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(_doubled)
    try:
        with pytest.raises(
            TraceError, match=r"^\S*test_guard\.py:\d+: error: a global module forward hook is registered"
        ):
            generate(tmp_path, model, "flat")
    finally:
        handle.remove()


@pytest.mark.parametrize("form", FORMS)
def test_a_step_under_non_reentrant_checkpoint_trains_as_the_model_under_it(form, tmp_path):
    from torch.utils.checkpoint import checkpoint

    step, model, copy_ = _bound_with_a_copy(tmp_path, form)
    x, labels = data()
    checkpoint(lambda images: step(x=images, labels=labels), x, use_reentrant=False).backward()
    checkpoint(lambda images: F.cross_entropy(copy_(images), labels), x, use_reentrant=False).backward()
    assert_same(model, copy_)  # the BatchNorms moved twice in both, as the recomputed forward moves them
