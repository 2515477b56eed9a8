"""Branch sums add into a kernel's fresh gradient, as autograd's engine adds a node's incoming gradients.

Where a value feeds several ops, its gradient is the sum of what each path sends back. Autograd's engine
(``InputBuffer::accumulate``) adds the later ones into the first in place when no graph is recorded and
nothing else holds that buffer; the generated backward made a new tensor per sum (``a + b``). The planner
now writes ``_add_into(fresh, *others)`` where one term is a kernel's new output that this sum alone
reads (or a product computed right there), and the helper adds into it where no graph is recorded, no
``torch.func`` transform runs and every term is a tensor of its shape and dtype; else it adds as ``+``
does, so ``gradients`` stays differentiable. The forward's residual sums add into their fresh term the same
way, as a model's ``out += identity`` does.
"""

from __future__ import annotations

import copy

import pytest
import sympy
import torch
import torch.nn as nn
import torch.nn.functional as F

import symgrad
from symgrad.algebra import op, tensor
from symgrad.lifetimes import Scheduled, added_in_place
from symgrad.reverse import Statement
from symgrad.rules.shared import ADD_INTO
from symgrad.trace import LossChoice, trace
from tests.helpers import build_text, module_from_source
from tests.models.classic import BasicBlock  # torchvision's, as its authors write it: `out += identity`
from tests.rules.test_norm_statistics import _Counted


def _helper():
    namespace = {"torch": torch}
    exec(ADD_INTO, namespace)
    return namespace["_add_into"]


def test_without_a_graph_the_sum_is_made_in_the_fresh_term():
    add_into = _helper()
    fresh, b, c = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    expected = fresh + b + c
    with torch.no_grad():
        total = add_into(fresh, b, c)
    assert total is fresh and torch.equal(total, expected)


def test_where_a_graph_is_recorded_the_sum_is_new_and_differentiable():
    add_into = _helper()
    fresh = torch.randn(2, 3, requires_grad=True) * 1.0  # a non-leaf, as a kernel's output is
    other = torch.randn(2, 3, requires_grad=True)
    before = fresh.detach().clone()
    total = add_into(fresh, other)
    assert total is not fresh and torch.equal(fresh.detach(), before)
    (grad,) = torch.autograd.grad(total.sum(), other)
    assert torch.equal(grad, torch.ones(2, 3))


@pytest.mark.parametrize("case", ["dtype", "shape", "number"])
def test_terms_of_another_dtype_or_shape_or_numbers_are_added_as_plus_adds_them(case):
    add_into = _helper()
    fresh = torch.randn(1, 3, dtype=torch.bfloat16) if case == "dtype" else torch.randn(1, 3)
    other = {"dtype": torch.randn(1, 3), "shape": torch.randn(2, 3), "number": 0.5}[case]
    before = fresh.clone()
    with torch.no_grad():
        total = add_into(fresh, other)
    assert torch.equal(total, fresh + other) and total.dtype == torch.float32 and torch.equal(fresh, before)


def test_a_product_of_numbers_as_the_fresh_term_is_added_as_plus_adds_it():
    # a block's hyper-parameters are Python numbers: `alpha * beta + x` may pick their product
    add_into, other = _helper(), torch.randn(2, 3)
    with torch.no_grad():
        assert torch.equal(add_into(0.5 * 2.0, other), 1.0 + other)


def test_under_vmap_an_unbatched_fresh_term_takes_a_batched_one():
    add_into = _helper()
    fresh, others = torch.randn(3), torch.randn(5, 3)
    with torch.no_grad():
        total = torch.func.vmap(lambda other: add_into(fresh * 1.0, other))(others)
    assert torch.equal(total, fresh + others)


def _scheduled(*statements, dead=None):
    dead = dead or {}
    return [Scheduled(statement, dead.get(statement.target.name, ())) for statement in statements]


def _planned_sum(*statements, dead):
    """The value ``added_in_place`` leaves in the last statement."""
    return added_in_place(_scheduled(*statements, dead=dead))[-1].statement.value


g, y, x, t, u, v = (tensor(name) for name in ("g", "y", "x", "t", "u", "v"))
MASKED = Statement(t, op("threshold_backward", g, y), "relu")  # a kernel's new output
UNBROADCAST = Statement(u, op("sum_to_size", g, x), "add")  # may be g itself: not fresh


def test_the_planner_adds_into_a_fresh_kernel_output_that_this_sum_alone_reads():
    total = _planned_sum(
        MASKED, UNBROADCAST, Statement(tensor("grad_x"), t + u, "x", gradient_of="x"), dead={"grad_x": ("t", "u")}
    )
    assert total == op("add_into", t, u)


def test_the_planner_leaves_a_sum_whose_fresh_term_is_read_elsewhere_or_kept():
    summed = Statement(tensor("grad_x"), t + u, "x", gradient_of="x")
    viewed = Statement(v, op("sum_to_size", t, x), "view")  # a view of t, which a later line may read
    assert isinstance(_planned_sum(MASKED, UNBROADCAST, viewed, summed, dead={"grad_x": ("t", "u")}), sympy.Add)
    assert isinstance(_planned_sum(MASKED, UNBROADCAST, summed, dead={"grad_x": ("u",)}), sympy.Add)  # t lives on
    aliases = Statement(tensor("grad_x"), u + v, "x", gradient_of="x")
    assert isinstance(
        _planned_sum(UNBROADCAST, Statement(v, op("sum_to_size", y, x), "add"), aliases, dead={"grad_x": ("u", "v")}),
        sympy.Add,
    )


def test_the_planner_never_adds_into_a_term_that_another_term_of_the_sum_reads():
    # `W + W.t()`'s gradient, `grad_add + grad_add.permute(1, 0)`: added in place, the kernel would read a
    # view of the tensor it writes (PyTorch refuses a dense one, and a strided one comes out wrong)
    read_twice = Statement(tensor("grad_x"), t + op("sum_to_size", t, x), "x", gradient_of="x")
    assert isinstance(_planned_sum(MASKED, read_twice, dead={"grad_x": ("t",)}), sympy.Add)


class Symmetric(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return F.relu(x @ (self.weight + self.weight.t()))


def test_a_parameter_read_with_its_transpose_trains_as_autograd():
    torch.manual_seed(0)
    model = Symmetric().double()
    text = trace(
        model, {"x": (5, 4)}, wrt="parameters", name="symmetric", mode="train", loss=LossChoice("mse_loss", "target")
    )
    generated = module_from_source(build_text(text, "symmetric.yaml").rendered.files["symmetric.py"], "symmetric")
    bound_model = copy.deepcopy(model)
    x, target = torch.randn(7, 4, dtype=torch.float64), torch.randn(7, 4, dtype=torch.float64)
    symgrad.bind(generated, bound_model)(x=x, target=target).backward()
    F.mse_loss(model(x), target).backward()
    assert (bound_model.weight.grad - model.weight.grad).abs().max() <= 1e-12


def test_a_product_computed_in_the_call_is_a_fresh_term():
    total = _planned_sum(
        UNBROADCAST, Statement(tensor("grad_x"), u + g * y, "x", gradient_of="x"), dead={"grad_x": ("u",)}
    )
    assert total == op("add_into", g * y, u)


class SmallResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(inplace=True))
        self.layers = nn.Sequential(BasicBlock(4, 4), BasicBlock(4, 8, stride=2), BasicBlock(8, 8))
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@pytest.mark.parametrize("blocks", [False, True], ids=["flat", "blocks"])
def test_a_bound_residual_step_makes_no_tensor_per_sum_and_equals_autograd(blocks):
    torch.manual_seed(0)
    model = SmallResNet().double().train()
    text = trace(
        model,
        {"x": (2, 3, 8, 8)},
        wrt="parameters",
        name="small_resnet",
        mode="train",
        loss=LossChoice("cross_entropy", "labels"),
        blocks=blocks,
    )
    generated = module_from_source(
        build_text(text, "small_resnet.yaml").rendered.files["small_resnet.py"], "small_resnet"
    )
    bound_model = copy.deepcopy(model)
    bound = symgrad.bind(generated, bound_model)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 3, 10, 6, generator=generator, dtype=torch.float64)  # another batch and size
    labels = torch.randint(0, 5, (3,), generator=generator)
    bound(x=x, labels=labels)  # bind checks a call's sizes once, on meta tensors
    with _Counted() as forward:
        loss = bound(x=x, labels=labels)
    # the forward's residual sums (`out += identity` in the model) add into the fresh batch-norm output
    assert forward.calls["aten.add.Tensor"] == 0 and forward.calls["aten.add_.Tensor"] == 3, forward.calls
    with _Counted() as counted:
        loss.backward()
    # three branch sums: each block's input feeds its first convolution and the residual path (the
    # downsampling block's, its 1x1 convolution), each added into a convolution's gradient; before, three
    # `aten.add.Tensor` calls made a new tensor each
    assert counted.calls["aten.add.Tensor"] == 0, counted.calls
    assert counted.calls["aten.add_.Tensor"] == 3, counted.calls
    model(x)  # the running statistics moved twice, as the bound model's
    F.cross_entropy(model(x), labels).backward()
    for (name, ours), theirs in zip(bound_model.named_parameters(), model.parameters()):
        assert (ours.grad - theirs.grad).norm() <= 1e-12 * theirs.grad.norm(), name
    for (name, ours), theirs in zip(bound_model.named_buffers(), model.buffers()):
        assert torch.equal(ours, theirs) or (ours - theirs).abs().max() <= 1e-12, name
