"""Every op in the registry is traced, in the forms people write it (functional, torch, tensor method,
in-place, nn.Module), with arguments off their defaults; each traced spec is generated and its
gradients compared in float64 with autograd through the traced code itself. Loss tails likewise.

The forms are the rules' own: ``SPELLINGS`` in each ``symgrad/rules/`` module (``rule.spellings``,
``symgrad.rules.base.Spelling``), so a new rule's spellings are traced without an edit here."""

from __future__ import annotations

import inspect
import linecache
import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

from symgrad.check import by_name, module_from_source, relative_error
from symgrad.pipeline import build_text
from symgrad.rules import LAYER_RULES, LOSS_RULES
from symgrad.rules.base import Spelling
from symgrad.trace import LossChoice, TraceError, trace

X = {"x": (2, 3, 8, 8)}


def positive(x):
    return x * x + 1


class TokenGather(nn.Module):
    """``x[:, idx]`` with an int64 buffer of any shape, reshaped as it is read."""

    def __init__(self):
        super().__init__()
        self.register_buffer("idx", torch.tensor([[2, 0], [1, 1], [0, 2]]))

    def forward(self, x):
        return x[:, self.idx.view(-1)].mean(1, keepdim=True) * x[:, :, self.idx].sum(3)


class HalfPrecisionScale(nn.Module):
    """A float64 model computing a part in float32 and converting back (``.float()``, ``.to(w.dtype)``); scaled
    by 2 there, exact whatever order autograd and the explicit backward round in."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, dtype=torch.float64))

    def forward(self, x):
        return ((x * self.w).float() * 2).to(self.w.dtype) * x


class Selected(nn.Module):
    """``torch.index_select`` and ``x.index_select`` with an int64 buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("picked", torch.tensor([2, 0, 1, 1]))

    def forward(self, x):
        return torch.index_select(x, 1, self.picked).sum(1, keepdim=True) * x.index_select(-1, self.picked).sum(
            -1, keepdim=True
        )


class Gathered(nn.Module):
    """``torch.gather`` with an int64 buffer of the output's shape, and ``x.gather`` with a 1-d buffer viewed
    along the dim and expanded over the others (traced as ``x[:, idx]``)."""

    def __init__(self, shape=(2, 3, 8, 8)):
        super().__init__()
        self.register_buffer(
            "full",
            torch.randint(
                0, shape[2], (shape[0], shape[1], 5, shape[3] - 1), generator=torch.Generator().manual_seed(2)
            ),
        )
        self.register_buffer("keep", torch.tensor([3, 0, 3]))

    def forward(self, x):
        picked = x.gather(-1, self.keep.view(1, 1, 1, -1).expand(*x.shape[:-1], -1))
        return torch.gather(x, 2, index=self.full).sum(2, keepdim=True) * picked.mean(-1, keepdim=True)


class BiasTable(nn.Module):
    """Swin's relative position bias: ``table[index.view(-1)].view(N, N, -1)``, added to attention scores."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(5, 2))
        self.register_buffer("index", torch.tensor([[2, 1, 0], [3, 2, 1], [4, 3, 2]]), persistent=False)

    def forward(self, x):
        bias = self.table[self.index.view(-1)].view(3, 3, -1).permute(2, 0, 1).contiguous()
        return x + bias.unsqueeze(0)


class Tokens(nn.Module):
    """Token embeddings: ``F.embedding`` of an int64 buffer of ids, and of the same table with ``padding_idx``
    (its row gets no gradient from that read), as a language model reads its tokens (``nn.Embedding``:
    tests/trace/test_text_transformers.py)."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(5, 4))
        self.register_buffer("ids", torch.tensor([[1, 0, 2], [2, 2, 1]]))

    def forward(self, x):
        return x * F.embedding(self.ids, self.table) + F.embedding(self.ids, self.table, padding_idx=1).tanh()


NAMESPACE = {
    "torch": torch,
    "nn": nn,
    "F": F,
    "math": math,
    "positive": positive,
    "TokenGather": TokenGather,
    "HalfPrecisionScale": HalfPrecisionScale,
    "Selected": Selected,
    "Gathered": Gathered,
    "BiasTable": BiasTable,
    "Tokens": Tokens,
}
"""What a spelling's expression may name (``Spelling``'s docstring): torch and this file's modules."""


def spelled(op: str, index: int, spelling: Spelling):
    """The spelling as a function of its arguments, or as the module it makes, built now (not at import);
    compiled under a file name of its own that is the user's (not symgrad's, not ``<string>``) and that
    ``linecache`` shows."""
    source = spelling.call if spelling.module else f"lambda {', '.join(shapes_of(spelling))}: {spelling.call}"
    filename = str(Path(__file__).with_name(f"spelling_{op}_{index}.py"))
    linecache.cache[filename] = (len(source), None, [source + "\n"], filename)
    return eval(compile(source, filename, "eval"), dict(NAMESPACE))  # noqa: S307 - the rules' own spellings


def shapes_of(spelling: Spelling) -> dict:
    return dict(spelling.shapes) if spelling.shapes is not None else dict(X)


def spellings(rules) -> list:
    """(op, spelling) of every rule in ``rules``, with ids ``<op>-<k>``: the op's k-th spelling."""
    return [
        pytest.param(rule.op, index, spelling, id=f"{rule.op}-{index}")
        for rule in rules
        for index, spelling in enumerate(rule.spellings)
    ]


def compare(function, shapes: dict, text: str, appended: bool = False) -> dict:
    """Generate ``text`` and compare its gradients with autograd through ``function`` itself (float64);
    ``appended``: the function returns a prediction, and ``--loss half_sq_error`` was put after it."""
    spec = yaml.safe_load(text)
    built = build_text(text, "traced.yaml")
    generated = built.rendered
    module = by_name(
        module_from_source(generated.files[f"{generated.name}.py"], generated.name), built.graph
    )  # the parameters go in `params`: called here by their spec names
    generator = torch.Generator().manual_seed(5)
    if isinstance(function, nn.Module):
        function = function.double()
    parameters = (
        dict(function.named_parameters()) | dict(function.named_buffers()) if isinstance(function, nn.Module) else {}
    )
    values = {}
    for key, entry in spec["inputs"].items():
        if key in parameters:
            values[key] = parameters[key].detach().clone().requires_grad_(key in spec["wrt"])
        elif entry.get("dtype") == "int64":
            values[key] = torch.randint(0, 3, entry["shape"], generator=generator)
        else:
            values[key] = torch.randn(entry["shape"], generator=generator, dtype=torch.float64, requires_grad=True)
    seeded = torch.random.fork_rng()  # dropout: the same masks in the function and the generated code
    if isinstance(function, nn.Module):  # run the module on the same parameter values
        with torch.no_grad():
            for key, value in values.items():
                if key in parameters:
                    parameters[key].copy_(value)
        with seeded:
            torch.manual_seed(0)
            reference = torch.func.functional_call(
                function,
                {key: values[key] for key in parameters if key in values},
                tuple(values[key].clone() for key in shapes),
            )
    else:  # clones: the traced code may work in place (relu_, add_)
        with seeded:
            torch.manual_seed(0)
            reference = function(*(values[key].clone() for key in shapes))
    total = 0.5 * (reference - values[spec["loss"]["target"]]).pow(2).sum() if appended else reference
    weight = torch.randn(total.shape, generator=generator, dtype=torch.float64)  # a random cotangent
    expected = torch.autograd.grad(total, [values[key] for key in spec["wrt"]], grad_outputs=weight)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        actual = module.gradients(**values, grad_loss=weight)
    for key, reference_gradient in zip(spec["wrt"], expected):
        assert relative_error(getattr(actual, key), reference_gradient) <= 1e-10, key
    return spec


@pytest.mark.parametrize("op, index, spelling", spellings(LAYER_RULES.values()))
def test_op_is_traced_and_its_gradient_matches_autograd(op, index, spelling):
    function, shapes = spelled(op, index, spelling), shapes_of(spelling)
    if isinstance(function, nn.Module):  # its forward's own argument names (``input``)
        shapes = dict(zip(inspect.signature(function.forward).parameters, shapes.values()))
    text = trace(function, shapes, name="traced", loss=LossChoice("half_sq_error"))
    spec = compare(function, shapes, text, appended=True)
    assert op in [layer["op"] for layer in spec["layers"]], f"{spelling.call} traces to another op:\n{text}"


def test_a_spelling_that_traces_to_another_op_fails():
    with pytest.raises(AssertionError, match=r"x.clamp\(min=0\) traces to another op"):
        test_op_is_traced_and_its_gradient_matches_autograd("relu", 0, Spelling("x.clamp(min=0)"))  # a clamp


@pytest.mark.parametrize(
    "function",
    [lambda x: x.clamp(min=0), lambda x: x.clamp(0, 6), lambda x: torch.clamp(x, -0.5, 0.25)],
    ids=["clamp(min=0)", "clamp(0, 6)", "clamp(a, b)"],
)
def test_a_traced_clamp_passes_the_gradient_at_its_bounds_as_autograd_does(function):
    """``x.clamp(min=0)`` at 0 (a ReLU's zeros sit there), ``clamp(0, 6)`` at 0 and 6: autograd's
    clamp passes the gradient there, where relu's and relu6's backward give 0, so the traced spec keeps the
    clamp op (it was relu and relu6, and the gradients at the bounds were 0)."""
    text = trace(function, {"x": (2, 6)}, name="clamped", loss=LossChoice("half_sq_error"))
    assert [layer["op"] for layer in yaml.safe_load(text)["layers"]][-1] == "clamp", text
    built = build_text(text, "clamped.yaml")
    module = module_from_source(built.rendered.files["clamped.py"], "clamped")
    x = torch.tensor(
        [[0.0, 6.0, -0.5, 0.25, 3.0, -1.0], [7.0, 0.0, 0.1, 6.0, -0.5, 0.25]], dtype=torch.float64, requires_grad=True
    )
    target = torch.zeros(2, 6, dtype=torch.float64)
    (expected,) = torch.autograd.grad(
        0.5 * (function(x.clone()) - target).pow(2).sum() + function(x.clone()).sum(), [x]
    )
    names = [name for name in yaml.safe_load(text)["inputs"] if name != "x"]
    got = module.gradients(x=x, **{names[0]: target - 1})  # (out - (target - 1)) = (out - target) + 1
    assert torch.equal(got.x, expected), (got.x, expected)


def test_every_registry_op_has_a_trace_case():
    assert [op for op, rule in LAYER_RULES.items() if not rule.spellings] == []


def _tails(labelled: bool) -> list:
    return [case for case in spellings(LOSS_RULES.values()) if (case.values[2].dtypes is not None) == labelled]


@pytest.mark.parametrize("op, index, spelling", _tails(labelled=False))
def test_loss_tail_is_recognised_and_matches_autograd(op, index, spelling):
    function, shapes = spelled(op, index, spelling), shapes_of(spelling)
    text = trace(function, shapes, name="traced")
    spec = yaml.safe_load(text)
    assert spec["loss"]["op"] == op and spec["loss"]["reduction"] == spelling.reduction and spec["layers"] == [], text
    assert spec["wrt"] == ["p"] or set(spec["wrt"]) == {"p", "y"}
    compare(function, shapes, text)


@pytest.mark.parametrize("op, index, spelling", _tails(labelled=True))
def test_class_losses_take_int64_labels(op, index, spelling):
    function, shapes = spelled(op, index, spelling), shapes_of(spelling)
    text = trace(function, shapes, name="traced", dtypes=spelling.dtypes)
    spec = yaml.safe_load(text)
    assert spec["loss"]["op"] == op and spec["inputs"]["labels"]["dtype"] == "int64"
    assert spec["wrt"] == ["z"]
    compare(function, shapes, text)


def test_every_registry_loss_is_traced_by_some_case():
    assert [op for op, rule in LOSS_RULES.items() if not rule.spellings] == []


@pytest.mark.parametrize(
    "function",
    [
        lambda x: (lambda a, b: a * b)(*x.chunk(2, dim=2)),
        lambda x: x.split(4, dim=-1)[-1],
        lambda x: x.reshape_as(x.permute(0, 2, 3, 1)),
    ],
    ids=["chunk-spatial", "split-spatial", "reshape_as-spatial"],
)
def test_pieces_whose_sizes_follow_the_input_are_refused(function):
    """Along a spatial dim the pieces' offsets and sizes are the input's: the second run finds them changed."""
    with pytest.raises(TraceError, match="computed from the input's size"):
        trace(function, X, name="traced", loss=LossChoice("half_sq_error"))


def test_a_reshape_of_int64_labels_is_refused_at_its_line():
    """int64 inputs reshaped are kept as views for indexing alone; a loss reading one says so, at its line."""

    def flat_loss(x, labels):
        return F.cross_entropy(x.permute(0, 2, 3, 1).reshape(-1, 3), labels.view(-1))  # FLAT_LABELS

    with pytest.raises(TraceError) as error:
        trace(flat_loss, {"x": (2, 3, 4, 4), "labels": (2, 4, 4)}, dtypes={"labels": "int64"})
    (line,) = str(error.value).splitlines()
    number = next(n for n, text in enumerate(open(__file__).read().splitlines(), 1) if text.endswith("# FLAT_LABELS"))
    assert line.startswith(f"{__file__}:{number}: error: 'cross_entropy' reads a reshape of an int64 input"), line
