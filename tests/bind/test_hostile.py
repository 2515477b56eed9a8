"""Hostile use of ``symgrad.bind``, in the spirit of ``tests/cli/test_hostile_specs.py``: wrong data, a model
changed before or after binding, odd call patterns, odd files. Each case, in the flat form and as
blocks, either trains exactly as autograd does through the model (float64, <= 1e-10: every ``.grad``
and every buffer), or raises one line (a :class:`BindError`, a ``ValueError``, or the very error
autograd raises for the same misuse): never a silent wrong answer, never a traceback-only crash."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import symgrad
from symgrad.binding import BindError
from tests.bind.test_guard import assert_same, built_model, data, generate, write_model

FORMS = ["flat", "blocks"]


@dataclass
class Env:
    """One case's world: the generated file, the model bound to it (``step``) and autograd's copy."""

    folder: Path
    path: Path
    reference_path: str
    model: nn.Module
    reference: nn.Module
    step: nn.Module


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The traced model's generated file per form, made once (a copy per case is bound to it)."""
    made = {}

    def get(form: str, variant: str = "plain"):
        if (form, variant) not in made:
            folder = tmp_path_factory.mktemp(f"{form}_{variant}")
            reference = write_model(folder)
            init = {"freeze_stem": True} if variant == "frozen" else {}
            path = generate(folder, built_model(reference, **init), form)
            made[form, variant] = folder, path, reference
        return made[form, variant]

    return get


def env_for(generated, form, variant="plain") -> Env:
    folder, path, reference = generated(form, variant)
    model = built_model(reference, **({"freeze_stem": True} if variant == "frozen" else {}))
    return Env(folder, path, reference, model, copy.deepcopy(model), symgrad.bind(path, model, verify=False))


def autograd_step(model, x, labels, scale=1.0):
    (scale * F.cross_entropy(model(x), labels)).backward()


# --- the cases: each returns (ours, theirs), two functions; theirs is None where only a refusal is right ---


def _data_case(**changes):
    def case(env):
        x, labels = data()
        arguments = {"x": x, "labels": labels, **{key: value(x, labels) for key, value in changes.items()}}
        return (
            lambda: env.step(**arguments).backward(),
            lambda: autograd_step(env.reference, arguments["x"], arguments["labels"]),
        )

    return case


def _positional(env):
    x, labels = data()
    return lambda: env.step(x, labels), None


def _unknown(env):
    x, labels = data()
    return lambda: env.step(x=x, labels=labels, y=x), None


def _missing(env):
    x, _ = data()
    return lambda: env.step(x=x), None


def _shaped(batch, height, width):
    def case(env):
        x, labels = data(batch=batch, height=height, width=width)
        return lambda: env.step(x=x, labels=labels).backward(), lambda: autograd_step(env.reference, x, labels)

    return case


def _layout(transform):
    def case(env):
        x, labels = data(batch=4, height=6, width=6)
        x = transform(x)
        return lambda: env.step(x=x, labels=labels).backward(), lambda: autograd_step(env.reference, x, labels)

    return case


def _model_change(change, before_bind=False):
    """The model changed after bind (or before it: bound then), then one step."""

    def case(env):
        x, labels = data()

        def ours():
            change(env.model)
            step = symgrad.bind(env.path, env.model) if before_bind else env.step
            step(x=x, labels=labels).backward()

        def theirs():
            change(env.reference)
            autograd_step(env.reference, x, labels)

        return ours, theirs

    return case


def _calls(pattern):
    """A pattern of steps and backward calls, run on the bound step and on autograd's model."""

    def case(env):
        return (
            lambda: pattern(lambda x, labels: env.step(x=x, labels=labels)),
            lambda: pattern(lambda x, labels: F.cross_entropy(env.reference(x), labels)),
        )

    return case


def _two_in_one_graph(step):
    (x1, l1), (x2, l2) = data(seed=1), data(batch=2, height=5, width=7, seed=2)
    (step(x1, l1) + 2 * step(x2, l2)).backward()


def _three_in_one_graph(step):
    losses = [step(*data(batch=2 + index, seed=index)) for index in range(3)]
    (losses[0] - losses[1] * 0.5 + losses[2] ** 2).backward()


def _two_graphs_then_backwards_in_reverse(step):
    first, second = step(*data(seed=1)), step(*data(seed=2))
    second.backward()
    first.backward()


def _retain_graph_twice(step):
    loss = step(*data())
    loss.backward(retain_graph=True)
    loss.backward()


def _backward_twice(step):
    loss = step(*data())
    loss.backward()
    loss.backward()


def _scaled_gradient(step):
    step(*data()).backward(torch.tensor(3.0, dtype=torch.float64))


def _times_zero(step):
    (0 * step(*data())).backward()


def _accumulate(step):
    for seed in range(3):
        step(*data(seed=seed)).backward()


def _no_grad(step):
    with torch.no_grad():
        step(*data())


def _inference_mode(step):
    with torch.inference_mode():
        step(*data())


def _grad_of_grad(step):
    x, labels = data()
    loss = step(x, labels)
    parameters = [value for value in _current_model[0].parameters() if value.requires_grad]
    grads = torch.autograd.grad(loss, parameters, create_graph=True)
    sum((grad**2).sum() for grad in grads).backward()


_current_model: list = [None]


def _sgd_between(step):
    for seed in range(2):
        loss = step(*data(seed=seed))
        loss.backward()
        with torch.no_grad():
            for value in _current_model[0].parameters():
                if value.grad is not None:
                    value -= 0.1 * value.grad


def _bind_case(target):
    def case(env):
        return lambda: symgrad.bind(target(env), env.model), None

    return case


def _other_model(change):
    def case(env):
        def ours():
            model = change(env)
            symgrad.bind(env.path, model)(x=data()[0], labels=data()[1]).backward()

        return ours, None

    return case


def _frozen_unfrozen(env):
    x, labels = data()

    def ours():
        env.model.stem.weight.requires_grad_(True)
        env.step(x=x, labels=labels).backward()

    return ours, None


class Wrapped(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


def _write(env, name, text):
    path = env.folder / name
    path.write_text(text)
    return path


CASES = {
    # data
    "missing labels": ("refused", _missing),
    "an unknown argument": ("refused", _unknown),
    "arguments by position": ("refused", _positional),
    "x as a list": ("refused", _data_case(x=lambda x, labels: x.tolist())),
    "x as a numpy array": ("refused", _data_case(x=lambda x, labels: x.numpy())),
    "x in float32, the model in float64": ("refused", _data_case(x=lambda x, labels: x.float())),
    "x of int64": ("refused", _data_case(x=lambda x, labels: x.long())),
    "labels of float": ("refused", _data_case(labels=lambda x, labels: labels.double())),
    "labels of shape N x 1": ("refused", _data_case(labels=lambda x, labels: labels[:, None])),
    "labels of another batch": ("refused", _data_case(labels=lambda x, labels: torch.cat([labels, labels]))),
    "a label out of range": ("refused", _data_case(labels=lambda x, labels: torch.full_like(labels, 7))),
    "a label of -1": ("refused", _data_case(labels=lambda x, labels: torch.full_like(labels, -1))),
    "a label of -100 (cross_entropy's ignore_index)": (
        "trains",
        _data_case(labels=lambda x, labels: torch.where(torch.arange(len(labels)) == 1, -100, labels)),
    ),
    "x with four channels": ("refused", _data_case(x=lambda x, labels: torch.cat([x, x[:, :1]], 1))),
    "x without a batch dimension": ("refused", _data_case(x=lambda x, labels: x[0])),
    "x with five dimensions": ("refused", _data_case(x=lambda x, labels: x[:, :, None])),
    "an empty batch": ("refused", _data_case(x=lambda x, labels: x[:0], labels=lambda x, labels: labels[:0])),
    "one value per channel": ("refused", _shaped(1, 1, 1)),
    "x on the meta device": ("refused", _data_case(x=lambda x, labels: x.to("meta"))),
    "x that requires grad (outside wrt)": ("refused", _data_case(x=lambda x, labels: x.clone().requires_grad_())),
    "batch 1 at 4 x 4": ("trains", _shaped(1, 4, 4)),
    "2 x 2 images": ("trains", _shaped(3, 2, 2)),
    "odd sizes 7 x 5": ("trains", _shaped(2, 7, 5)),
    "x a transposed view": ("trains", _layout(lambda x: x.transpose(2, 3))),
    "x in channels_last": ("trains", _layout(lambda x: x.contiguous(memory_format=torch.channels_last))),
    "x a strided slice": ("trains", _layout(lambda x: x[:, :, ::2])),
    # the model changed before or after bind
    "model.eval() after bind": ("refused", _model_change(lambda model: model.eval())),
    "one BatchNorm frozen after bind": ("refused", _model_change(lambda model: model.blocks[0].bn.eval())),
    "the stem frozen after bind": ("trains", _model_change(lambda model: model.stem.weight.requires_grad_(False))),
    "a parameter frozen at trace, unfrozen": ("refused", _frozen_unfrozen),
    "a parameter replaced, same shape": (
        "trains",
        _model_change(
            lambda model: setattr(model.head, "weight", nn.Parameter(torch.full_like(model.head.weight, 0.1)))
        ),
    ),
    "a parameter replaced, another shape": (
        "trains",
        _model_change(
            lambda model: setattr(model.stem, "weight", nn.Parameter(torch.ones(4, 3, 5, 5, dtype=torch.float64)))
        ),
    ),
    "a BatchNorm replaced by Identity": ("refused", _model_change(lambda model: setattr(model, "bn", nn.Identity()))),
    "a BatchNorm's momentum changed after bind": (
        "refused",
        _model_change(lambda model: setattr(model.bn, "momentum", 0.5)),
    ),
    "a BatchNorm's eps changed after bind": ("refused", _model_change(lambda model: setattr(model.bn, "eps", 1e-2))),
    "a conv's stride changed after bind": (
        "refused",
        _model_change(lambda model: setattr(model.stem, "stride", (2, 2))),
    ),
    "a conv's padding changed before bind": (
        "refused",
        _model_change(lambda model: setattr(model.stem, "padding", (2, 2)), before_bind=True),
    ),
    "every parameter frozen": ("as autograd", _model_change(lambda model: model.requires_grad_(False))),
    "the running statistics reset after bind": ("trains", _model_change(lambda model: model.bn.reset_running_stats())),
    "a new buffer registered": (
        "refused",
        _model_change(lambda model: model.head.register_buffer("scale", torch.ones(1)), before_bind=True),
    ),
    # call patterns
    "two steps in one graph": ("trains", _calls(_two_in_one_graph)),
    "three steps in one graph": ("trains", _calls(_three_in_one_graph)),
    "two graphs, backwards in reverse": ("trains", _calls(_two_graphs_then_backwards_in_reverse)),
    "retain_graph, backward twice": ("trains", _calls(_retain_graph_twice)),
    "backward twice without retain_graph": ("as autograd", _calls(_backward_twice)),
    "backward(gradient=3)": ("trains", _calls(_scaled_gradient)),
    "the loss times zero": ("trains", _calls(_times_zero)),
    "gradients accumulated over three steps": ("trains", _calls(_accumulate)),
    "a step under no_grad": ("trains", _calls(_no_grad)),
    "a step under inference_mode": ("trains", _calls(_inference_mode)),
    "the gradient of the gradient": ("trains", _calls(_grad_of_grad)),
    "SGD between steps": ("trains", _calls(_sgd_between)),
    # what is bound
    "a path that does not exist": ("refused", _bind_case(lambda env: env.folder / "missing.py")),
    "a folder": ("refused", _bind_case(lambda env: env.folder)),
    "the spec instead of the module": ("refused", _bind_case(lambda env: _write(env, "net.yaml", "name: net\n"))),
    "a Python file symgrad did not write": (
        "refused",
        _bind_case(lambda env: _write(env, "evil.py", "raise SystemExit('imported')\n")),
    ),
    "the generated file with its header line edited": (
        "refused",
        _bind_case(lambda env: _write(env, "edited.py", env.path.read_text().replace("Do not edit.", "Edited.", 1))),
    ),
    "a model wrapped in a module": ("refused", _other_model(lambda env: Wrapped(env.model))),
    "a subclass of the model's class": (
        "refused",
        _other_model(lambda env: type("NetV2", (type(env.model),), {})().double().train()),
    ),
    "a wider model": ("refused", _other_model(lambda env: built_model(env.reference_path, width=6))),
    "a model built with other classes": (
        "refused",
        _other_model(lambda env: built_model(env.reference_path, classes=5)),
    ),
    "DataParallel-style wrapper": ("refused", _other_model(lambda env: nn.DataParallel(env.model))),
}
"""Case name -> (what must happen: "trains", "refused", or "as autograd": the same error autograd raises).
A label of -100 is ``F.cross_entropy``'s default ``ignore_index``: the gradient skips it as autograd's does."""
WIDER_TRAINS = {"a wider model", "a model built with other classes"}
"""A module reads each parameter at its size, with blocks or flat: these train there (checked against
autograd below)."""


def test_there_are_at_least_forty_hostile_cases():
    assert len(CASES) >= 40


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", list(CASES))
def test_hostile_bind_case(name, form, generated):
    expected, case = CASES[name]
    env = env_for(generated, form, "frozen" if name == "a parameter frozen at trace, unfrozen" else "plain")
    _current_model[0] = env.model
    ours, theirs = case(env)
    if name in WIDER_TRAINS:
        expected = "trains at any width"
    before = copy.deepcopy(env.model.state_dict())
    try:
        ours()
    except (BindError, ValueError) as error:
        text = str(error)
        assert expected == "refused", f"{name}: refused where it should train: {text}"
        assert text and "\n" not in text and len(text) < 600, text
        if "moved their statistics" not in text:  # refused before anything ran: nothing moved
            state = env.model.state_dict()
            for key, value in before.items():  # a case may have added one (a new buffer) or removed some
                assert key not in state or torch.equal(state[key], value), (name, key)
        return
    except (RuntimeError, TypeError, IndexError) as error:
        assert expected == "as autograd", f"{name}: {type(error).__name__}: {error}"
        _current_model[0] = env.reference
        with pytest.raises(type(error)):
            theirs()
        return
    if expected == "trains at any width":
        return  # the wider model trained; tests/bind/test_bind.py compares it with autograd
    assert expected == "trains", f"{name}: ran where it should be refused"
    _current_model[0] = env.reference
    theirs()
    assert_same(env.model, env.reference)
