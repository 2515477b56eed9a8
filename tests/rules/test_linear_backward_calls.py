"""A linear map over more than two dims (a ConvNeXt block's ``nn.Linear`` on [N, H, W, C] tokens) pulls its
gradient back as autograd's addmm backward does: the gradient seen as [N, out] once (``torch.flatten``, a
copy where it is strided: the permute back of a [N, C, H, W] gradient), which the bias's sum, the weight's
``mm`` and the input's ``mm`` all read. It was flattened by the weight's gradient and again by ``matmul``
for the input's: two copies of a strided gradient where autograd makes one, and ``matmul``'s dispatch."""

from __future__ import annotations

import collections
import copy
import functools
import re

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import symgrad
from symgrad.check import module_from_source
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace
from tests.models.zoo import ConvNeXt


class _Calls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


@functools.cache
def _network_and_module():
    """A narrow ConvNeXt, one block a stage (copied by each test), its generated module's source and the
    module, built once. A block's gradient comes from the next layer's convolution, [N, C, H, W] and dense,
    so its linear maps' gradients, permuted to [N, H, W, C], are strided."""
    torch.manual_seed(0)
    model = ConvNeXt(depths=(1, 1, 1, 1), dims=(4, 8, 8, 8))
    text = trace(model, {"x": (2, 3, 32, 32)}, wrt="parameters", name="net", loss=LossChoice("cross_entropy", "labels"))
    source = build_text(text, "net.yaml").rendered.files["net.py"]
    return model, source, module_from_source(source, "net")


def _data(dtype):
    generator = torch.Generator().manual_seed(1)
    return torch.randn(3, 3, 64, 64, generator=generator, dtype=dtype), torch.randint(0, 5, (3,), generator=generator)


def test_a_convnext_flattens_each_linear_maps_gradient_once_and_equals_autograd():
    model, source, generated = _network_and_module()
    # each function of the module casts each gradient once where autocast runs (a name the bias's sum reads
    # too) and flattens that once, into one name that the three products read
    casts = [name for name, _ in re.findall(r"(shared_\d+) = _in_autocast_dtype\((grad_\w+)\)", source)]
    flattened = re.findall(r"(shared_\d+) = torch\.flatten\((shared_\d+), end_dim=-2\)", source)
    assert casts and sorted(cast for _, cast in flattened if cast in casts) == sorted(casts), (casts, flattened)
    assert ".matmul(" not in source and source.count("_in_autocast_dtype(grad_") == len(casts)
    model = copy.deepcopy(model).double()
    ours, theirs = copy.deepcopy(model), copy.deepcopy(model)
    x, labels = _data(torch.float64)
    symgrad.bind(generated, ours, verify=False)(x=x, labels=labels).backward()
    F.cross_entropy(theirs(x), labels).backward()
    for (name, mine), expected in zip(ours.named_parameters(), theirs.parameters()):
        assert (mine.grad - expected.grad).abs().max() <= 1e-12 * max(expected.grad.abs().max(), 1.0), name


def test_a_convnext_step_copies_no_more_than_autograds():
    """One training step (forward and backward) in float32: each strided gradient copied once, as autograd
    copies it (two copies each before: 9 ``clone`` calls against autograd's 4), and no ``matmul``."""
    model, _, generated = _network_and_module()
    ours, theirs = copy.deepcopy(model), copy.deepcopy(model)
    bound = symgrad.bind(generated, ours, verify=False)
    x, labels = _data(torch.float32)
    steps = {"bound": lambda: bound(x=x, labels=labels), "autograd": lambda: F.cross_entropy(theirs(x), labels)}
    counted = {}
    for name, step in steps.items():
        step().backward()  # first call: lazy initialisation is not what is counted
        with _Calls() as calls:
            step().backward()
        counted[name] = calls.counts
    ours_calls, autograds = counted["bound"], counted["autograd"]
    assert autograds["clone"] >= 4, autograds  # the strided gradients autograd copies once
    # one more: the global average pool's gradient, made dense where autograd's is an expanded view
    assert ours_calls["clone"] <= autograds["clone"] + 1 and ours_calls["matmul"] == 0, (ours_calls, autograds)


def test_the_gradient_is_cast_where_autocast_casts_a_products_operand():
    """``_in_autocast_dtype``: under a CPU's autocast a float32 gradient in bfloat16 (once, for the weight's
    and the input's products, which autocast cast each before); float64, a bfloat16 tensor and every tensor
    outside autocast as they are (the same object: no copy)."""
    from symgrad.rules.linear import IN_AUTOCAST_DTYPE

    namespace = {"torch": torch}
    exec(IN_AUTOCAST_DTYPE, namespace)  # noqa: S102 - symgrad's own helper
    cast = namespace["_in_autocast_dtype"]
    values = [torch.randn(2, 3), torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 3).bfloat16()]
    assert all(cast(value) is value for value in values)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        single, double, half = (cast(value) for value in values)
        assert torch.equal(single, values[0].bfloat16()) and double is values[1] and half is values[2]
        assert torch.equal(single.T.mm(values[0]), values[0].T.mm(values[0]))  # what autocast's mm casts


class _ParameterCasts(TorchDispatchMode):
    """Counts the copies (``_to_copy``) made of the parameters' own storages."""

    def __init__(self, parameters):
        super().__init__()
        self.storages, self.count = {parameter.data_ptr() for parameter in parameters}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default:
            self.count += args[0].data_ptr() in self.storages
        return func(*args, **(kwargs or {}))


def test_under_autocast_a_convnext_step_casts_its_weights_no_more_often_than_autograd():
    """AMP's step (the forward under autocast, the backward outside it): each linear map's weight cast once,
    by the saving forward, its copy read by the input's gradient (symgrad/kept_casts.py, ``--keep all``), as
    autograd keeps autocast's copy; the backward cast each linear weight again before (43 casts against 34)."""
    model, source, generated = _network_and_module()
    assert '_in_autocast_dtype(params["stages.0.0.pwconv1.weight"])' in source
    ours, theirs = copy.deepcopy(model), copy.deepcopy(model)
    bound = symgrad.bind(generated, ours, verify=False)
    x, labels = _data(torch.float32)
    steps = {"bound": lambda: bound(x=x, labels=labels), "autograd": lambda: F.cross_entropy(theirs(x), labels)}
    networks = {"bound": ours, "autograd": theirs}
    counted = {}
    for name, step in steps.items():
        for _ in range(2):  # the first call:: lazy initialisation is not what is counted
            with _ParameterCasts(networks[name].parameters()) as casts:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = step()
                loss.backward()
        counted[name] = casts.count
    assert counted["autograd"] > 0 and counted["bound"] <= counted["autograd"], counted
