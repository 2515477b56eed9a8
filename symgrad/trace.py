"""From PyTorch code to a spec: ``symgrad trace module.py:function``.

The function (or an ``nn.Module``'s forward) runs once on random tensors of the given shapes under
a ``TorchFunctionMode`` that records every torch call. Calls that symgrad has rules for become
layers; the loss tail ``0.5 * (p - y).pow(2).sum(dim=...)`` (or ``.sum()``, ``.mean()``) becomes a
``half_sq_error`` loss; tensors the function reads from its module's globals or closure (the
seed's ``k`` and ``y``) become inputs under their own names. Anything else is an error naming the
op and the line of the user's code that called it.
"""

from __future__ import annotations

import inspect
import re
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
import yaml
from torch.overrides import TorchFunctionMode

from .errors import SymgradError
from .spec import check_identifier


class TraceError(SymgradError):
    """The traced code does something symgrad cannot turn into a spec."""


CONVOLUTIONS = {F.conv1d: "conv1d", F.conv2d: "conv2d", F.conv3d: "conv3d"}
CONV_ARGUMENTS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
RELUS = {F.relu, torch.relu, torch.relu_, torch.Tensor.relu, torch.Tensor.relu_}
BINARY = {
    torch.add: ("add", False), torch.Tensor.add: ("add", False), torch.Tensor.__add__: ("add", False),
    torch.Tensor.__radd__: ("add", True), torch.sub: ("sub", False), torch.Tensor.sub: ("sub", False),
    torch.Tensor.__sub__: ("sub", False), torch.Tensor.__rsub__: ("sub", True), torch.mul: ("mul", False),
    torch.Tensor.mul: ("mul", False), torch.Tensor.__mul__: ("mul", False), torch.Tensor.__rmul__: ("mul", True),
}
LOSS_PARTS = {torch.Tensor.pow: "pow", torch.pow: "pow", torch.Tensor.__pow__: "pow", torch.Tensor.sum: "sum",
              torch.sum: "sum", torch.Tensor.mean: "mean", torch.mean: "mean", torch.Tensor.__truediv__: "div",
              torch.Tensor.div: "div", torch.div: "div"}
HARMLESS = {torch.Tensor.size, torch.Tensor.dim, torch.Tensor.numel, torch.Tensor.shape.__get__, torch.Tensor.dtype.__get__, torch.Tensor.device.__get__,
            torch.Tensor.requires_grad.__get__, torch.Tensor.__format__, torch.Tensor.__repr__}


def where_in(user_files, frames) -> str:
    """``file:line`` of the innermost frame in the user's own code."""
    for frame in reversed(frames):
        if frame.filename in user_files:
            return f"{frame.filename}:{frame.lineno}"
    return "<traced code>"


@dataclass
class _Recorded:
    kind: str
    arguments: list[Any]
    keywords: dict[str, Any]
    result: torch.Tensor
    where: str


@dataclass
class _Recorder(TorchFunctionMode):
    user_files: set[str]
    calls: list[_Recorded] = field(default_factory=list)

    def __post_init__(self):
        super().__init__()

    def _where(self) -> str:
        return where_in(self.user_files, traceback.extract_stack())

    def __torch_function__(self, function, types, arguments=(), keywords=None):
        keywords = keywords or {}
        result = function(*arguments, **keywords)
        if function in HARMLESS:
            return result
        if function in CONVOLUTIONS:
            kind = CONVOLUTIONS[function]
        elif function in RELUS:
            kind = "relu"
        elif function in BINARY:
            kind = "binary"
        elif function in LOSS_PARTS:
            kind = LOSS_PARTS[function]
        else:
            name = getattr(function, "__name__", None) or repr(function)
            raise TraceError(f"{self._where()}: error: '{name}' is not an op symgrad can differentiate "
                             "(fix: use one of the ops `symgrad ops` lists)")
        self.calls.append(_Recorded(kind if kind != "binary" else BINARY[function][0] + (":r" if BINARY[function][1] else ""),
                                    list(arguments), keywords, result, self._where()))
        return result


def load_target(reference: str) -> tuple[Callable, list[str]]:
    """``path/to/module.py:function`` (or ``:Class``, an nn.Module built with no arguments)."""
    if ":" not in reference:
        raise TraceError(f"error: '{reference}' is not FILE.py:FUNCTION (fix: write e.g. model.py:loss)")
    file, attribute = reference.rsplit(":", 1)
    path = Path(file)
    if not path.is_file():
        raise TraceError(f"error: no file {file} (fix: check the path)")
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_symgrad_traced_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    target = getattr(module, attribute, None)
    if target is None:
        raise TraceError(f"error: {file} has no '{attribute}' (fix: name a function or nn.Module class in it)")
    if inspect.isclass(target) and issubclass(target, torch.nn.Module):
        target = target()
    return target, [str(path.resolve())]


def trace(target: Callable, shapes: dict[str, tuple[int, ...]], wrt: list[str] | None = None, name: str = "traced",
          user_files: list[str] | None = None) -> str:
    """The spec (YAML text) for ``target`` called with tensors of ``shapes``, named after its parameters."""
    module = target if isinstance(target, torch.nn.Module) else None
    function = module.forward if module is not None else target
    parameters = [p.name for p in inspect.signature(function).parameters.values()]
    missing = [p for p in parameters if p not in shapes]
    if missing:
        raise TraceError(f"error: no shape for argument(s) {', '.join(missing)} (fix: pass --shape {missing[0]}=8,3,32,32)")
    files = set(user_files or [])
    files.add(inspect.getsourcefile(function) or "")
    generator = torch.Generator().manual_seed(0)
    arguments = {p: torch.randn(shapes[p], generator=generator) for p in parameters}
    names: dict[int, str] = {id(tensor): p for p, tensor in arguments.items()}
    declared: dict[str, tuple[int, ...]] = {p: tuple(shapes[p]) for p in parameters}
    if module is not None:
        for parameter_name, value in module.named_parameters():
            spec_name = re.sub(r"\W", "_", parameter_name)
            names[id(value)] = spec_name
            declared[spec_name] = tuple(value.shape)
    constants = _named_constants(function)

    recorder = _Recorder(files)
    try:
        with torch.no_grad(), recorder:
            output = function(**arguments)
    except TraceError:
        raise
    except Exception as error:  # the user's code failed at these shapes: say where, in one line
        frames = traceback.extract_tb(error.__traceback__)
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise TraceError(f"{where_in(files, frames)}: error: running it at the given shapes failed: {first_line} "
                         "(fix: check the --shape values)") from None
    layers, loss = _layers_and_loss(recorder.calls, output, names, declared, constants)
    spec = {"name": name, "inputs": {key: {"shape": list(value)} for key, value in declared.items()},
            "layers": layers, "loss": loss, "wrt": wrt or [p for p in parameters if p != loss["target"]]}
    if module is not None and not wrt:
        spec["wrt"] = [p for p in declared if p not in (loss["target"],)]
    header = f"# Traced by symgrad from {getattr(function, '__qualname__', 'a function')}; edit freely.\n"
    return header + yaml.safe_dump(spec, sort_keys=False, default_flow_style=None, width=100)


def _named_constants(function) -> dict[int, str]:
    """Tensors the function can see by name (module globals, closure cells), by identity."""
    found = {}
    closure = inspect.getclosurevars(function)
    for scope in (closure.globals, closure.nonlocals):
        for key, value in scope.items():
            if isinstance(value, torch.Tensor) and check_identifier(key) is None:
                found[id(value)] = key
    return found


def _layers_and_loss(calls, output, names, declared, constants):
    def name_of(tensor: torch.Tensor, where: str) -> str:
        if id(tensor) in names:
            return names[id(tensor)]
        if id(tensor) in constants:
            name = constants[id(tensor)]
            names[id(tensor)] = name
            declared[name] = tuple(tensor.shape)
            return name
        raise TraceError(f"{where}: error: a tensor here comes from neither an argument, a named global, "
                         "nor a traced op (fix: pass it as an argument or make it a module-level variable)")

    layers: list[dict] = []
    loss_parts: dict[int, tuple[str, _Recorded]] = {}
    counter = 0
    for call in calls:
        if call.kind in ("pow", "sum", "mean", "div") or (call.kind.startswith(("sub", "mul")) and _feeds_loss(call, loss_parts)):
            loss_parts[id(call.result)] = (call.kind, call)
            continue
        counter += 1
        out = f"{call.kind.split(':')[0]}{counter}"
        if call.kind in CONVOLUTIONS.values():
            bound = dict(zip(CONV_ARGUMENTS, call.arguments))
            bound.update(call.keywords)
            layer = {"op": call.kind, "in": name_of(bound["input"], call.where), "weight": name_of(bound["weight"], call.where)}
            if bound.get("bias") is not None:
                layer["bias"] = name_of(bound["bias"], call.where)
            for key in ("stride", "padding", "dilation", "groups"):
                if key in bound:
                    value = bound[key]
                    if isinstance(value, str):
                        raise TraceError(f"{call.where}: error: padding={value!r} is not supported yet (fix: give ints)")
                    layer[key] = list(value) if isinstance(value, (tuple, list)) else value
        elif call.kind == "relu":
            layer = {"op": "relu", "in": name_of(call.arguments[0], call.where)}
        else:
            op, reflected = call.kind.split(":")[0], call.kind.endswith(":r")
            left, right = call.arguments[0], call.arguments[1] if len(call.arguments) > 1 else call.keywords["other"]
            if reflected:
                left, right = right, left
            if isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor):
                layer = {"op": op, "in": [name_of(left, call.where), name_of(right, call.where)]}
            elif isinstance(left, torch.Tensor):
                layer = {"op": op, "in": name_of(left, call.where), "other": right}
            else:
                raise TraceError(f"{call.where}: error: a number on the left of '{op}' is not supported "
                                 "(fix: write the tensor first)")
        layer["out"] = out
        names[id(call.result)] = out  # an in-place op (relu_) gives its input's object a new name
        layers.append(layer)
    loss = _loss(output, loss_parts, name_of, layers, names)
    return layers, loss


def _feeds_loss(call, loss_parts) -> bool:
    """A sub or mul belongs to the loss tail when it combines a loss part (0.5 * sum(...))."""
    return any(isinstance(a, torch.Tensor) and id(a) in loss_parts for a in call.arguments)


def _loss(output, parts, name_of, layers, names) -> dict:
    """Recognise ``c * reduce((p - y) ** 2)`` with ``c`` one half; anything else is refused.

    The difference ``p - y`` was recorded as an ordinary ``sub`` layer (nothing marked it as part
    of the loss yet): it is taken back out of the layers here."""
    fail = TraceError("error: the traced function must end in 0.5 * (prediction - target).pow(2) reduced by "
                      ".sum(dim=[1, ...]), .sum() or .mean() (fix: rewrite the loss in that form)")
    scale, node = 1.0, parts.get(id(output))
    while node and node[0].split(":")[0] in ("mul", "div"):
        kind, call = node
        tensor_arg = next((a for a in call.arguments if isinstance(a, torch.Tensor) and id(a) in parts), None)
        number = next((a for a in call.arguments if isinstance(a, (int, float)) and not isinstance(a, bool)), None)
        if tensor_arg is None or number is None:
            raise fail
        scale = scale * number if kind.startswith("mul") else scale / number
        node = parts.get(id(tensor_arg))
    if not node or node[0] not in ("sum", "mean"):
        raise fail
    reduce_kind, reduce_call = node
    powered = parts.get(id(reduce_call.arguments[0]))
    if not powered or powered[0] != "pow" or powered[1].arguments[1] != 2:
        raise fail
    difference = powered[1].arguments[0]
    layer = next((layer for layer in layers if layer["out"] == names.get(id(difference))), None)
    if layer is None or layer["op"] != "sub" or not isinstance(layer.get("in"), list):
        raise fail
    layers.remove(layer)
    prediction, target = layer["in"]
    dims = reduce_call.keywords.get("dim", reduce_call.arguments[1] if len(reduce_call.arguments) > 1 else None)
    rank = difference.dim()
    if abs(scale - 0.5) > 1e-12:
        raise fail
    if dims is None:
        reduction = "mean" if reduce_kind == "mean" else "sum"
    elif reduce_kind == "sum" and sorted(d % rank for d in ([dims] if isinstance(dims, int) else dims)) == list(range(1, rank)):
        reduction = "per_sample"
    else:
        raise fail
    return {"op": "half_sq_error", "in": prediction, "target": target, "reduction": reduction}
