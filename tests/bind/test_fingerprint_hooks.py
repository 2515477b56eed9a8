"""A forward hook's identity in the fingerprint (symgrad.fingerprint.hooks_hash): whatever changes what a
hook computes changes the hash, and it is the same in another process or under another import name."""

import functools
import importlib.util
import sys

import torch.nn as nn

from symgrad.fingerprint import hooks_hash


def _scaled(module, inputs, output, factor):
    return output * factor


def _closing_over(factor):
    def hook(module, inputs, output):
        return output * factor

    return hook


def _hashed(*hooks, pre=False):
    module = nn.Linear(2, 2)
    for hook in hooks:
        (module.register_forward_pre_hook if pre else module.register_forward_hook)(hook)
    return hooks_hash(module)


def test_each_change_to_what_a_hook_computes_changes_the_hash():
    assert _hashed() is None
    doubled = functools.partial(_scaled, factor=2)
    assert _hashed(doubled) == _hashed(functools.partial(_scaled, factor=2))
    assert _hashed(doubled) != _hashed(functools.partial(_scaled, factor=3))
    assert _hashed(_closing_over(2)) == _hashed(_closing_over(2))
    assert _hashed(_closing_over(2)) != _hashed(_closing_over(3))
    twice, thrice = lambda m, i, o: o * 2, lambda m, i, o: o * 3  # one source line
    assert _hashed(twice) != _hashed(thrice)
    assert _hashed(twice) != _hashed(twice, pre=True)  # a pre-hook is called with other arguments
    assert _hashed(twice, thrice) != _hashed(thrice, twice)  # hooks run in order


HOOK_FILE = """
class Scale:
    def __init__(self, factor):
        self.factor = factor

    def __call__(self, module, inputs, output):
        return output * self.factor
"""


def test_a_callable_objects_hash_follows_its_class_source_and_state_not_its_import_name(tmp_path):
    path = tmp_path / "hooks_file.py"
    path.write_text(HOOK_FILE)
    loaded = []
    for name in ("hooks_file", "_symgrad_traced_hooks_file"):  # as a script imports it, as the trace loads it
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        loaded.append(module)
    try:
        assert _hashed(loaded[0].Scale(2)) == _hashed(loaded[1].Scale(2))
        assert _hashed(loaded[0].Scale(2)) != _hashed(loaded[0].Scale(3))
    finally:
        for name in ("hooks_file", "_symgrad_traced_hooks_file"):
            sys.modules.pop(name, None)
