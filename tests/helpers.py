"""Shared test helpers: build a spec from Python values, and import its generated module from memory."""

from __future__ import annotations

import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

from symgrad.check import by_name, module_from_source
from symgrad.pipeline import Built, build_text as _build_text


def spec_text(inputs: dict, layers: list, loss: dict, wrt: list, name: str = "rule_case") -> str:
    document = {"name": name, "inputs": {key: (dict(shape) if isinstance(shape, dict) else {"shape": list(shape)})
                                         for key, shape in inputs.items()},
                "layers": layers, "loss": loss, "wrt": wrt}
    return yaml.safe_dump(document, sort_keys=False)


def build_text(text: str, label: str = "case.yaml", extras: tuple[str, ...] = ()) -> Built:
    return _build_text(text, label, extras)


def generated_module(built: Built):
    """The generated module, called with every input by its spec name (``check.by_name``: the
    inputs with a ``source:`` go in its ``params`` mapping)."""
    module = module_from_source(built.rendered.files[f"{built.rendered.name}.py"], built.rendered.name)
    return by_name(module, built.graph)


class CudaNormKernels(TorchDispatchMode):
    """CUDA's layer_norm and group_norm kernels on the CPU: they read the weight and bias (and
    group_norm's mean and 1 / std) in the input's dtype and refuse any other, where the CPU's also
    take a float32 weight with a bfloat16 input. Within this mode such a call raises as on a GPU
    (``expected scalar type BFloat16 but found Float``), so a CPU test sees what a GPU would refuse."""

    CHECKED = {"native_layer_norm.default": (0, (2, 3)), "native_layer_norm_backward.default": (1, (5, 6)),
               "native_group_norm.default": (0, (1, 2)), "native_group_norm_backward.default": (1, (2, 3, 4))}
    """op: (the input's position, the positions that must share its dtype)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        checked = self.CHECKED.get(str(func).removeprefix("aten."))
        if checked is not None:
            dtype = args[checked[0]].dtype
            for index in checked[1]:
                value = args[index] if index < len(args) else None
                if isinstance(value, torch.Tensor) and value.dtype != dtype:
                    raise RuntimeError(f"{func}: expected scalar type {dtype} but found {value.dtype} "
                                       f"(argument {index}; CUDA's kernel reads it in the input's dtype)")
        return func(*args, **(kwargs or {}))
