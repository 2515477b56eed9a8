"""``torch.compile`` of a bound model: Dynamo reaches each submodule by one path (from the model), so that each
check symgrad makes at a call is one guard (issue 65 item 3: symgrad's lists of submodules gave Dynamo a second
path to each and a Python ``is`` guard per pair, 639 on ResNet-18, 4x the guard time of ``torch.compile(model)``);
and every check still refuses under ``torch.compile`` (a guard fails, Dynamo traces the call again, the check
refuses)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

import symgrad
from symgrad.pipeline import build_text
from symgrad.trace import trace


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x))) + x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(3, 4)

    def forward(self, x):
        return self.head(self.blocks(x).mean((2, 3)))


def compiled_step(tmp_path, fullgraph=True):
    torch.manual_seed(0)
    model = Net().double().train()
    text = trace(model, {"x": (2, 3, 5, 5)}, wrt="parameters", name="guarded_net", mode="train")
    path = tmp_path / "guarded_net.py"
    path.write_text(build_text(text, "guarded_net.yaml", documents=False, tests=False).rendered.files[path.name])
    fast = symgrad.bind(path, model, verify=False)
    torch._dynamo.reset()
    return model, fast, torch.compile(fast, fullgraph=fullgraph, backend="eager")


def guards(fast, x) -> str:
    """The guards of the compiled frame a call of ``fast`` on ``x`` runs."""
    frame = {"self": fast, "args": (x,), "kwargs": {}}
    entries = _debug_get_cache_entry_list(type(fast).forward.__code__)
    (manager,) = [entry.guard_manager for entry in entries if entry.guard_manager.check(frame)]
    return str(manager)


def aliases(text: str) -> list[str]:
    """Dynamo's Python guards on objects reached by two paths from the call's locals."""
    return [line.strip() for line in text.splitlines() if "LAMBDA_GUARD: L[" in line]


def test_each_submodule_is_reached_by_one_path_and_guarded_once(tmp_path):
    model, fast, compiled = compiled_step(tmp_path)
    x = torch.randn(3, 3, 6, 6, dtype=torch.float64)
    compiled(x).sum().backward()
    text = guards(fast, x)
    # the model itself: BoundModel.model and the bound mode's model, one object by two attributes
    assert aliases(text) == [next(line for line in aliases(text) if "L['self']._modules['model'] is " in line)]
    for path, module in model.named_modules():  # each child's identity, one C guard on the model's path
        if path:
            source = "L['self']._modules['model']" + "".join(f"._modules['{name}']" for name in path.split("."))
            assert f"___check_obj_id({source}, {id(module)})" in text, path
    copied = copy.deepcopy(fast)  # its checks compare the copy's submodules (their ids), not the original's
    torch.compile(copied, fullgraph=True, backend="eager")(x).sum().backward()
    assert all(value.grad is not None for value in copied.model.parameters())
    assert len(aliases(guards(copied, x))) == 1


def test_a_compiled_bound_model_refuses_what_the_eager_one_refuses(tmp_path):
    """Each check fails a guard, Dynamo traces the call again, and the check refuses (its message is built
    where Dynamo breaks the graph: with fullgraph=True Dynamo reports that break instead). One compile, ~4 s."""
    model, fast, compiled = compiled_step(tmp_path, fullgraph=False)
    x = torch.randn(3, 3, 6, 6, dtype=torch.float64)
    compiled(x)
    conv, block = model.blocks[1].conv, model.blocks[0]
    changes = [
        ("a submodule conv of Block was replaced", lambda: setattr(model.blocks[1], "conv", copy.deepcopy(conv))),
        ("eps=0.001 since bind", lambda: setattr(block.bn, "eps", 1e-3)),
        ("blocks.1.bn", lambda: model.blocks[1].bn.eval()),
    ]
    undo = [
        lambda: setattr(model.blocks[1], "conv", conv),
        lambda: setattr(block.bn, "eps", 1e-5),
        lambda: model.blocks[1].bn.train(),
    ]
    for (words, change), back in zip(changes, undo):
        change()
        with pytest.raises(symgrad.BindError, match=words):
            compiled(x)
        back()
    compiled(x)  # as bound again: runs (the first compile's guards hold again)
