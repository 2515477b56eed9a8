"""A hostile round on ``symgrad.bind`` as a user edits a model (issue 62, "a round of hostile cases"): one
model file with a helper's helper, module constants (a number, a dict), a helper module, a closure, a
``functools.partial``, dict and list hyper-parameters, dropout and BatchNorm, call arguments and an optional
tensor argument; traced in both modes, generated and bound. Each case changes something between calls (or
uses the outputs) the way people do; the outcome must be the model's own numbers (outputs and every
``.grad`` as autograd through the model, float64, from one seed) or a one-line ``BindError``; a silent
difference or a traceback fails. ``OUTCOMES`` is the table of what each case does now."""

from __future__ import annotations

import copy
import functools
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symgrad
from symgrad.binding import BindError
from symgrad.pipeline import build_text
from symgrad.trace import load_target, trace_modes

SOURCE = """
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

import hostile_helpers as helpers

GAIN = 1.5
CFG = {"slope": 0.1}
SIZES = [1.0, 2.0]


def inner(x):
    return F.leaky_relu(x, CFG["slope"])


def outer(x):
    return inner(x) * GAIN


def make_shift():
    shift = 0.25

    def shifted(x):
        return x + shift

    def set_shift(value):
        nonlocal shift
        shift = value
    return shifted, set_shift


shifted, set_shift = make_shift()


class Net(nn.Module):
    BIAS = 0.5

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 5)
        self.bn = nn.BatchNorm1d(5)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(5, 3)
        self.aux = nn.Linear(5, 2)
        self.act = functools.partial(F.leaky_relu, negative_slope=0.2)
        self.hp = {"scale": 2.0, "list": [1.0, 3.0]}

    def forward(self, x, scale=1.0, bias=None):
        h = outer(self.bn(self.lin(x)))
        h = self.act(shifted(h)) * self.hp["scale"] + self.hp["list"][1] * helpers.K + SIZES[0] + self.BIAS
        h = helpers.act(h) * scale
        if bias is not None:
            h = h + bias
        return self.head(self.drop(h)), self.aux(h)
"""
HELPERS = "import torch\n\nK = 0.5\n\n\ndef act(x):\n    return torch.tanh(x)\n"


def generate(folder) -> None:
    """The model file, its helper module, and both modes' generated modules, written once into ``folder``."""
    (folder / "hostile_helpers.py").write_text(HELPERS)
    (folder / "hostile_model.py").write_text(SOURCE)
    for text in trace_modes(Env(folder, bind=False).model, {"x": (4, 4)}, "parameters", "hostile"):
        if text is not None:
            for name, content in build_text(text, "hostile.yaml", documents=False).rendered.files.items():
                (folder / name).write_text(content)


class Env:
    """The model imported anew from ``folder`` (its module and helper module fresh), bound."""

    def __init__(self, folder, bind=True):
        sys.modules.pop("hostile_helpers", None)
        sys.path.insert(0, str(folder))
        try:
            torch.manual_seed(0)
            self.model = load_target(f"{folder / 'hostile_model.py'}:Net").double().train()
        finally:
            sys.path.remove(str(folder))
        self.module = sys.modules[type(self.model).__module__]
        self.fast = symgrad.bind(folder / "hostile.py", self.model, verify=False) if bind else None
        self.x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))


def step(net, x, loss=lambda outputs: outputs[0].pow(2).sum() + outputs[1].sum(), call=None, seed=7):
    """Outputs and every parameter's .grad after one backward from one seed (grads zeroed to None first)."""
    for parameter in net.parameters():
        parameter.grad = None
    torch.manual_seed(seed)
    outputs = net(x) if call is None else call(net, x)
    loss(outputs).backward()
    return [o.detach().clone() for o in outputs], {
        k.removeprefix("model."): None if p.grad is None else p.grad.clone() for k, p in net.named_parameters()
    }


def compare(env, change=None, loss=None, call=None):
    """'refused' (one line), 'equal' (the model's numbers), or what went wrong: the case's outcome."""
    if change is not None:
        change(env)
    reference = copy.deepcopy(env.model)
    options = {key: value for key, value in (("loss", loss), ("call", call)) if value is not None}
    try:
        ours = step(env.fast, env.x, **options)
    except BindError as error:
        return "refused" if "\n" not in str(error) else f"refused in {str(error).count(chr(10)) + 1} lines"
    try:
        theirs = step(reference, env.x, **options)
    except Exception as error:  # noqa: BLE001 - autograd raises (a version error): ours must have raised too
        return f"silent: autograd raises {type(error).__name__}, the bound model does not"
    outputs = max((a - b).abs().max().item() for a, b in zip(ours[0], theirs[0]))
    grads = [
        key
        for key, value in ours[1].items()
        if (value is None) != (theirs[1][key] is None)
        or value is not None
        and (value - theirs[1][key]).abs().max().item() > 1e-10
    ]
    return "equal" if outputs <= 1e-10 and not grads else f"silent: outputs off {outputs:.1e}, grads {grads[:3]}"


def _set(target: str, value):
    def change(env):
        owner, _, name = target.rpartition(".")
        holder = {
            "module": env.module,
            "helpers": env.module.helpers,
            "model": env.model,
            "Net": type(env.model),
            "bn": env.model.bn,
            "drop": env.model.drop,
        }[owner]
        setattr(holder, name, value)

    return change


def _item(getter, key, value):
    def change(env):
        getter(env)[key] = value

    return change


CASES = {  # name: keyword arguments of compare()
    "a module constant set between calls": {"change": _set("module.GAIN", 2.5)},
    "a module constant set back to an equal float": {"change": _set("module.GAIN", float("1.5"))},
    "a module-level dict entry set in place": {"change": _item(lambda env: env.module.CFG, "slope", 0.3)},
    "a module-level list entry set in place": {"change": _item(lambda env: env.module.SIZES, 0, 4.0)},
    "a helper module's constant": {"change": _set("helpers.K", 0.9)},
    "a helper module's function replaced": {"change": _set("helpers.act", torch.sigmoid)},
    "a helper's helper replaced at module level": {"change": _set("module.inner", lambda x: F.relu(x))},
    "a closure variable written (nonlocal)": {"change": lambda env: env.module.set_shift(0.75)},
    "a class attribute set": {"change": _set("Net.BIAS", 1.5)},
    "an instance attribute shadowing the class's": {"change": _set("model.BIAS", 1.5)},
    "a dict hyper-parameter set in place": {"change": _item(lambda env: env.model.hp, "scale", 3.0)},
    "a list in a dict hyper-parameter set in place": {"change": _item(lambda env: env.model.hp["list"], 1, 5.0)},
    "a partial made anew with another slope": {
        "change": _set("model.act", functools.partial(F.leaky_relu, negative_slope=0.4))
    },
    "a partial made anew, equal": {"change": _set("model.act", functools.partial(F.leaky_relu, negative_slope=0.2))},
    "BatchNorm momentum": {"change": _set("bn.momentum", 0.5)},
    "BatchNorm eps": {"change": _set("bn.eps", 1e-2)},
    "dropout p": {"change": _set("drop.p", 0.6)},
    "a call argument by keyword": {"call": lambda net, x: net(x, scale=2.0)},
    "a call argument by position": {"call": lambda net, x: net(x, 2.0)},
    "a call argument equal to the default": {"call": lambda net, x: net(x, scale=1.0)},
    "an optional tensor given": {"call": lambda net, x: net(x, bias=torch.ones(5, dtype=torch.float64))},
    "model.eval()": {"change": lambda env: env.model.eval()},
    "dropout alone in eval mode": {"change": lambda env: env.model.drop.eval()},
    "the forward replaced on the instance": {
        "change": lambda env: setattr(
            env.model,
            "forward",
            types.MethodType(
                lambda self, x, scale=1.0, bias=None: (
                    self.head(x @ torch.ones(4, 5, dtype=x.dtype)),
                    self.aux(x @ torch.ones(4, 5, dtype=x.dtype)),
                ),
                env.model,
            ),
        )
    },
    "a parameter replaced by a new Parameter": {
        "change": lambda env: setattr(env.model.head, "weight", nn.Parameter(torch.randn(3, 5, dtype=torch.float64)))
    },
    "a parameter's values set in place": {"change": lambda env: env.model.lin.weight.data.mul_(0.5)},
    "a parameter frozen after bind": {"change": lambda env: env.model.aux.bias.requires_grad_(False)},
    "a loss over one output (.grad None where unreached)": {"loss": lambda outputs: outputs[1].pow(2).sum()},
    "an output changed in place before backward": {"call": lambda net, x: _changed_in_place(net, x)},
    "another batch and a one-sample batch in eval": {
        "change": lambda env: (env.model.eval(), setattr(env, "x", env.x[:1].clone()))
    },
    "the input requires grad": {"change": lambda env: setattr(env, "x", env.x.clone().requires_grad_())},
    "a forward hook on a submodule": {
        "change": lambda env: env.model.head.register_forward_hook(lambda module, inputs, output: output * 2)
    },
}


def _changed_in_place(net, x):
    outputs = net(x)
    outputs[1].mul_(0.5)  # the aux output, which the head's backward does not read: autograd allows it
    return outputs


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    found = tmp_path_factory.mktemp("hostile_round")
    generate(found)
    return found


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_case(case, folder):
    outcome = compare(Env(folder), **CASES[case])
    assert outcome in ("equal", "refused"), outcome


def test_there_are_at_least_thirty_cases():
    assert len(CASES) >= 30
