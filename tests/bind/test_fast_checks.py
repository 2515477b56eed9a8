"""The per-call helpers of a bound step (symgrad.fast_checks) read and compare what the guard's plain
loops read and compare: model tensors as getattr gives them, a change to any child or hyper-parameter."""

from types import SimpleNamespace

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from symgrad.fast_checks import BatchCounter, HookWatch, Snapshot, StateReader, read_state


class _Doubled(nn.Module):
    def forward(self, weight):
        return 2 * weight


def _net():
    return nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.ReLU())


def test_read_state_gives_what_getattr_gives_for_parameters_buffers_and_a_parametrized_weight():
    net = _net()
    parametrize.register_parametrization(net[0], "weight", _Doubled())  # weight now a property
    state = {"w": (net[0], "weight"), "mean": (net[1], "running_mean"), "gamma": (net[1], "weight")}
    net[1].running_mean = torch.ones(4)  # a buffer replaced, as .to() replaces it
    read = read_state(state, {"x": torch.zeros(1)})
    assert list(read) == ["x", "w", "mean", "gamma"]
    for name, (owner, attribute) in state.items():
        expected = getattr(owner, attribute)
        assert torch.equal(read[name], expected) and (read[name] is expected or name == "w")
    assert torch.equal(read["w"], 2 * net[0].parametrizations.weight.original)


def _state(net):
    return {"w": (net[0], "weight"), "mean": (net[1], "running_mean"), "gamma": (net[1], "weight")}


def _read_alike(reader, state, data):
    """``reader`` reads what read_state reads: the stored tensor itself, or (a parametrized weight,
    computed afresh at each read) an equal one."""
    arguments, tensors = reader.read(data)
    expected = read_state(state, data)
    assert list(arguments) == list(expected) and list(tensors) == list(state)

    def same(read, name):
        stored = name in data or any(
            expected[name] is found
            for found in (state[name][0]._parameters.get(state[name][1]), state[name][0]._buffers.get(state[name][1]))
        )
        return read is expected[name] if stored else torch.equal(read, expected[name])

    assert all(same(arguments[name], name) for name in expected) and all(same(tensors[name], name) for name in state)


def test_state_reader_reads_what_read_state_reads_after_each_change_that_moves_an_entry():
    data = {"x": torch.zeros(1)}
    changes = [
        lambda net: None,
        lambda net: setattr(net[1], "running_mean", torch.ones(4)),  # a buffer replaced, as .to() replaces it
        lambda net: setattr(net[0], "weight", nn.Parameter(torch.ones(4, 3, 3, 3))),  # a parameter replaced
        lambda net: parametrize.register_parametrization(net[0], "weight", _Doubled()),  # now a property
        lambda net: (delattr(net[1], "weight"), net[1].register_buffer("weight", torch.ones(4))),  # moved
        lambda net: setattr(net[1], "_buffers", {**net[1]._buffers, "running_mean": torch.full((4,), 3.0)}),
    ]
    for change in changes:
        net = _net()
        state = _state(net)
        reader = StateReader(state)
        _read_alike(reader, state, data)
        change(net)
        _read_alike(reader, state, data)
    net = _net()
    parametrize.register_parametrization(net[0], "weight", _Doubled())  # a property when bound: getattr's
    reader = StateReader(_state(net))
    assert reader.values() is None
    _read_alike(reader, _state(net), data)


def _snapshot(net, modes=()):
    modules = dict(net.named_modules())
    children = tuple((parent, name, child) for parent in modules.values() for name, child in parent._modules.items())
    hypers = tuple(
        (path, module, key, value)
        for path, module in modules.items()
        for key, value in vars(module).items()
        if key in ("stride", "padding", "eps", "momentum")
    )
    owned = tuple((path, module, tuple(module._modules)) for path, module in modules.items())
    return Snapshot(children, hypers, modes, None, owned)


def test_snapshot_sees_a_child_swapped_a_hyper_parameter_changed_or_deleted():
    for change in (
        lambda net: net.__setitem__(1, nn.Identity()),
        lambda net: setattr(net[0], "stride", (2, 2)),
        lambda net: setattr(net[1], "eps", 1e-3),
        lambda net: delattr(net[1], "momentum"),
    ):
        net = _net()
        snapshot = _snapshot(net)
        assert snapshot.unchanged()
        change(net)
        assert not snapshot.unchanged()
    net = _net()
    snapshot = _snapshot(net)
    net[0].stride = (1, 1)  # an equal value, another object: unchanged, as the guard's `==` says
    assert snapshot.unchanged()
    net._modules = dict(net._modules)  # the same children in another dict: unchanged; then one replaced
    assert snapshot.unchanged()
    net._modules["2"] = nn.ReLU()
    assert not snapshot.unchanged()
    net = _net()
    snapshot = _snapshot(net)
    net.append(nn.ReLU())  # a child added, every bound one in its place
    assert not snapshot.unchanged()
    net = _net()
    snapshot = _snapshot(net)
    net[0].extra = nn.ReLU()  # added to a leaf, which had no child
    assert not snapshot.unchanged()


def test_snapshot_sees_a_module_leave_its_traced_mode():
    net = _net()
    snapshot = _snapshot(net, modes=(("1", net[1], True),))
    assert snapshot.unchanged()
    net[0].eval()  # a module whose mode no one traced
    assert snapshot.unchanged()
    net[1].eval()
    assert not snapshot.unchanged()
    net.train()
    assert snapshot.unchanged()


def test_batch_counter_moves_each_batchnorm_by_its_calls_and_leaves_instance_norm_alone():
    bn, twice, instance = nn.BatchNorm2d(2), nn.BatchNorm2d(2), nn.InstanceNorm2d(2, track_running_stats=True)
    BatchCounter(
        [
            SimpleNamespace(module=bn, calls=1),
            SimpleNamespace(module=twice, calls=2),
            SimpleNamespace(module=instance, calls=1),
        ]
    )()  # as binding's statistics entries hold them
    assert (int(bn.num_batches_tracked), int(twice.num_batches_tracked), int(instance.num_batches_tracked)) == (1, 2, 0)


def test_batch_counter_reads_each_counter_again_at_every_call():
    bn = nn.BatchNorm2d(2)
    counter = BatchCounter([SimpleNamespace(module=bn, calls=3)])
    counter()
    bn.num_batches_tracked = torch.tensor(10)  # replaced, as .to() replaces buffers
    counter()
    assert int(bn.num_batches_tracked) == 13
    bn.num_batches_tracked = None  # track_running_stats off: nothing to count, nothing fails
    counter()


def test_batch_counter_sorts_a_module_whose_class_changed_again():
    bn = nn.BatchNorm2d(2)
    counter = BatchCounter([SimpleNamespace(module=bn, calls=1)])
    counter()
    bn.__class__ = nn.InstanceNorm2d  # no longer a BatchNorm: left alone, as the module moves no counter
    counter()
    assert int(bn.num_batches_tracked) == 1
    bn.__class__ = nn.BatchNorm2d
    counter()
    assert int(bn.num_batches_tracked) == 2


def test_snapshot_refers_a_hyper_parameter_without_a_single_truth_value_to_the_guard():
    net = _net()
    snapshot = _snapshot(net)
    net[1].eps = torch.tensor([1e-5, 1e-5])
    assert not snapshot.unchanged()


def test_hook_watch_looks_again_only_where_a_hook_may_have_moved_and_says_what_changed():
    net = _net()
    watch = HookWatch(net)
    assert not watch.moved()
    torch.zeros(1, requires_grad=True).register_hook(lambda grad: grad)  # moves the counter, no module hook
    assert watch.moved() and watch.changes() == {} and not watch.moved()
    handle = net[2].register_forward_hook(lambda module, inputs, output: output)
    assert watch.moved() and watch.changes()["2"] is not None
    handle.remove()
    assert watch.changes() == {} and not watch.moved()
    traced = nn.Sequential(nn.ReLU())
    handle = traced[0].register_forward_hook(lambda module, inputs, output: output)
    watch = HookWatch(traced)
    handle.remove()  # a removal moves no counter: the dictionary that held a hook is read at every call
    assert watch.moved() and watch.changes()["0"] is None
