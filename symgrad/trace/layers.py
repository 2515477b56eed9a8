"""Recorded torch calls to spec layers: one table, by the name torch gives each call.

Every op in the rule registry is reached by its ``torch.nn.functional`` / ``torch`` function, its
tensor method and its in-place variant (``relu_``, ``add_``: the out-of-place op, the tensor object
taking the new node's name), and so by the ``nn.Module`` layers that call them. Arguments are bound
by PyTorch's own positional order and kept only where they differ from the op's default.

A call that cannot become a layer does not stop the walk: its result is *poisoned* with the reason,
and anything computed from it inherits the poison. Only reasons the loss depends on are reported,
all at once, so a forward that logs ``x.norm()`` is not refused for it.

The longest module: besides the table (computed from the registry), it holds one handler per family of
calls that needs more than the table (views, slices, pieces, constants, sizes read at run time, loss
tails), all methods of the one walk whose naming, poison and size-read state they share. Splitting
them by family is the next step when the file grows again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx.operator_schemas import get_signature_for_torch_op

from ..rules import LAYER_RULES, LOSS_RULES
from ..spec import MAX_NAME, check_identifier
from . import attention, sizes
from .constants import constant_layer
from .indexing import index_select, index_view, index_with_tensor
from .recorder import RANDOM, Call

def torch_signature(op: str) -> tuple[str, ...]:
    """PyTorch's positional argument names of the op ``torch.nn.functional.<op>`` or ``torch.<op>``:
    the Python function's own signature, else the longest positional form among the op's schemas on
    tensors (``torch.squeeze(input, dim)``; not ``math``'s ``log(a, b)``), as ``torch.fx`` reads them."""
    function = getattr(torch.nn.functional, op, None)
    if function is not None:
        try:
            parameters = inspect.signature(function).parameters.values()
        except (TypeError, ValueError):  # a builtin (F.conv2d is torch.conv2d)
            pass
        else:
            return tuple(parameter.name for parameter in parameters
                         if parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
    forms = [form for candidate in (getattr(torch, op, None), function) if candidate is not None
             for form in get_signature_for_torch_op(candidate) or []
             if any("Tensor" in str(parameter.annotation) for parameter in form.parameters.values())]
    positional = [tuple(parameter.name for parameter in form.parameters.values()
                        if parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD) for form in forms]
    if not positional:
        raise LookupError(f"PyTorch has no signature for {op}: give the rule a `signature`")
    return max(positional, key=len)


def _signatures(rules) -> dict[str, tuple[str, tuple[str, ...]]]:
    table = {}
    for rule in rules:
        positional = (rule.signature or torch_signature(rule.op)) if rule.calls else ()
        for name in rule.calls:
            if name in table:
                raise ValueError(f"rules {table[name][0]} and {rule.op} both claim the torch call {name}")
            table[name] = (rule.op, positional)
    return table


SIGNATURES = _signatures(LAYER_RULES.values())
"""Recorded name -> (spec op, PyTorch's positional argument names), from each rule's ``calls``."""

LOSSES = {name: positional for name, (_, positional) in _signatures(LOSS_RULES.values()).items()}
"""Recorded loss call -> PyTorch's positional argument names."""

BY_FUNCTION = {torch.batch_norm: ("batch_norm", ("input", "weight", "bias", "running_mean", "running_var", "training",
                                                 "momentum", "eps", "cudnn_enabled"))}
"""``torch.*`` functions whose arguments come in another order than their ``torch.nn.functional`` namesakes'."""

NEUTRAL = {"alpha": 1, "scale": 1, "input_scale": 1}
"""Arguments an op does not take, harmless at these values (``torch.add``'s alpha, ``elu``'s scales)."""

IGNORED = {"inplace", "cudnn_enabled", "_stacklevel"}
"""Arguments that do not change the value (an in-place op is traced as its out-of-place op)."""

TRANSPOSES = {"transpose": ("dim0", "dim1"), "swapaxes": ("axis0", "axis1"), "swapdims": ("dim0", "dim1")}
"""Calls that swap two dims, with PyTorch's names for them: a ``permute`` (so are ``x.mT``, ``x.t()``, ``x.T``).
The in-place ones (``transpose_``) change a tensor's shape after the fact, which the walk, reading shapes
once the code has run, cannot see: they stay refused, as ``squeeze_`` and ``unsqueeze_`` do."""

PIECES = {"chunk", "split", "tensor_split", "unbind"}
"""Calls that cut a tensor into a tuple of pieces: one ``narrow`` per piece (``unbind`` adds a ``squeeze``)."""

PASS_THROUGH = {"contiguous", "clone", "to", "float", "double", "type_as", "requires_grad_"}
"""Calls whose result is their input's value (when the dtype and device do not change)."""

DROPOUT = {"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"}

IN_PLACE_BOOKKEEPING = {"add_", "sub_", "mul_", "fill_", "zero_", "copy_", "__iadd__", "lerp_", "addcmul_"}
"""In-place calls on a buffer (BatchNorm's ``num_batches_tracked += 1``): statistics bookkeeping."""

CONSTANT = ("reads a tensor made inside the traced code from numbers alone (torch.full, torch.ones_like, "
            "torch.tensor), which a spec holds only as a number broadcast against a tensor, as a map filled "
            "with one value whose sizes are read from a traced tensor, or as a constant layer of at most 4096 "
            "floating-point values, read with a traced tensor and never written into",
            "write the number (x * 0.5, not x * torch.full_like(x, 0.5) broadcast wider than x), or make it a "
            "buffer (self.register_buffer('name', tensor) in __init__) so that it becomes an input")
"""The problem and fix when a constant made inside forward is read where no number can stand for it."""

FIXES = {
    "detach": "remove .detach(): symgrad differentiates every path to the loss",
    "multi_head_attention_forward": "write the attention as timm's Attention does, with the same weights: "
                                    "qkv = nn.Linear(dim, 3 * dim) (in_proj_weight, in_proj_bias), q, k, v from "
                                    "qkv(x).reshape(B, N, 3, heads, dim // heads).permute(2, 0, 3, 1, 4).unbind(0), "
                                    "F.scaled_dot_product_attention(q, k, v), then out_proj as an nn.Linear",
    "__getitem__": "index with start:stop ranges, ints, None and ... (x[:, :, 2:10], x[:, 0], x[:, None]), or "
                   "with one int64 buffer or argument (x[:, self.index]); write other indexing as narrow, cat and reshape",
}


@dataclass
class Problem:
    where: str
    module: str
    op: str
    what: str
    fix: str

    def __str__(self) -> str:
        inside = f" (in {self.module})" if self.module else ""
        return f"{self.where}: error: '{self.op}'{inside} {self.what} (fix: {self.fix})"


def report(problems: list[Problem]) -> list[str]:
    """One line per source line, in the order first met, naming the module instances that share it
    (``(in 6 modules: layer1.0, layer1.1, layer1.2, ...)``); where one line holds several refused calls
    (``x.new_empty(...).bernoulli_(p)``), the others follow on the same line. Every source line is kept."""
    groups: dict[str, dict[str, list[Problem]]] = {}
    for problem in problems:
        groups.setdefault(problem.where, {}).setdefault(problem.op, []).append(problem)
    lines = []
    for by_op in groups.values():
        texts = []
        for group in by_op.values():
            modules = list(dict.fromkeys(problem.module for problem in group if problem.module))
            first = group[0]
            if len(modules) > 1:
                shown = ", ".join(modules[:3]) + (", ..." if len(modules) > 3 else "")
                first = Problem(first.where, f"{len(modules)} modules: {shown}", first.op, first.what, first.fix)
            texts.append(str(first))
        lines.append(texts[0] + "".join("; on the same line, " + text.split(": error: ", 1)[1] for text in texts[1:]))
    return lines


@dataclass
class Reduction:
    """A loss value: ``scale * reduce(...)`` of an elementwise node, or of a PyTorch loss call."""

    how: str
    """``sum``, ``mean``, ``per_sample``, or ``none`` (a loss call's elementwise values)."""
    source: str | None = None
    loss: dict | None = None
    scale: float = 1.0
    call: Call | None = None


@dataclass
class Source:
    """A tensor the traced code reads that no traced op made: an argument, parameter, buffer or global."""

    name: str
    trainable: bool
    state_key: str | None = None
    """Its key in the traced model's ``state_dict()``, for a parameter or buffer of that model."""


LOSS_DEFAULTS = {"size_average": None, "reduce": None, "weight": None, "ignore_index": -100, "label_smoothing": 0.0}


PER_DIMENSION = {"stride", "padding", "dilation", "output_padding", "kernel_size"}
"""Arguments with one int per spatial dim: one repeated value is written once (``padding: 1``)."""


def literal(value: Any, key: str = "") -> Any:
    """A YAML-safe copy of an argument: tuples become lists."""
    if isinstance(value, torch.Size):
        value = tuple(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and type(value) not in (int, float):
        return (int if isinstance(value, int) else float)(value)  # a size that carries its dims (sizes.TracedSize)
    if isinstance(value, (tuple, list)):
        items = [literal(item) for item in value]
        if key in PER_DIMENSION and items and len(set(items)) == 1 and all(type(item) is int for item in items):
            return items[0]
        return items
    return value


def _sizes(call: Call, *keywords: str) -> tuple:
    """The ints after the tensor of ``x.view(2, -1)``, ``x.view((2, -1))`` or ``x.permute(dims=(0, 2, 1))``."""
    for keyword in keywords:
        if keyword in call.keywords:
            return tuple(call.keywords[keyword])
    sizes = call.arguments[1:]
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list, torch.Size)):
        return tuple(sizes[0])
    return tuple(sizes)


def plain_name(text: str) -> str:
    return re.sub(r"\W", "_", text).strip("_")


def fitted(name: str, room: int = MAX_NAME) -> str:
    """``name`` within ``room`` characters (a spec's names have at most 64): a longer one keeps its start
    and its end, with a digest of the whole between them, so that two long names stay two (RepViT's
    79-character parameter paths, FastViT's 63-character attribute called twice)."""
    if len(name) <= room:
        return name
    digest = hashlib.sha1(name.encode("utf-8")).hexdigest()[:6]
    tail = min(20, (room - len(digest) - 2) // 2)
    head = room - len(digest) - 2 - tail
    return f"{name[:head]}_{digest}_{name[len(name) - tail:]}"


def numbered(base: str, number: int) -> str:
    """``base_<number>`` (the number-th node of that name), ``base`` shortened where that would not fit."""
    suffix = f"_{number}"
    return fitted(base, MAX_NAME - len(suffix)) + suffix


@dataclass
class SpecBuilder:
    """Walks the recorded calls in order, naming every tensor and turning calls into layers."""

    sources: dict[int, Source]
    mutable: set[int] = field(default_factory=set)
    """ids of buffers: in-place updates of these are statistics bookkeeping."""
    modules: dict[str, Any] = field(default_factory=dict)
    """The traced model's modules by path (``layer2.0.bn1``)."""
    names: dict[int, str] = field(default_factory=dict)
    layers: list[dict] = field(default_factory=list)
    layer_calls: list[Call] = field(default_factory=list)
    used_sources: dict[str, torch.Tensor] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    poison: dict[int, frozenset[int]] = field(default_factory=dict)
    reductions: dict[int, Reduction] = field(default_factory=dict)
    kept: list[Any] = field(default_factory=list)
    taken: Counter = field(default_factory=Counter)
    log_probabilities: dict[int, torch.Tensor] = field(default_factory=dict)
    """id of ``log_softmax(z, dim=1)``'s result -> z."""
    sizes_read: list[torch.Tensor] = field(default_factory=list)
    """The tensors whose sizes the user's code has read so far, in order (``x.shape[-2:]``)."""
    constants: dict[int, tuple[Call, int]] = field(default_factory=dict)
    """id of a constant tensor the code made (``torch.full_like(x, 2.0)``) -> the call that made it, and
    when (the count of calls walked)."""
    writes: dict[int, int] = field(default_factory=dict)
    """Storage of a tensor written in place with a value that is not a constant -> when, last."""
    index_views: dict[int, torch.Tensor] = field(default_factory=dict)
    """id of a reshape of an int64 input (``index.view(-1)``) -> that input (``indexing.py``)."""
    walked: int = 0
    size_tensors: list[torch.Tensor] = field(default_factory=list)
    """The tensors whose sizes the code read, by the index the sizes carry (``sizes.Dim``)."""
    masks: dict[int, dict] = field(default_factory=dict)
    """id of a random mask being drawn (``x.new_empty(shape)``, then ``.bernoulli_(keep)``, ``.div_(keep)``:
    timm's DropPath, torchvision's StochasticDepth) -> {"keep": keep or None before bernoulli_, "scale": bool}."""

    def __post_init__(self):
        self.source_names = {source.name for source in self.sources.values()}

    # ----- naming -----------------------------------------------------------------------------
    def out_name(self, op: str, call: Call) -> str:
        base = plain_name(call.module) if call.module else ""
        if base and not call.leaf:
            base = f"{base}_{op}"
        base = fitted(base or op)
        if base[0].isdigit() or check_identifier(base) is not None:
            base = fitted(f"{op}_{base}")
        self.taken[base] += 1
        name = base if self.taken[base] == 1 else numbered(base, self.taken[base])
        while name in self.source_names or check_identifier(name) is not None:
            self.taken[base] += 1
            name = numbered(base, self.taken[base])
        return name

    def fail(self, call: Call, what: str, fix: str, op: str | None = None) -> None:
        """Poison the call's result with a new problem, and with those its inputs already carry."""
        self.problems.append(Problem(call.where, call.module, op or call.name, what, fix))
        inherited = [self.poison[id(value)] for value in _flat(call.arguments, call.keywords)
                     if isinstance(value, torch.Tensor) and id(value) in self.poison]
        self.taint(call.result, frozenset({len(self.problems) - 1}).union(*inherited))

    def taint(self, result: Any, reasons: frozenset[int]) -> None:
        for tensor in (result if isinstance(result, (tuple, list)) else [result]):
            if isinstance(tensor, torch.Tensor):
                self.kept.append(tensor)
                self.poison[id(tensor)] = reasons
                self.names.pop(id(tensor), None)

    def node(self, tensor: torch.Tensor) -> str | frozenset[int]:
        """The node name of ``tensor``, or the problems it carries."""
        key = id(tensor)
        if key in self.poison:
            return self.poison[key]
        if key in self.names:
            return self.names[key]
        if key in self.reductions:
            return frozenset({-2})
        source = self.sources.get(key)
        if source is not None:
            self.names[key] = source.name
            self.used_sources[source.name] = tensor
            return source.name
        return frozenset({-1})  # an unknown tensor: reported with the call that reads it

    # ----- the walk ---------------------------------------------------------------------------
    def add(self, call: Call) -> None:
        self.sizes_read += call.sizes_read
        self.walked += 1
        target = call.arguments[0] if call.arguments and isinstance(call.arguments[0], torch.Tensor) else None
        writes = target is not None and not call.constant and (
            call.name.endswith("_") or call.name == "__setitem__" or call.name.startswith("__i"))
        problems = len(self.problems)
        try:
            self.dispatch(call)
        finally:
            if writes:  # every view of its storage, a constant's too (c[:, :1].copy_(h)), changed here
                self.writes[_storage(target)] = self.walked
            if writes and id(target) in self.constants:  # out[:, :2] = h: no longer its constant (a layer
                del self.constants[id(target)]  # made of it, c.add_(h), renamed it) ...
                if len(self.problems) > problems:  # ... and what reads it carries the write's problem
                    self.taint(target, frozenset(range(problems, len(self.problems))))

    def dispatch(self, call: Call) -> None:
        name = call.name
        if self.random_mask(call):
            return
        if name in IN_PLACE_BOOKKEEPING and call.arguments and id(call.arguments[0]) in self.mutable:
            return  # num_batches_tracked += 1, a running-statistics update
        if call.constant:  # torch.full(...), torch.ones_like(x), torch.tensor(0.5): a value, not a node
            self.kept.append(call.result)
            self.constants[id(call.result)] = (call, self.walked)
            self.names.pop(id(call.result), None)
            self.poison.pop(id(call.result), None)
            return
        if self.scale_reduction(call):
            return
        if index_view(self, call):
            return
        if name in SIGNATURES:
            op, positional = BY_FUNCTION.get(call.function, SIGNATURES[name])
            bound = self.bind(call, positional)
            if bound is None:
                return
            if op in ("add", "sub", "mul", "div") and self.fold_constants(op, bound, call):
                return
            if op in ("add", "mul") and not isinstance(bound["input"], torch.Tensor):
                bound["input"], bound["other"] = bound.get("other"), bound["input"]  # torch.mul(0.5, x): commutes
            handler = getattr(self, f"_{op}", None)
            (handler or self.layer)(op, bound, call)
        elif name in LOSSES:
            self.loss_call(name, call)
        elif name in ("sum", "mean"):
            self.reduce(call)
        elif name in PASS_THROUGH:
            self.pass_through(call)
        elif name in DROPOUT:
            self.dropout(call)
        elif name in ("view", "reshape"):
            self.reshape(call)
        elif name in ("view_as", "reshape_as"):
            self.reshape_as(call)
        elif name in ("expand", "expand_as", "broadcast_to"):
            self.expand(call)
        elif name in ("repeat", "tile"):
            self.repeat(call)
        elif name in ("var_mean", "std_mean"):
            self.statistic_and_mean(call)
        elif name == "permute":
            self.layer("permute", {"input": call.arguments[0], "dims": list(_sizes(call, "dims"))}, call)
        elif name in TRANSPOSES or name in ("mT", "T", "t"):
            self.transpose(call)
        elif name in PIECES:
            self.pieces(call)
        elif name in ("clamp_min", "clamp_min_", "clamp_max", "clamp_max_"):
            self.clamp(call)
        elif name == "norm":
            self.norm(call)
        elif name == "square":
            self.layer("pow", {"input": call.arguments[0], "exponent": 2}, call)
        elif name == "__rsub__":
            self.reflected_sub(call)
        elif name == "__getitem__":
            if not index_with_tensor(self, call):
                self.slice(call)
        elif name == "index_select":
            if not index_select(self, call):
                self.unknown(call)
        elif name == "einsum":
            attention.einsum(self, call)
        else:
            self.unknown(call)

    def fold_constants(self, op: str, bound: dict, call: Call) -> bool:
        """A constant operand of one value, ``torch.full_like(x, 2.0) * x`` or ``x + torch.tensor(0.5)``, is
        that number when it only broadcasts against the other operand (the result has the other's shape and
        dtype). ``c - x`` becomes ``(-x) + c`` and ``c / x`` becomes ``x ** -1 * c``: True when those layers
        are made here; otherwise the numbers are put in ``bound``."""
        for key, other_key in (("input", "other"), ("other", "input")):
            value, other = bound.get(key), bound.get(other_key)
            if not (isinstance(value, torch.Tensor) and id(value) in self.constants and isinstance(other, torch.Tensor)):
                continue
            fill = self.fill(value)
            if (fill is not None and call.result.dtype == other.dtype
                    and torch.broadcast_shapes(value.shape, other.shape) == other.shape):
                bound[key] = fill if value.is_floating_point() or not float(fill).is_integer() else int(fill)
        number, tensor = bound.get("input"), bound.get("other")
        if op not in ("sub", "div") or isinstance(number, torch.Tensor) or not isinstance(tensor, torch.Tensor):
            return False
        if bound.get("alpha", 1) != 1 or bound.get("rounding_mode") is not None:
            return False  # the layer refuses these arguments
        if op == "sub":
            made = Call("neg", torch.neg, (tensor,), {}, torch.neg(tensor), call.where, call.module, call.leaf)
        else:
            made = Call("pow", torch.pow, (tensor, -1), {}, torch.pow(tensor, -1), call.where, call.module, call.leaf)
        self.add(made)
        self.layer("add" if op == "sub" else "mul", {"input": made.result, "other": number}, call)
        return True

    def fill(self, value: torch.Tensor) -> float | None:
        """The one value of a constant, when its every entry held it as made and nothing wrote a value that
        is not a constant into its storage since (``c[:, :1].copy_(h)`` through a view)."""
        made, when = self.constants[id(value)]
        if made.fill is None or self.writes.get(_storage(value), 0) > when:
            return None
        return made.fill

    def constant_map(self, value: torch.Tensor) -> str | None:
        """A ``full`` layer for a constant of one value read as a tensor (FFDNet's noise-level map, concatenated
        to the input), each size ``{like: NODE}`` where the code read a tensor of that size at that dim, the
        others numbers (the second run refuses them if they follow the input); None when it holds several
        values, is no float or reads no size."""
        made = self.constants[id(value)][0]
        if self.fill(value) is None or value.dim() == 0 or not value.is_floating_point():
            return None
        size: list[Any] = []
        for dim, length in enumerate(value.shape):
            source = next((name for other in reversed(self.sizes_read) if other.dim() == value.dim()
                           and other.shape[dim] == length and isinstance(name := self.node(other), str)), None)
            size.append({"like": source} if source is not None else int(length))
        if all(isinstance(item, int) for item in size):
            return None
        return self.emit("full", {"op": "full", "size": size, "fill_value": float(made.fill)}, made)

    def bind(self, call: Call, positional: tuple[str, ...]) -> dict | None:
        if len(call.arguments) > len(positional):
            self.fail(call, f"was called with {len(call.arguments)} positional arguments", "pass arguments by keyword")
            return None
        bound = dict(zip(positional, call.arguments))
        bound.update(call.keywords)
        if "tensors" in bound:
            bound["tensors"] = list(bound["tensors"])
        return bound

    def operand(self, value: Any, call: Call, reasons: set[int]) -> Any:
        if isinstance(value, torch.Tensor) and id(value) in self.index_views:  # labels.view(-1)
            self.problems.append(Problem(call.where, call.module, call.name,
                                         "reads a reshape of an int64 input, which only indexing (x[:, idx]) reads",
                                         "pass the int64 input as it is (cross_entropy takes labels [N, ...])"))
            reasons.add(len(self.problems) - 1)
            return None
        if isinstance(value, torch.Tensor) and id(value) in self.constants and id(value) not in self.names:
            name = self.constant_map(value)
            if name is None:
                name = constant_layer(self, value, call)
            if name is not None:
                return name
            self.problems.append(Problem(call.where, call.module, call.name, CONSTANT[0], CONSTANT[1]))
            reasons.add(len(self.problems) - 1)
            return None
        if isinstance(value, torch.Tensor):
            found = self.node(value)
            if isinstance(found, frozenset):
                if -1 in found:
                    self.problems.append(Problem(call.where, call.module, call.name,
                                                 "reads a tensor that is neither an argument, a parameter or buffer of "
                                                 "the model, a module-level tensor, nor the result of a traced call",
                                                 "pass it to the traced function as an argument"))
                    found = frozenset({len(self.problems) - 1})
                elif -2 in found:
                    self.problems.append(Problem(call.where, call.module, call.name,
                                                 "computes with a loss value; a spec has one loss, reduced once",
                                                 "return one loss (F.mse_loss(...), 0.5 * (p - y).pow(2).sum(), ...)"))
                    found = frozenset({len(self.problems) - 1})
                reasons.update(found)
                return None
            if value.dim() == 0 and found in self.source_names:  # timm's skipinit gain, nn.Parameter(torch.tensor(0.))
                self.problems.append(Problem(call.where, call.module, call.name,
                                             f"reads '{found}', a 0-dim parameter or buffer, which a spec cannot hold "
                                             "(its tensors have 1 to 8 dims)",
                                             "make it a one-element tensor, e.g. nn.Parameter(torch.zeros(1)): it "
                                             "broadcasts the same way"))
                reasons.add(len(self.problems) - 1)
                return None
            return found
        return value

    def layer(self, op: str, bound: dict, call: Call) -> None:
        """The general case: tensor operands by the rule's names, other arguments if not defaults."""
        rule = LAYER_RULES[op]
        layer: dict[str, Any] = {"op": op}
        reasons: set[int] = set()
        sources: list[Any] = []
        for operand in rule.operands:
            value = bound.pop(operand.name, None)
            if value is None:
                continue
            values = value if operand.variadic else [value]
            named = [self.operand(item, call, reasons) for item in values]
            if operand.from_in and not (operand.constant_ok and _is_number(value)):
                sources += named
            else:
                layer[operand.name] = named[0]
            for original, item in zip(values, named):
                if not isinstance(original, torch.Tensor) and not (operand.constant_ok and _is_number(original)):
                    self.fail(call, f"argument '{operand.name}' is {original!r}, not a tensor", "pass a tensor", op)
                    return
        if reasons:
            self.taint(call.result, frozenset(reasons))
            return
        if sources:
            layer = {"op": op, "in": sources[0] if len(sources) == 1 else sources,
                     **{key: value for key, value in layer.items() if key != "op"}}
        for key, value in bound.items():
            if key in IGNORED:
                continue
            if key not in rule.params:
                if value is not None and NEUTRAL.get(key, object()) != value:
                    self.fail(call, f"argument {key}={value!r} is not supported", "leave it at its default", op)
                    return
                continue
            value = literal(value, key)
            if isinstance(value, torch.Tensor):
                self.fail(call, f"argument '{key}' is a tensor", f"give {key} as a number", op)
                return
            if value is not None and value != literal(rule.params[key].default, key):
                layer[key] = value
        self.emit(op, layer, call)

    def emit(self, op: str, layer: dict, call: Call) -> str:
        name = self.out_name(op, call)
        layer["out"] = name
        self.layers.append(layer)
        self.layer_calls.append(call)
        self.kept.append(call.result)
        self.poison.pop(id(call.result), None)
        self.constants.pop(id(call.result), None)  # c += h: c holds a node's value now
        self.names[id(call.result)] = name  # an in-place op gives its tensor object the new node's name
        return name

    # ----- ops that need more than the table --------------------------------------------------
    def _batch_norm(self, op: str, bound: dict, call: Call) -> None:
        training = bool(bound.get("training"))
        # nn.BatchNorm's momentum=None passes 1 / num_batches_tracked, a count that grows: the spec says null
        cumulative = training and getattr(self.modules.get(call.module), "momentum", 0.1) is None
        if not training or cumulative or bound.get("running_mean") is None:
            bound.pop("momentum", None)
        if not training and bound.get("running_mean") is None:
            self.fail(call, "has no running statistics in eval mode", "track running statistics or trace in train mode")
            return
        count = len(self.layers)
        self.layer(op, bound, call)  # in training the kernel moves the running statistics, as the module does
        if cumulative and len(self.layers) > count:
            self.layers[-1]["momentum"] = None

    def _prelu(self, op: str, bound: dict, call: Call) -> None:
        """nn.PReLU()'s one slope for every channel is ``shared: true`` (a [C] weight: one per channel)."""
        weight, source = bound.get("weight"), bound.get("input")
        if isinstance(weight, torch.Tensor) and isinstance(source, torch.Tensor) and weight.numel() == 1 and (
                source.dim() < 2 or source.shape[1] != 1):
            bound["shared"] = True
        self.layer(op, bound, call)

    def _scaled_dot_product_attention(self, op: str, bound: dict, call: Call) -> None:
        attention.attention(self, op, bound, call)

    def _div(self, op: str, bound: dict, call: Call) -> None:
        if bound.pop("rounding_mode", None) is not None:
            self.fail(call, "rounds (rounding_mode is set), which has no gradient", "divide without rounding_mode")
            return
        self.layer(op, bound, call)

    def _pow(self, op: str, bound: dict, call: Call) -> None:
        if not _is_number(bound.get("exponent")):
            self.fail(call, "has a tensor exponent", "raise to a number")
            return
        if bound["exponent"] == 1:
            return self.alias(call, bound["input"])
        self.layer(op, bound, call)

    def reflected_sub(self, call: Call) -> None:
        """``c - x`` is ``(-x) + c``: two layers."""
        tensor, number = call.arguments[0], call.arguments[1]
        if not _is_number(number):
            return self.unknown(call)
        negated = Call("neg", torch.neg, (tensor,), {}, torch.neg(tensor), call.where, call.module, call.leaf)
        self.add(negated)
        self.layer("add", {"input": negated.result, "other": number}, call)

    def _hardtanh(self, op: str, bound: dict, call: Call) -> None:
        if bound.get("min_val", -1.0) == 0 and bound.get("max_val", 1.0) == 6:  # nn.ReLU6
            bound.pop("min_val"), bound.pop("max_val")
            op = "relu6"
        self.layer(op, bound, call)

    def _squeeze(self, op: str, bound: dict, call: Call) -> None:
        """``x.squeeze(1)``, ``x.squeeze((2, 3))``, ``x.squeeze()``: one layer per size-1 dim; a dim that is not
        size 1 is left (as PyTorch does; at other sizes the second run compares)."""
        source, dims = bound.get("input"), bound.get("dim")
        if not isinstance(source, torch.Tensor) or source.dim() == 0:
            return self.unknown(call)
        rank = source.dim()
        dims = range(rank) if dims is None else [dims] if _is_int(dims) else dims
        dims = sorted({dim % rank for dim in dims if source.shape[dim] == 1})
        if not dims:
            return self.alias(call, source)
        current = source
        for dim in reversed(dims[1:]):
            current = self.part(call, "squeeze", current, dim)
        self.layer(op, {"input": current, "dim": dims[0]}, call)

    def _pad(self, op: str, bound: dict, call: Call) -> None:
        bound["pad"] = pads = [int(p) for p in bound["pad"]]
        source = bound.get("input")
        if (isinstance(source, torch.Tensor) and source.dim() >= 3 and len(pads) == 2 * (source.dim() - 2)
                and bound.get("mode") in (None, "constant") and not bound.get("value")):
            def centred_to(other: torch.Tensor) -> bool:  # U-Net's [diffX // 2, diffX - diffX // 2, ...]
                differences = [other.shape[dim] - source.shape[dim] for dim in reversed(range(2, source.dim()))]
                return pads == [part for d in differences for part in (d // 2, d - d // 2)]
            bound["pad"] = self.size_of(source, centred_to) or pads
        if bound.get("mode") is None:
            bound.pop("mode", None)
        if bound.get("value") is None:
            bound.pop("value", None)
        self.layer(op, bound, call)  # a zero pad too: at other sizes the same call may pad

    def _max_pool1d(self, op: str, bound: dict, call: Call) -> None:
        if bound.get("return_indices") or call.name.endswith("_with_indices"):
            self.fail(call, "returns indices", "call it with return_indices=False")
            return
        bound.pop("return_indices", None)
        self.layer(op, bound, call)

    _max_pool2d = _max_pool3d = _max_pool1d

    def _interpolate(self, op: str, bound: dict, call: Call) -> None:
        if bound.get("scale_factor") is not None:
            factors = literal(bound["scale_factor"])
            bound["scale_factor"] = [float(f) for f in factors] if isinstance(factors, list) else float(factors)
        source, size = bound.get("input"), literal(bound.get("size"))
        if isinstance(source, torch.Tensor) and isinstance(size, list) and len(size) == source.dim() - 2:
            traced = sizes.spec_sizes(list(bound["size"]), self.node, self.size_tensors, spare=False)  # (h // 2, w // 2)
            nodes = {entry["like"] for entry in traced or () if isinstance(entry, dict)}
            if traced and traced == [{"like": next(iter(nodes)), "dims": [dim]} for dim in range(2, source.dim())]:
                traced = {"like": next(iter(nodes))}  # size=skip.shape[-2:]
            bound["size"] = traced or self.size_of(source, lambda other: list(other.shape[2:]) == size) or size
        self.layer(op, bound, call)

    def size_of(self, source: torch.Tensor, fits) -> dict | None:
        """``{like: NODE}`` for the tensor, of ``source``'s rank and not ``source`` itself, whose sizes the
        code read most recently and that ``fits`` (``F.interpolate(h, size=skip.shape[-2:])``); None when no
        size read fits: the sizes stay numbers, and the second run refuses them if they follow the input."""
        for other in reversed(self.sizes_read):
            if other is source or other.dim() != source.dim() or not fits(other):
                continue
            found = self.node(other)
            if isinstance(found, str):
                return {"like": found}
        return None

    def clamp(self, call: Call) -> None:
        """``x.clamp_min(a)``, ``torch.clamp_max(x, b)``: ``clamp`` with one bound."""
        side = "min" if call.name.startswith("clamp_min") else "max"
        bound = dict(zip(("input", side), call.arguments)) | call.keywords
        self._clamp("clamp", bound, call)

    def norm(self, call: Call) -> None:
        """``torch.norm(x, p=2, dim=(1, 2), keepdim=True)``, ``x.norm(dim=-1)``: vector_norm over the dims."""
        bound = dict(zip(("input", "p", "dim", "keepdim"), call.arguments)) | call.keywords
        if bound.get("dtype") is not None:
            return self.fail(call, "converts the dtype", "leave dtype out")
        dims = bound.get("dim")
        p = bound.get("p", 2)
        self.layer("vector_norm", {"x": bound["input"], "ord": 2 if p in ("fro", 2.0) else p,
                                   "dim": None if dims is None else [dims] if isinstance(dims, int) else list(dims),
                                   "keepdim": bool(bound.get("keepdim", False))}, call)

    def _clamp(self, op: str, bound: dict, call: Call) -> None:
        """``x.clamp(min=0)`` is relu, ``clamp(0, 6)`` relu6, ``clamp(a, b)`` hardtanh(a, b), any other the
        clamp op (one-sided to another bound: SwinV2's logit scale)."""
        low, high = bound.get("min"), bound.get("max")
        if (low is not None and not _is_number(low)) or (high is not None and not _is_number(high)):
            self.fail(call, "clamps to tensor bounds", "clamp to numbers")
        elif low == 0 and high is None:
            self.layer("relu", {"input": bound["input"]}, call)
        elif low == 0 and high == 6:
            self.layer("relu6", {"input": bound["input"]}, call)
        elif low is not None and high is not None:
            self.layer("hardtanh", {"input": bound["input"], "min_val": float(low), "max_val": float(high)}, call)
        else:
            self.layer("clamp", {"input": bound["input"], "min": low, "max": high}, call)

    def pass_through(self, call: Call) -> None:
        source, result = call.arguments[0], call.result
        if not isinstance(result, torch.Tensor) or not isinstance(source, torch.Tensor):
            return self.unknown(call)
        if result.dtype != source.dtype or result.device != source.device:
            self.fail(call, f"converts {source.dtype} on {source.device} to {result.dtype} on {result.device}",
                      "trace at the dtype and device the model runs in, without conversions")
            return
        self.alias(call, source)

    def alias(self, call: Call, source: torch.Tensor) -> None:
        """The result is the source's value under a new tensor object."""
        reasons: set[int] = set()
        found = self.operand(source, call, reasons)  # an unknown tensor becomes a problem at this call
        self.kept.append(call.result)
        if reasons:
            self.taint(call.result, frozenset(reasons))
        else:
            self.names[id(call.result)] = found

    def _cat(self, op: str, bound: dict, call: Call) -> None:
        """``torch.cat([x], 1)``, one tensor (DenseNet's first dense layer), is ``x``."""
        if len(bound.get("tensors", ())) == 1 and isinstance(bound["tensors"][0], torch.Tensor):
            return self.alias(call, bound["tensors"][0])
        self.layer(op, bound, call)

    def dropout(self, call: Call) -> None:
        keywords = dict(zip(("input", "p", "training", "inplace"), call.arguments)) | call.keywords
        if not keywords.get("training", True) or keywords.get("p", 0.5) == 0:
            return self.alias(call, keywords["input"])
        source, p = keywords["input"], keywords.get("p", 0.5)
        rank = {"dropout1d": 3, "dropout2d": 4, "dropout3d": 5}.get(call.name)
        if call.name in ("dropout", *(() if rank is None else (call.name,))) and isinstance(p, float) and 0 < p < 1:
            if rank is not None and source.dim() != rank:
                return self.fail(call, f"of an input of rank {source.dim()}, not {rank} (batched)",
                                 f"pass a batched input of rank {rank}, as nn.{call.name.capitalize()} expects")
            arguments = {"input": source, "p": p, **({"noise": "channel"} if rank is not None else {})}
            return self.layer("dropout", arguments, call)
        self.fail(call, "is random in training mode, so its gradient is not a function of the inputs",
                  "trace the model in eval mode (--eval) or with p=0")

    def reshape(self, call: Call) -> None:
        source, result = call.arguments[0], call.result
        shape = _sizes(call, "shape", "size")
        kept = result.dim() - 1  # (N, -1) is flatten(start_dim=1), whatever N is
        if (0 <= kept < source.dim() and tuple(source.shape[:kept]) == tuple(result.shape[:kept])
                and math.prod(source.shape[kept:]) == result.shape[kept]):
            return self.layer("flatten", {"input": source, "start_dim": kept}, call)
        if tuple(result.shape) == tuple(source.shape):
            return self.alias(call, source)
        traced = sizes.spec_sizes(shape, self.node, self.size_tensors)  # sizes that carry the dims they were read from
        if traced is not None:
            return self.layer("reshape", {"input": source, "shape": traced}, call)
        shape = [int(size) for size in shape]
        if shape and -1 not in shape and shape[0] == source.shape[0] and source.dim() > 0:
            shape[0] = -1  # the batch, read from the input: (N, C, 4, 16) stays shape-generic
        shape = [size if size == -1 else self.size_read(size, position, len(shape)) for position, size in enumerate(shape)]
        self.layer("reshape", {"input": source, "shape": shape}, call)

    def size_read(self, size: int, position: int, rank: int) -> int | dict:
        """Entry ``position`` of a ``rank``-long list of sizes as a size the code read, when one fits:
        ``{like: x}`` for x's size at the same position (x of that rank: ``reshape(b, c, h, w)`` with
        ``b, c, h, w = x.shape``), ``{like: x, dims: [2, 3]}`` for a product of two or more of x's dims aligned
        with the entry's place from the end or the start (``h * w`` last), most recent reads first; else the number,
        which the second run, at other and unequal sizes, refuses if it follows the input."""
        if size == 1:  # a literal 1 (view(b, c, 1, 1)), even where a map happens to be 1x1 when traced
            return size
        named = [(other, found) for other in reversed(self.sizes_read) if isinstance(found := self.node(other), str)]
        for other, found in named:
            if other.dim() == rank and other.shape[position] == size:
                return {"like": found}
        from_end = rank - 1 - position
        for aligned_end in (True, False):
            for other, found in named:
                for length in range(2, other.dim() + 1):  # one dim elsewhere than its place: a coincidence
                    start = other.dim() - from_end - length if aligned_end else position
                    dims = list(range(start, start + length))
                    if start < 0 or dims[-1] >= other.dim() or (start == 0 and position != 0):
                        continue  # the batch merged into a later entry: a coincidence (b * c == features)
                    if math.prod(other.shape[dim] for dim in dims) == size:
                        return {"like": found, "dims": dims}
        return size

    def slice(self, call: Call) -> None:
        """``x[:, 1:3]`` is narrow, ``x[:, 0]`` narrow and squeeze, ``x[:, None]`` and ``g[..., None, None]``
        unsqueeze: the narrows first, then the squeezes, then the new dims, each a layer."""
        source, index = call.arguments[0], call.arguments[1]
        index = index if isinstance(index, tuple) else (index,)
        taken = sum(1 for item in index if item is not None and item is not Ellipsis)  # dims the index reads
        if sum(1 for item in index if item is Ellipsis) == 1:
            position = index.index(Ellipsis)
            index = index[:position] + (slice(None),) * max(source.dim() - taken, 0) + index[position + 1:]
        if not all(item is None or isinstance(item, slice) or _is_int(item) for item in index) or taken > source.dim():
            self.fail(call, "indexes with something other than start:stop slices, ints, None and ...", FIXES["__getitem__"])
            return
        current, dim, out, squeezed, new = source, 0, 0, [], []
        for item in index:
            if item is None:
                new.append(out)
                out += 1
                continue
            size = source.shape[dim]
            if _is_int(item):
                start, stop, step = item % size, item % size + 1, 1  # in range: PyTorch indexed with it
                squeezed.append(dim)
            else:
                start, stop, step = item.indices(size)
                out += 1
            if step != 1 and stop < size:
                self.fail(call, "slices with a step to a stop before the end", "slice to the end (x[:, 1::2])")
                return
            if step != 1:  # x[:, 1::2]: patch merging, space-to-depth
                result = current[(slice(None),) * dim + (slice(start, None, step),)]
                self.layer("strided_slice", {"input": current, "dim": dim, "start": start, "step": step},
                           Call("strided_slice", None, (current,), {}, result, call.where, call.module, call.leaf))
                current, dim = result, dim + 1
                continue
            if (start, stop) != (0, size) or _is_int(item):
                current = self.part(call, "narrow", current, dim, start, max(stop - start, 0))
            dim += 1
        for dim in reversed(squeezed):
            current = self.part(call, "squeeze", current, dim)
        for dim in new:
            current = self.part(call, "unsqueeze", current, dim)
        self.alias(call, current)

    def part(self, call: Call, name: str, tensor: torch.Tensor, *arguments: int, result: Any = None) -> torch.Tensor:
        """One layer of a call that becomes several (``x[:, 0, None]``): ``name`` applied to ``tensor``."""
        function = getattr(torch, name)
        result = function(tensor, *arguments) if result is None else result
        self.add(Call(name, function, (tensor, *arguments), {}, result, call.where, call.module, call.leaf))
        return result

    def pieces(self, call: Call) -> None:
        """``x.chunk(2, dim=1)``, ``torch.split(x, [16, 48], 1)``, ``x.unbind(1)``: one narrow per piece, at the
        offsets of the pieces the call returned (a size that depends on the input's is refused by the second run)."""
        source, result = call.arguments[0] if call.arguments else call.keywords.get("input"), call.result
        if not isinstance(source, torch.Tensor) or not isinstance(result, (tuple, list)) or source.dim() == 0:
            return self.unknown(call)
        position = 1 if call.name == "unbind" else 2
        dim = call.keywords.get("dim", call.arguments[position] if len(call.arguments) > position else 0)
        dim = dim % source.dim()
        start = 0
        for piece in result:
            length = 1 if call.name == "unbind" else piece.shape[dim]
            if length == 0:
                start += length
                continue  # an empty piece: nothing to differentiate; reading it is reported as an unknown tensor
            if call.name == "unbind":
                self.part(call, "squeeze", self.part(call, "narrow", source, dim, start, length), dim, result=piece)
            else:
                self.part(call, "narrow", source, dim, start, length, result=piece)
            start += length

    def transpose(self, call: Call) -> None:
        """``x.transpose(1, 2)``, ``torch.swapaxes``, ``x.mT``, ``x.t()``, ``x.T``: a permute."""
        source = call.arguments[0] if call.arguments else call.keywords.get("input")
        if not isinstance(source, torch.Tensor):
            return self.unknown(call)
        rank = source.dim()
        if call.name in TRANSPOSES:
            bound = dict(zip(("input", *TRANSPOSES[call.name]), call.arguments)) | call.keywords
            first, second = (bound.get(key) for key in TRANSPOSES[call.name])
        elif call.name == "mT":
            first, second = -2, -1
        elif call.name == "T":
            first, second = None, None
        else:  # t(): a 2-d transpose, nothing for fewer dims
            first, second = (0, 1) if rank == 2 else (0, 0)
        if first is None:
            dims = list(range(rank))[::-1]
        else:
            dims = list(range(rank))
            dims[first % rank], dims[second % rank] = dims[second % rank], dims[first % rank]
        if dims == list(range(rank)):
            return self.alias(call, source)
        self.layer("permute", {"input": source, "dims": dims}, call)

    def reshape_as(self, call: Call) -> None:
        """``x.view_as(y)``, ``x.reshape_as(y)``: ``x.reshape(y.shape)``, the batch kept generic as for ``view``."""
        other = call.keywords.get("other", call.arguments[1] if len(call.arguments) > 1 else None)
        if not isinstance(other, torch.Tensor):
            return self.unknown(call)
        self.reshape(dataclasses.replace(call, arguments=(call.arguments[0], tuple(other.shape)), keywords={}))

    def expand(self, call: Call) -> None:
        """``x.expand(b, c, h, w)``, ``x.expand_as(y)``, ``torch.broadcast_to(x, shape)``: the sizes are read at
        run time where the code read them (``expand_as(y)``: every entry ``{like: y}``); -1 keeps a size."""
        source = call.arguments[0]
        if call.name == "expand_as":
            other = call.keywords.get("other", call.arguments[1] if len(call.arguments) > 1 else None)
            if not isinstance(other, torch.Tensor) or not isinstance(self.node(other), str):
                return self.unknown(call)
            shape: list[Any] = [{"like": self.node(other)} for _ in range(other.dim())]  # fresh dicts: no YAML aliases
        else:
            shape = sizes.spec_sizes(_sizes(call, "size", "shape"), self.node, self.size_tensors, spare=False) or [
                size if size == -1 else self.size_read(size, position, len(_sizes(call, "size", "shape")))
                for position, size in enumerate(int(size) for size in _sizes(call, "size", "shape"))]
        if not isinstance(source, torch.Tensor):
            return self.unknown(call)
        self.layer("expand", {"input": source, "shape": shape}, call)

    def repeat(self, call: Call) -> None:
        """``x.repeat(1, 1, 2, 2)``, ``torch.tile(x, (2, 2))`` (tile pads the counts with leading 1s)."""
        source, counts = call.arguments[0], [int(count) for count in _sizes(call, "repeats", "dims")]
        if not isinstance(source, torch.Tensor):
            return self.unknown(call)
        if call.name == "tile" and len(counts) < source.dim():
            counts = [1] * (source.dim() - len(counts)) + counts
        self.layer("repeat", {"input": source, "counts": counts}, call)

    def statistic_and_mean(self, call: Call) -> None:
        """``torch.var_mean(w, dim, unbiased / correction, keepdim)`` (BiT's weight standardization) and
        ``std_mean``: a var (or std) layer for the first result and a mean layer for the second."""
        bound = dict(zip(("input", "dim", "unbiased", "keepdim"), call.arguments)) | call.keywords
        source, results = bound.pop("input", None), call.result
        if not isinstance(source, torch.Tensor) or not isinstance(results, tuple) or len(results) != 2:
            return self.unknown(call)
        dims = bound.get("dim")
        dims = None if dims is None else [dims] if isinstance(dims, int) else list(dims)
        keepdim = bool(bound.get("keepdim", False))
        statistic = {"input": source, "dim": dims, "keepdim": keepdim}
        for key in ("unbiased", "correction"):
            if bound.get(key) is not None:
                statistic[key] = bound[key] if key == "unbiased" else int(bound[key])
        self.layer(call.name.split("_")[0], statistic, dataclasses.replace(call, result=results[0]))
        mean = {"input": source, "dim": dims if dims is not None else list(range(source.dim())), "keepdim": keepdim}
        self.layer("mean", mean, dataclasses.replace(call, result=results[1]))

    def random_mask(self, call: Call) -> bool:
        """A random mask drawn as timm's DropPath and torchvision's StochasticDepth draw it, and its use:
        ``x.new_empty(shape)`` / ``torch.empty(shape)``, ``.bernoulli_(keep)``, ``.div_(keep)``, then
        ``x * mask``, which is one dropout layer. True where the call was one of these steps."""
        receiver = call.arguments[0] if call.arguments else None
        if call.name in ("new_empty", "empty", "empty_like") and isinstance(call.result, torch.Tensor):
            self.kept.append(call.result)
            self.masks[id(call.result)] = {"keep": None, "scale": False}
            return True
        mask = self.masks.get(id(receiver)) if isinstance(receiver, torch.Tensor) else None
        value = call.arguments[1] if len(call.arguments) > 1 else call.keywords.get("p", call.keywords.get("other"))
        if mask is not None and call.name == "bernoulli_" and mask["keep"] is None and isinstance(value, float):
            mask["keep"] = value
            return True
        if mask is not None and call.name in ("div_", "__itruediv__") and mask["keep"] is not None and not mask["scale"] \
                and value == mask["keep"]:
            mask["scale"] = True
            return True
        if call.name in ("mul", "__mul__", "__rmul__") and len(call.arguments) == 2:
            first, second = call.arguments
            for source, other in ((first, second), (second, first)):
                drawn = self.masks.get(id(other)) if isinstance(other, torch.Tensor) else None
                if drawn is None or drawn["keep"] is None or not isinstance(source, torch.Tensor):
                    continue
                noise = _noise_kind(tuple(source.shape), tuple(other.shape))
                if noise is None or not 0 < drawn["keep"] <= 1 or other.dim() != source.dim():
                    self.fail(call, f"multiplies by a random mask of shape {list(other.shape)}, which is no dropout "
                              f"mask of an input {list(source.shape)}", "draw the mask per element, per sample and "
                              "channel, per sample or per batch, as nn.Dropout, timm's DropPath and torchvision's "
                              "StochasticDepth do")
                    return True
                if drawn["keep"] == 1:
                    self.alias(call, source)
                    return True
                self.layer("dropout", {"input": source, "p": _drop_probability(drawn["keep"]), "noise": noise,
                                       "scale": drawn["scale"]}, call)
                return True
        if mask is not None or any(id(value) in self.masks for value in _flat(call.arguments, call.keywords)
                                   if isinstance(value, torch.Tensor)):
            self.fail(call, "uses a random mask otherwise than x * mask after .bernoulli_(keep) and .div_(keep)",
                      "draw the mask as timm's drop_path does: x.new_empty(shape).bernoulli_(keep), "
                      "mask.div_(keep), x * mask")
            return True
        return False

    def unknown(self, call: Call) -> None:
        if call.name in RANDOM:  # timm's drop_path: x.new_empty(...).bernoulli_(keep) in training mode
            return self.fail(call, "draws random numbers, which a spec cannot hold (stochastic depth and dropout "
                             "are random in training mode only)", "trace the model in eval mode (--eval), or turn "
                             "the randomness off (drop_path_rate=0)")
        tensors = [a for a in _flat(call.arguments, call.keywords) if isinstance(a, torch.Tensor)]
        reads_traced = any(id(t) in self.names or id(t) in self.poison or id(t) in self.sources for t in tensors)
        what = ("is not an op symgrad can differentiate" if reads_traced
                else "creates a tensor inside the traced code, which a spec cannot hold")
        fix = FIXES.get(call.name, "write it with the ops `symgrad ops` lists" if reads_traced
                        else "pass the tensor to the traced function as an argument")
        self.fail(call, what, fix)

    # ----- the loss tail ----------------------------------------------------------------------
    def reduce(self, call: Call) -> None:
        source = call.arguments[0]
        dims = call.keywords.get("dim", call.arguments[1] if len(call.arguments) > 1 else None)
        keepdim = call.keywords.get("keepdim", call.arguments[2] if len(call.arguments) > 2 else False)
        rank = source.dim()
        spatial = list(range(2, rank))
        if (call.name == "mean" and dims is not None and 3 <= rank <= 5 and id(source) not in self.reductions
                and sorted(d % rank for d in ([dims] if isinstance(dims, int) else dims)) == spatial):
            return self.global_average(call, source, rank, bool(keepdim))
        if dims is None or (isinstance(dims, (tuple, list)) and len(dims) == 0):
            how = call.name
        else:
            dims = sorted(d % rank for d in ([dims] if isinstance(dims, int) else dims))
            how = "per_sample" if call.name == "sum" and dims == list(range(1, rank)) and not keepdim else None
        if how is None:  # a reduction inside the network (a hand-written LayerNorm's channel mean): a layer
            self.layer(call.name, {"input": source, "dim": dims, "keepdim": bool(keepdim)}, call)
            return
        inner = self.reductions.get(id(source))
        if inner is not None:  # F.mse_loss(..., reduction='none').sum()
            if inner.how != "none":
                self.fail(call, "reduces a loss twice", "reduce once")
                return
            self.reductions[id(call.result)] = Reduction(how, loss=inner.loss, call=call)
            self.kept.append(call.result)
            return
        reasons: set[int] = set()
        found = self.operand(source, call, reasons)
        if reasons:
            self.taint(call.result, frozenset(reasons))
            return
        self.reductions[id(call.result)] = Reduction(how, source=found, call=call)
        self.kept.append(call.result)

    def _log_softmax(self, op: str, bound: dict, call: Call) -> None:
        """A layer; noted too, because ``nll_loss(log_softmax(z, dim=1), labels)`` is
        ``cross_entropy(z, labels)``, which ``loss_call`` makes of it."""
        source, dim = bound.get("input"), bound.get("dim")
        self.layer(op, bound, call)
        if isinstance(source, torch.Tensor) and isinstance(dim, int) and dim % source.dim() == 1:
            self.log_probabilities[id(call.result)] = source

    def global_average(self, call: Call, source: torch.Tensor, rank: int, keepdim: bool) -> None:
        """``x.mean(dim=(2, 3))``, global average pooling, is adaptive_avg_pool2d to 1 (then flatten)."""
        pooled = torch.flatten(source, 2).mean(dim=2).reshape(*source.shape[:2], *([1] * (rank - 2)))
        pool = Call(f"adaptive_avg_pool{rank - 2}d", call.function, (source, 1), {}, pooled if not keepdim else call.result,
                    call.where, call.module, call.leaf)
        self.add(pool)
        if not keepdim:
            self.layer("flatten", {"input": pool.result, "start_dim": 1}, call)

    def loss_call(self, op: str, call: Call) -> None:
        bound = dict(zip(LOSSES[op], call.arguments)) | call.keywords
        reasons: set[int] = set()
        if op == "nll_loss" and id(bound["input"]) in self.log_probabilities:
            self.drop_unread(self.names.get(id(bound["input"])))  # the log_softmax layer, now inside the loss
            op, bound["input"] = "cross_entropy", self.log_probabilities[id(bound["input"])]
        prediction = self.operand(bound.pop("input"), call, reasons)
        target = self.operand(bound.pop("target"), call, reasons)
        if reasons:
            self.taint(call.result, frozenset(reasons))
            return
        how = bound.pop("reduction", "mean")
        for key, default in LOSS_DEFAULTS.items():
            value = bound.pop(key, default)
            if value is not None and value != default:
                self.fail(call, f"argument {key}={value!r} is not supported", "leave it at its default")
                return
        loss = {"op": op, "in": prediction, "target": target, **{k: float(v) for k, v in bound.items() if v != 1.0}}
        self.reductions[id(call.result)] = Reduction(how, loss=loss, call=call)
        self.kept.append(call.result)

    def drop_unread(self, name: str | None) -> None:
        """Remove the layer that makes ``name`` if no later layer reads it."""
        index = next((i for i, layer in enumerate(self.layers) if layer["out"] == name), None)
        if index is None or any(name in _flat(list(layer.values()), {}) for layer in self.layers[index + 1:]):
            return
        del self.layers[index], self.layer_calls[index]

    def scale_reduction(self, call: Call) -> bool:
        """``0.5 * loss``, ``loss / 2``: scale a reduction; False when the call is not that."""
        kind = SIGNATURES.get(call.name, ("",))[0]
        if kind not in ("mul", "div") or len(call.arguments) != 2 or call.keywords:
            return False
        tensor, number = call.arguments
        if kind == "mul" and not isinstance(tensor, torch.Tensor):
            tensor, number = number, tensor  # torch.mul(0.5, loss)
        if not (isinstance(tensor, torch.Tensor) and id(tensor) in self.reductions and _is_number(number)):
            return False  # a reflected call (2 * loss) also arrives as (loss, 2)
        inner = self.reductions[id(tensor)]
        scale = inner.scale * number if kind == "mul" else inner.scale / number
        self.reductions[id(call.result)] = Reduction(inner.how, inner.source, inner.loss, scale, inner.call)
        self.kept.append(call.result)
        return True


def _storage(tensor: torch.Tensor) -> int:
    """Where a tensor's entries live, shared by its views (every recorded tensor stays alive, so no other
    takes its place)."""
    return tensor.untyped_storage().data_ptr()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _flat(arguments, keywords):
    for value in [*arguments, *keywords.values()]:
        if isinstance(value, (tuple, list)):
            yield from value
        else:
            yield value


def _noise_kind(shape: tuple, mask: tuple) -> str | None:
    """Which dropout mask ``mask`` is for an input of ``shape``: one entry per element, per sample and
    channel, per sample, or one for the batch; None if it is none of these."""
    rank = len(shape)
    if mask == shape:
        return "element"
    if rank >= 2 and mask == (*shape[:2], *[1] * (rank - 2)):
        return "channel"
    if rank >= 1 and mask == (shape[0], *[1] * (rank - 1)):
        return "row"
    if mask == (1,) * rank:
        return "batch"
    return None


def _drop_probability(keep: float) -> float:
    """The p whose ``1 - p`` is ``keep`` exactly (the generated code draws with ``1 - p``), written as
    briefly as it can be (0.3, not the 0.30000000000000004 that 1 - 0.7 gives)."""
    for digits in range(1, 18):
        p = round(1 - keep, digits)
        if 1 - p == keep:
            return p
    return 1 - keep
