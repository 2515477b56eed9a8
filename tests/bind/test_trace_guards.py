"""A bound model trains on the model's numbers or refuses in one line: guards from the trace (``symgrad.guards``).

Each case is a user's edit: a model file written, imported, traced, its module generated and bound; then
the file edited and imported again (or a value changed on the model, or another argument passed), and
the bind or the call refused in one line naming the value, with its traced and current value."""

from __future__ import annotations

import enum
import functools
import sys

import pytest
import torch
import torch.nn.functional as F

import symgrad
from symgrad.binding import BindError
from symgrad.pipeline import build_text
from symgrad.trace import load_target, trace

HEAD = """
import enum
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F
"""

CODE = {  # name: (model file, the edit, the refusal)
    "a helper called by a helper": (
        HEAD
        + """
def act(x):
    return F.leaky_relu(x, 0.1)


def helper(x):
    return act(x) * 2


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return helper(self.lin(x))
""",
        ("F.leaky_relu(x, 0.1)", "F.leaky_relu(x, 0.3)"),
        r"the code of act \(Net\.forward/helper/act\), which the forward calls, changed",
    ),
    "a module constant": (
        HEAD
        + """
SLOPE = 0.1


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return F.leaky_relu(self.lin(x), SLOPE)
""",
        ("SLOPE = 0.1", "SLOPE = 0.3"),
        r"SLOPE \(read by Net\.forward\) is 0\.3, traced with SLOPE=0\.1",
    ),
    "a helper read as a module attribute": (
        HEAD
        + """
import guarded_helpers as helpers


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return helpers.act(self.lin(x))
""",
        None,
        r"the code of act \(Net\.forward/helpers\.act\), which the forward calls, changed",
    ),
    "a closure variable of a class made in a function": (
        HEAD
        + """
def make(slope):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x):
            return F.leaky_relu(self.lin(x), slope)
    return Net


Net = make(0.1)
""",
        ("make(0.1)", "make(0.3)"),
        r"slope \(read by make\.<locals>\.Net\.forward\) is 0\.3, traced with slope=0\.1",
    ),
    "a class made by exec": (
        HEAD
        + '''
SOURCE = """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return F.leaky_relu(self.lin(x), 0.1)
"""
exec(SOURCE)
''',
        ("F.leaky_relu(self.lin(x), 0.1)", "F.leaky_relu(self.lin(x), 0.3)"),
        r"the code of the model's class Net changed",
    ),
}
HELPERS = "import torch.nn.functional as F\n\n\ndef act(x):\n    return F.leaky_relu(x, {slope})\n"


def imported(folder, source, name="guarded_model"):
    """The model built from ``source``, written to ``folder/NAME.py`` and imported anew (as a notebook's
    ``importlib.reload`` or a new process does), in float64."""
    (folder / f"{name}.py").write_text(source)
    sys.modules.pop("guarded_helpers", None)  # a helper module beside it: imported anew as well
    torch.manual_seed(0)
    return load_target(f"{folder / name}.py:Net").double()


def generated(folder, model, shapes=None, arguments=None, name="net"):
    """Trace ``model`` (outputs, both modes where they differ), generate its module beside it, return its path."""
    text = trace(model, shapes or {"x": (2, 4)}, wrt="parameters", name=name, arguments=arguments)
    path = folder / f"{name}.py"
    path.write_text(build_text(text, f"{name}.yaml", documents=False).rendered.files[f"{name}.py"])
    (folder / f"{name}.yaml").write_text(text)
    return path


def one_line_refusal(function, pattern):
    with pytest.raises(BindError) as error:
        function()
    text = str(error.value)
    assert "\n" not in text and __import__("re").search(pattern, text), text
    return text


@pytest.mark.parametrize("case", list(CODE))
def test_code_the_forward_ran_is_guarded_transitively_and_an_edit_refused(case, tmp_path):
    source, edit, refusal = CODE[case]
    (tmp_path / "guarded_helpers.py").write_text(HELPERS.format(slope=0.1))
    model = imported(tmp_path, source)
    path = generated(tmp_path, model)
    x = torch.randn(3, 4, dtype=torch.float64)
    assert torch.equal(symgrad.bind(path, model)(x), model(x))  # as traced: bound, the model's numbers
    if edit is None:
        (tmp_path / "guarded_helpers.py").write_text(HELPERS.format(slope=0.3))
    edited = imported(tmp_path, source if edit is None else source.replace(*edit))
    assert not torch.equal(edited(x), model(x))  # the edit changes the numbers...
    text = one_line_refusal(lambda: symgrad.bind(path, edited), refusal)  # ...so bind refuses
    assert "symgrad trace" in text and "symgrad generate" in text


HYPERS = (
    HEAD
    + """

class Net(nn.Module):
    def __init__(self, gain=2.0, table=((1.0, 2.0), (3.0, 4.0)), slope=0.2):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.cfg = {"gain": gain}
        self.table = [list(row) for row in table]
        self.act = functools.partial(F.leaky_relu, negative_slope=slope)

    def forward(self, x):
        return self.act(self.lin(x)) * self.cfg["gain"] + self.table[1][0]
"""
)
EDITS = {
    "a dict entry": (
        '{"gain": gain}',
        '{"gain": 0.5}',
        r"the model \(Net\) has other hyper-parameters than traced: cfg=\"\{'gain': 0\.5\}\", traced with cfg=\"\{'gain': 2\.0\}\"",
    ),
    "a nested list entry": ("self.table[1][0]", "self.table[1][0] + 0", None),
    "a partial's keyword": (
        "negative_slope=slope",
        "negative_slope=0.3",
        r"than traced: act='partial\(torch\.nn\.functional\.leaky_relu, negative_slope=0\.3\)', traced with act='partial\(.*=0\.2\)'",
    ),
}


@pytest.mark.parametrize("edit", ["a dict entry", "a partial's keyword"])
def test_a_hyper_parameter_that_is_no_plain_scalar_is_guarded_at_bind(edit, tmp_path):
    model = imported(tmp_path, HYPERS)
    path = generated(tmp_path, model)
    before, after, refusal = EDITS[edit]
    one_line_refusal(lambda: symgrad.bind(path, imported(tmp_path, HYPERS.replace(before, after))), refusal)


def test_a_hyper_parameter_that_is_no_plain_scalar_is_guarded_after_bind_at_each_call(tmp_path):
    model = imported(tmp_path, HYPERS)
    fast = symgrad.bind(generated(tmp_path, model), model, verify=False)
    x = torch.randn(3, 4, dtype=torch.float64)
    assert torch.equal(fast(x), model(x))
    model.table[1][0] = 5.0  # in place, in a nested list
    one_line_refusal(
        lambda: fast(x),
        r"^net: the model \(Net\) has table=\[\[1\.0, 2\.0\], \[5\.0, 4\.0\]\] since bind, "
        r"traced with table=\[\[1\.0, 2\.0\], \[3\.0, 4\.0\]\] .*symgrad trace",
    )
    model.table[1][0] = 3.0
    model.cfg["gain"] = 0.3
    one_line_refusal(lambda: fast(x), r"cfg=\{'gain': 0\.3\} since bind, traced with cfg=\{'gain': 2\.0\}")
    model.cfg["gain"] = 2.0
    model.act = functools.partial(F.leaky_relu, negative_slope=0.2)  # made anew, the same: trains on
    assert torch.equal(fast(x), model(x))
    model.act = functools.partial(F.leaky_relu, negative_slope=0.3)
    one_line_refusal(lambda: fast(x), r"act=.*negative_slope=0\.3.* since bind, traced with act=.*negative_slope=0\.2")


ARGUMENTS = (
    HEAD
    + """

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x, scale=1.0, mask=None, return_features=False):
        h = self.lin(x) * scale
        if mask is not None:
            h = h * mask
        return (h, x) if return_features else h
"""
)


def test_a_call_with_other_arguments_than_traced_is_refused(tmp_path):
    model = imported(tmp_path, ARGUMENTS)
    fast = symgrad.bind(generated(tmp_path, model), model, verify=False)
    x = torch.randn(3, 4, dtype=torch.float64)
    assert torch.equal(fast(x), model(x)) and torch.equal(fast(x, 1.0, None), model(x))  # as traced
    one_line_refusal(
        lambda: fast(x, scale=2.0),
        r"^net: it is called with scale=2\.0, and was traced with scale=1\.0 \(fix: "
        r"call it with scale=1\.0, or trace and generate it so: symgrad trace \S+guarded_model\.py:Net "
        r"--input x=2,4 --wrt parameters --name net --arg scale=2\.0 -o \S+net\.yaml && symgrad generate",
    )
    one_line_refusal(lambda: fast(x, 3.0), r"scale=3\.0, and was traced with scale=1\.0")
    one_line_refusal(
        lambda: fast(x, return_features=True), r"return_features=True, and was traced with return_features=False"
    )
    one_line_refusal(
        lambda: fast(x, mask=torch.ones(3, 3, dtype=torch.float64)),
        r"mask is a tensor, and the trace ran without it \(mask=None\).*--input mask=3,3",
    )
    masked = symgrad.bind(
        generated(tmp_path, model, shapes={"x": (2, 4), "mask": (2, 3)}, name="masked"), model, verify=False
    )
    one_line_refusal(lambda: masked(x), r"mask is None, and the trace had a tensor there")
    assert torch.equal(masked(x, mask=torch.ones(3, 3, dtype=torch.float64)), model(x))
    traced_at_two = symgrad.bind(
        generated(tmp_path, model, arguments={"scale": 2.0}, name="scaled"), model, verify=False
    )
    assert torch.equal(traced_at_two(x, scale=2.0), model(x, scale=2.0))
    one_line_refusal(lambda: traced_at_two(x), r"scale=1\.0, and was traced with scale=2\.0")


class Format(str, enum.Enum):
    NCHW = "NCHW"
    NHWC = "NHWC"


ENUM = (
    HEAD
    + """

class Format(str, enum.Enum):  # timm's PatchEmbed.output_fmt
    NCHW = "NCHW"
    NHWC = "NHWC"


class Net(nn.Module):
    def __init__(self, output_fmt=Format.NCHW):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.output_fmt = output_fmt

    def forward(self, x):
        h = self.lin(x)
        return h.flip(-1) if self.output_fmt == Format.NHWC else h
"""
)


def test_a_model_with_an_enum_attribute_traces_binds_and_a_changed_enum_is_refused(tmp_path):
    model = imported(tmp_path, ENUM)
    path = generated(tmp_path, model)
    assert "output_fmt: Format.NCHW" in (tmp_path / "net.yaml").read_text()
    fast = symgrad.bind(path, model, verify=False)
    x = torch.randn(3, 4, dtype=torch.float64)
    assert torch.equal(fast(x), model(x))
    module = sys.modules[type(model).__module__]
    model.output_fmt = module.Format.NHWC
    one_line_refusal(
        lambda: fast(x),
        r"^net: the model \(Net\) has output_fmt=Format\.NHWC since bind, traced with output_fmt=Format\.NCHW ",
    )
    edited = imported(tmp_path, ENUM.replace("output_fmt=Format.NCHW", "output_fmt=Format.NHWC"))
    one_line_refusal(
        lambda: symgrad.bind(path, edited),
        r"the model \(Net\) has other hyper-parameters than traced: output_fmt='Format\.NHWC', traced with output_fmt='Format\.NCHW'",
    )


def test_a_model_whose_source_file_was_moved_after_import_binds_and_trains_as_autograd(tmp_path):
    path = generated(tmp_path, imported(tmp_path, CODE["a helper called by a helper"][0]))  # `symgrad trace`
    model = imported(tmp_path, CODE["a helper called by a helper"][0])  # the training script's own import
    (tmp_path / "guarded_model.py").rename(tmp_path / "moved.py")
    import linecache

    linecache.clearcache()  # its source cannot be read any more: the code objects are what is guarded
    fast = symgrad.bind(path, model, verify=False)
    x = torch.randn(3, 4, dtype=torch.float64)
    assert torch.equal(fast(x), model(x))


def test_instance_norm_with_running_statistics_and_momentum_none_binds_and_moves_them_as_the_model(tmp_path):
    source = (
        HEAD
        + """

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 1)
        self.norm = nn.InstanceNorm2d(3, affine=True, track_running_stats=True, momentum=None)

    def forward(self, x):
        return self.norm(self.conv(x))
"""
    )
    model = imported(tmp_path, source).train()
    import copy

    reference = copy.deepcopy(model)
    fast = symgrad.bind(generated(tmp_path, model, shapes={"x": (2, 2, 4, 4)}), model, verify=False)
    x = torch.randn(3, 2, 5, 6, dtype=torch.float64)
    fast(x).square().sum().backward()
    reference(x).square().sum().backward()
    for (key, value), expected in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.allclose(value, expected, rtol=0, atol=1e-12), key
    for value, expected in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(value.grad, expected.grad, rtol=0, atol=1e-10)


BATCHNORM = (
    HEAD
    + """

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        return F.relu(self.bn(self.lin(x)))


class Other(Net):
    pass
"""
)


def test_the_printed_retrace_run_as_printed_makes_the_next_bind_pass(tmp_path, monkeypatch):
    """Traced by the CLI (both modes, --wrt parameters, a spec folder apart from the modules), the model
    edited: bind's fix, run as printed, traces and generates both modes, and bind passes."""
    import shlex

    from click.testing import CliRunner

    from symgrad.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "bn_model.py").write_text(BATCHNORM)
    runner = CliRunner()
    for arguments in (
        ["trace", "bn_model.py:Net", "--input", "x=2,4", "--wrt", "parameters", "-o", "specs/net.yaml"],
        ["generate", "specs/net.yaml", "specs/net_eval.yaml", "-o", "gen"],
    ):
        result = runner.invoke(main, arguments)
        assert result.exit_code == 0, result.output
    model = load_target("bn_model.py:Net").double()
    symgrad.bind("gen/net_gradients.py", model)
    other = load_target("bn_model.py:Other").double()
    text = one_line_refusal(
        lambda: symgrad.bind("gen/net_gradients.py", other), "the model is a Other, traced as a Net"
    )
    assert (
        "symgrad trace bn_model.py:Other --input x=2,4 --wrt parameters -o specs/other_gradients.yaml && "
        "symgrad generate specs/other_gradients*.yaml -o gen, then bind gen/other_gradients.py)"
    ) in text, text
    (tmp_path / "bn_model.py").write_text(BATCHNORM.replace("F.relu(", "F.gelu("))
    edited = load_target("bn_model.py:Net").double()
    text = one_line_refusal(
        lambda: symgrad.bind("gen/net_gradients.py", edited), "the code of the model's class Net changed"
    )
    command = text[text.index("(fix: ") + 6 : -1]
    assert command == (
        "symgrad trace bn_model.py:Net --input x=2,4 --wrt parameters -o specs/net.yaml && "
        "symgrad generate specs/net.yaml specs/net_eval.yaml -o gen"
    ), command
    for part in command.split(" && "):  # each command as printed, as the shell splits it (in this process)
        words = shlex.split(part)
        assert words[0] == "symgrad"
        result = runner.invoke(main, words[1:])
        assert result.exit_code == 0, result.output
    fast = symgrad.bind("gen/net_gradients.py", edited)  # both modes generated anew: train and eval bind
    x = torch.randn(3, 4, dtype=torch.float64)
    assert torch.allclose(fast(x), edited(x), rtol=0, atol=1e-12)
    edited.eval()
    assert torch.allclose(fast(x), edited(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "section, message",
    [
        ('{code: {"Net.forward": "import os"}}', "not a 16-digit hash"),
        ('{values: {"Net.forward/SLOPE": {a: 1}}}', "not a literal"),
        ('{arguments: {"scale; import os": 1.0}}', "not a path"),
        ("{code: {}, other: {}}", "must be a mapping of code, values and arguments"),
    ],
)
def test_a_guards_section_holds_only_what_the_trace_writes(section, message):
    """Only checked literals reach the generated module (its ``GUARDS``): a spec edited to hold code is refused."""
    from symgrad.errors import SpecError
    from symgrad.spec import parse_spec

    text = (
        "name: net\ninputs:\n  x: {shape: [2, 4]}\n  w: {shape: [3, 4]}\nlayers:\n  - {op: linear, in: x, weight: w, out: y}\n"
        f"outputs: y\nwrt: [w]\nguards: {section}\n"
    )
    parse_spec(text.replace(f"guards: {section}\n", 'guards: {code: {"Net.forward": 0123456789abcdef}}\n'))
    with pytest.raises(SpecError, match=message):
        parse_spec(text)


def test_an_attribute_holding_tensors_in_a_dict_binds_and_trains_on(tmp_path):
    """A container of tensors (a cache, a table of buffers kept by hand) is guarded by its text, never
    compared element by element: no false refusal at bind or at a call."""
    model = imported(
        tmp_path,
        HYPERS.replace(
            'self.cfg = {"gain": gain}', 'self.cfg = {"gain": gain}\n        self.cache = {"table": torch.ones(3)}'
        ),
    )
    fast = symgrad.bind(generated(tmp_path, model), model, verify=False)
    x = torch.randn(3, 4, dtype=torch.float64)
    model.cache["table"] = torch.zeros(3)
    assert torch.equal(fast(x), model(x)) and torch.equal(fast(x), model(x))


OVERRIDDEN = (
    HEAD
    + """

class Base:
    def scale(self, x):
        return x * 2


class Helper(Base):
    def scale(self, x):
        return super().scale(x) + 1


def helper(x):
    return Helper().scale(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return helper(self.lin(x))
"""
)


def test_a_method_and_the_base_method_it_overrides_are_guarded_apart(tmp_path):
    """A helper class's method and its base's (super().scale()), both called, are two guards (transformers'
    cache classes): the model binds as traced, and an edit of the base method is refused, naming it."""
    path = generated(tmp_path, imported(tmp_path, OVERRIDDEN))
    model = imported(tmp_path, OVERRIDDEN)  # imported anew, as another process does
    x = torch.randn(3, 4, dtype=torch.float64)
    assert torch.equal(symgrad.bind(path, model)(x), model(x))
    one_line_refusal(
        lambda: symgrad.bind(path, imported(tmp_path, OVERRIDDEN.replace("x * 2", "x * 3"))),
        r"the code of Base\.scale \(Net\.forward/helper/Helper\.scale@Base\), which the forward calls, changed",
    )


def test_the_retrace_of_a_module_generated_from_python_works_as_printed(tmp_path, monkeypatch):
    """Traced and generated from Python (``symgrad.trace.trace_modes`` + ``symgrad.generate(text=...).write``,
    as examples/train_digits.py does), the model edited: ``write`` kept each spec beside its module, so bind's
    fix names the traced input shapes and both modes' specs (not ``--input ...``), and run as printed it
    traces and generates both modes: bind passes, in both modes."""
    import shlex

    from click.testing import CliRunner

    from symgrad.cli import main
    from symgrad.trace import trace_modes

    monkeypatch.chdir(tmp_path)
    (tmp_path / "bn_model.py").write_text(BATCHNORM)
    model = load_target("bn_model.py:Net").double()
    train_text, eval_text = trace_modes(model, {"x": (2, 4)}, "parameters", "net")
    for text in (train_text, eval_text):
        written = symgrad.generate(text=text).write("gen")
        assert any(path.suffix == ".yaml" for path in written), written
    symgrad.bind("gen/net.py", model)
    (tmp_path / "bn_model.py").write_text(BATCHNORM.replace("F.relu(", "F.gelu("))
    edited = load_target("bn_model.py:Net").double()
    text = one_line_refusal(lambda: symgrad.bind("gen/net.py", edited), "the code of the model's class Net changed")
    command = text[text.index("(fix: ") + 6 : -1]
    assert "..." not in command and "--input x=2,4" in command and "gen/net_eval.yaml" in command, command
    for part in command.split(" && "):  # each command as printed, as the shell splits it (in this process)
        words = shlex.split(part)
        assert words[0] == "symgrad"
        result = CliRunner().invoke(main, words[1:])
        assert result.exit_code == 0, result.output
    fast = symgrad.bind("gen/net.py", edited)
    x = torch.randn(3, 4, dtype=torch.float64)
    assert torch.allclose(fast(x), edited(x), rtol=0, atol=1e-12)
    edited.eval()
    assert torch.allclose(fast(x), edited(x), rtol=0, atol=1e-12)
