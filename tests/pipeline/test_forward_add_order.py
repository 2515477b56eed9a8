"""A forward's ``a + b`` is printed as the model adds, ``a`` first (symgrad/algebra.py ``OrderedAdd``), not
in sympy's order: the values are the same either way, but a tensor sum takes its first operand's strides,
and what reads it next reduces in that memory order. ConvNeXt's blocks, ``input + branch`` with the branch
permuted back from channels_last, printed ``permute_2 + x`` in the block body (sympy orders by name): the
sum came out channels_last and the next by-hand layer norm's float32 means rounded otherwise, so no
parameter gradient of the blocks form was autograd's bit for bit in the default layout (0/182)."""

from __future__ import annotations

import copy

import sympy
import torch
import torch.nn.functional as F
from torch import nn

import symgrad
from symgrad.algebra import OrderedAdd
from symgrad.pipeline import build_text
from symgrad.printing import to_code
from symgrad.rules.elementwise import ADD_INTO_SECOND
from symgrad.trace import LossChoice, trace


class _Block(nn.Module):
    """ConvNeXt's block, small: a depthwise convolution, a layer norm and the pointwise map in channels_last
    by permute, and the residual added as the model writes it, ``input + branch``."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pwconv = nn.Linear(dim, dim)

    def forward(self, x):
        branch = self.pwconv(self.norm(self.dwconv(x).permute(0, 2, 3, 1)))
        return x + branch.permute(0, 3, 1, 2)


class _Net(nn.Module):
    def __init__(self, dim: int = 32):
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 2, stride=2)
        self.blocks = nn.Sequential(_Block(dim), _Block(dim))
        self.head = nn.Linear(dim, 5)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        x = x - x.mean(1, keepdim=True)  # over channels, as ConvNeXt's channels_first layer norm
        return self.head(x.mean((2, 3)))


def _source(model, blocks: bool, shape=(2, 3, 8, 8)) -> str:
    text = trace(model, {"x": shape}, name="net", loss=LossChoice("cross_entropy"), mode="train", blocks=blocks)
    return build_text(text, "net.yaml", documents=False, tests=False).rendered.files["net.py"]


def test_a_residual_add_of_two_layouts_trains_bit_for_bit_as_blocks(tmp_path):
    torch.manual_seed(0)
    model = _Net().train()
    source = _source(model, blocks=True)
    assert "add = x + permute_2\n" in source  # the block body: the model's order, not sympy's
    folder = tmp_path
    (folder / "net.py").write_text(source)
    generator = torch.Generator().manual_seed(1)
    x, target = torch.randn(3, 3, 12, 12, generator=generator), torch.randint(0, 5, (3,), generator=generator)
    for layout in (torch.contiguous_format, torch.channels_last):
        reference, ours = (copy.deepcopy(model).to(memory_format=layout) for _ in range(2))
        data = {"x": x.contiguous(memory_format=layout), "target": target}
        F.cross_entropy(reference(data["x"]), target).backward()
        symgrad.bind(folder / "net.py", ours)(**data).backward()
        for (name, mine), theirs in zip(ours.named_parameters(), reference.parameters()):
            assert torch.equal(mine.grad, theirs.grad), (layout, name)


def test_an_ordered_sum_keeps_its_order_through_renaming_and_printing():
    a, b, renamed = sympy.symbols("x permute_2 input")
    with sympy.evaluate(False):
        total = OrderedAdd(a, b)
    assert to_code(total) == "x + permute_2" and to_code(sympy.Add(a, b)) == "permute_2 + x"
    assert to_code(total.xreplace({a: renamed})) == "input + permute_2"  # a block body's names
    assert sympy.diff(total, b) == 1 and total.xreplace({a: 0}) == b  # a sum to sympy
    assert type(OrderedAdd(a, sympy.Float(1e-6))) is sympy.Add  # a number sets no strides


def test_a_fresh_second_term_is_added_into_only_where_it_has_the_firsts_strides():
    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.branch, self.head = nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1), nn.Linear(4, 3)

        def forward(self, x):
            x = self.conv(x)
            return self.head((x + self.branch(x)).mean((2, 3)))

    assert "add = _add_into_second(conv, branch)\n" in _source(Residual(), blocks=False, shape=(2, 4, 3, 3))
    namespace = {"torch": torch}
    exec(ADD_INTO_SECOND, namespace)
    add_into_second = namespace["_add_into_second"]
    first = torch.randn(2, 3, 4, 5)
    with torch.no_grad():
        fresh = torch.randn(2, 3, 4, 5)
        expected = first + fresh
        total = add_into_second(first, fresh)
        assert total.data_ptr() == fresh.data_ptr() and torch.equal(total, expected)
        other = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
        kept = other.clone()
        total = add_into_second(first, other)
        assert total.stride() == first.stride() and torch.equal(other, kept) and torch.equal(total, first + kept)
    fresh = torch.randn(2, 3, 4, 5, requires_grad=True)  # a graph is recorded: a new tensor, as autograd's
    assert add_into_second(first, fresh).data_ptr() != fresh.data_ptr()
