"""A forward that builds a cache object each call (transformers' GPT-2 as called, ``use_cache`` at its default):
its ``DynamicCache`` makes layers lazily, and a layer class with two bases that both define
``lazy_initialization`` calls one of them by name (``DynamicLayer.lazy_initialization(self, *args)``,
cache_utils.py:1262). The trace's guards name each base's method apart (``Layer.lazy_initialization@Dynamic``);
when both were one path, bind followed them to the subclass's and refused the model it had just traced as
"changed since it was traced" (95443da). Library-free: a file written, imported anew as another process does."""

from __future__ import annotations

import copy

import torch

import symgrad
from symgrad.pipeline import build_text
from tests.bind.test_trace_guards import generated, imported, one_line_refusal

CACHED = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class LayerMixin:
    def lazy_initialization(self, keys, values):
        raise NotImplementedError


class Dynamic(LayerMixin):
    def __init__(self):
        self.is_initialized = False

    def lazy_initialization(self, keys, values):
        self.keys = torch.tensor([], dtype=keys.dtype)
        self.values = torch.tensor([], dtype=values.dtype)
        self.is_initialized = True

    def update(self, keys, values):
        if not self.is_initialized:
            self.lazy_initialization(keys, values)
        self.keys = torch.cat([self.keys, keys], dim=-2)
        self.values = torch.cat([self.values, values], dim=-2)
        return self.keys, self.values


class Linear(LayerMixin):
    def lazy_initialization(self, states=None):
        self.states = states


class Both(Linear, Dynamic):
    def __init__(self):
        Dynamic.__init__(self)

    def lazy_initialization(self, *args, **kwargs):
        if len(args) == 2 and not kwargs:  # the attention cache: two positional arguments
            Dynamic.lazy_initialization(self, *args)
        else:
            Linear.lazy_initialization(self, *args, **kwargs)


class Cache:
    def __init__(self, layers):
        self.layers = [Both() for _ in range(layers)]

    def update(self, keys, values, index):
        return self.layers[index].update(keys, values)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.ModuleList(nn.Linear(4, 12) for _ in range(2))
        self.head = nn.Linear(4, 3)
        self.drop = nn.Dropout(0.25)

    def forward(self, x, use_cache=True):
        cache = Cache(len(self.qkv)) if use_cache else None
        for index, qkv in enumerate(self.qkv):
            q, k, v = qkv(x).chunk(3, dim=-1)
            if cache is not None:
                k, v = cache.update(k, v, index)
            x = x + self.drop(F.scaled_dot_product_attention(q, k, v, is_causal=True))
        return self.head(x)
"""


def test_a_forward_building_a_cache_with_a_lazily_initialized_layer_binds_and_trains(tmp_path):
    """Traced in both modes at [2, 5, 4], bound without a refusal, 3 SGD steps in train mode (dropout drawn
    alike) equal to autograd through the model at [3, 7, 4], then eval without a new trace."""
    texts = symgrad.trace_modes(imported(tmp_path, CACHED), {"x": (2, 5, 4)}, "parameters", "net")
    for text in texts:  # the modules alone (no documents)
        for name, content in build_text(text, "net.yaml", documents=False).rendered.files.items():
            (tmp_path / name).write_text(content)
    model = imported(tmp_path, CACHED)  # anew: the guards found again in another module object
    reference = copy.deepcopy(model)
    fast = symgrad.bind(tmp_path / "net.py", model, verify=False)  # compared with autograd below
    optimizers = [torch.optim.SGD(net.parameters(), lr=0.1) for net in (model, reference)]
    generator = torch.Generator().manual_seed(1)
    for step in range(3):
        x = torch.randn(3, 7, 4, dtype=torch.float64, generator=generator)
        losses = []
        for net, optimizer in zip((fast, reference), optimizers):
            optimizer.zero_grad()
            torch.manual_seed(100 + step)
            loss = net(x).square().mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        assert torch.allclose(losses[0], losses[1], rtol=0, atol=1e-12), (step, losses)
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)
    model.eval(), reference.eval()
    x = torch.randn(2, 6, 4, dtype=torch.float64, generator=generator)
    with torch.no_grad():
        assert torch.allclose(fast(x), reference(x), rtol=0, atol=1e-12)


def test_an_edit_of_the_base_method_the_layer_calls_by_name_is_refused_naming_it(tmp_path):
    path = generated(tmp_path, imported(tmp_path, CACHED), {"x": (2, 5, 4)})
    edited = CACHED.replace("self.is_initialized = True\n", "self.is_initialized = True\n        self.seen = 1\n")
    one_line_refusal(
        lambda: symgrad.bind(path, imported(tmp_path, edited)),
        r"the code of Dynamic\.lazy_initialization \(.*Both\.lazy_initialization@Dynamic\), which the "
        r"forward calls, changed",
    )
