"""Recorded torch calls to spec layers: the walk.

Every op in the rule registry is reached by its ``torch.nn.functional`` / ``torch`` function, its
tensor method and its in-place variant (``relu_``, ``add_``: the out-of-place op, the tensor object
taking the new node's name), and so by the ``nn.Module`` layers that call them. Arguments are bound
by PyTorch's own positional order (``torch_names.py``) and kept only where they differ from the op's
default.

A call that cannot become a layer does not stop the walk: its result is *poisoned* with the reason,
and anything computed from it inherits the poison. Only reasons the loss depends on are reported,
all at once, so a forward that logs ``x.norm()`` is not refused for it.

This file holds the walk and its state (names, poison, constants, writes). A call meets the named
pre-checks in order (``PRE_CHECKS`` below), then its handler in one table (``TABLE``, ``dispatch.py``):
a rule's call is bound here and goes to its op's hook where one is registered (``op_hooks.py``,
``embedding.py``, ``attention.py``, ``loss_tail.py``); tensor methods and calls with no rule of their own
are registered by name in ``views.py``, ``loss_tail.py``, ``random_masks.py`` and ``attention.py``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from ..rules import LAYER_RULES
from ..spec_values import check_identifier
from . import attention, dispatch, embedding, loss_tail, op_hooks, random_masks, views
from .casts import integer_identity
from .constants import OneValueConstants, constant_layer
from .custom_functions import Applied, check
from .dataflow import (
    Problem,
    Reduction,
    Source,
    fitted,
    flat_arguments,
    is_number,
    literal,
    numbered,
    plain_name,
    storage_of,
)
from .errors import Refusal, TraceError
from .indexing import index_view
from .names_from_code import name_last_part
from .recorder import NO_GRAD, RANDOM, Call
from .size_checks import write_checks
from .torch_names import (
    BY_FUNCTION,
    CONSTANT,
    FIXES,
    IGNORED,
    IN_PLACE_BOOKKEEPING,
    NEUTRAL,
    SIGNATURES,
)


@dataclass
class SpecBuilder(OneValueConstants):
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
    sizes_read: list[torch.Tensor] = field(default_factory=list)
    """The tensors whose sizes the user's code has read so far, in order (``x.shape[-2:]``)."""
    constants: dict[int, tuple[Call, int]] = field(default_factory=dict)
    """id of a constant tensor the code made (``torch.full_like(x, 2.0)``) -> the call that made it, and
    when (the count of calls walked)."""
    writes: dict[int, int] = field(default_factory=dict)
    """Storage of a tensor written in place with a value that is not a constant -> when, last."""
    index_views: dict[int, torch.Tensor] = field(default_factory=dict)
    """id of a reshape of an int64 input (``index.view(-1)``) -> that input (``indexing.py``)."""
    arguments: dict[str, torch.Tensor] = field(default_factory=dict)
    """The traced function's floating tensor arguments by name (a conversion to the model's dtype is
    written ``like`` one of them: ``casts.py``)."""
    walked: int = 0
    size_tensors: list[torch.Tensor] = field(default_factory=list)
    """The tensors whose sizes the code read, by the index the sizes carry (``sizes.Dim``)."""
    quiet: bool = False
    """The second run's walk (other sizes, or float64): see :meth:`function_refusal`."""
    reserved: frozenset[str] = frozenset()
    """Names the spec gives to what the walk does not see: the loss's target (``--target``), which no
    layer may be named (a model's ``target = ...``: that layer is ``target_2``)."""
    checked_functions: dict[str, list] = field(default_factory=dict)
    """Custom ``autograd.Function`` name -> its checks (``custom_functions.Checked``), where they passed."""
    function_refusals: dict[int, int | None] = field(default_factory=dict)
    """id of an ``Applied`` -> the index of its refusal in ``problems``, or None where its check passed."""
    owned: dict[str, Any] = field(default_factory=dict)
    """Each handler module's own state for this walk (:meth:`own`): ``random_masks``' draws, ``loss_tail``'s
    log-probabilities."""
    code_names: dict[int, str] = field(default_factory=dict)
    """id of a recorded result (or piece of one) -> the name the model's code gives it (``Call.targets``)."""
    made: tuple[str, str, int] = ("", "", 0)
    """The base, the name and the base's count :meth:`out_name` made last."""

    def __post_init__(self):
        self.source_names = {source.name for source in self.sources.values()} | self.reserved

    # ----- naming -----------------------------------------------------------------------------
    def out_name(self, op: str, call: Call, named: bool = True) -> str:
        base = plain_name(call.module) if call.module else ""
        given = self.code_names.get(id(call.result)) if named and not call.leaf else None
        if given is not None and check_identifier(fitted(f"{base}_{given}" if base else given)) is None:
            base = fitted(f"{base}_{given}" if base else given)  # q, k, v = qkv.unbind(0): blocks_0_attn_q
        elif base and not call.leaf:
            base = f"{base}_{op}"
        base = fitted(base or op)
        if base[0].isdigit() or check_identifier(base) is not None:
            base = fitted(f"{op}_{base}")
        if check_identifier(base) is not None:  # softmax in a Sequential's "0": softmax_ is a reserved prefix
            base = fitted(f"layer_{base}")
        self.taken[base] += 1
        name = base if self.taken[base] == 1 else numbered(base, self.taken[base])
        while name in self.source_names or check_identifier(name) is not None:
            self.taken[base] += 1
            name = numbered(base, self.taken[base])
        self.made = (base, name, self.taken[base])
        return name

    def fail(self, call: Call, what: str, fix: str, op: str | None = None) -> int:
        """Poison the call's result with a new problem, and with those its inputs already carry; the
        problem's index."""
        self.problems.append(Problem(call.where, call.module, op or call.name, what, fix))
        inherited = [
            self.poison[id(value)]
            for value in flat_arguments(call.arguments, call.keywords)
            if isinstance(value, torch.Tensor) and id(value) in self.poison
        ]
        self.taint(call.result, frozenset({len(self.problems) - 1}).union(*inherited))
        return len(self.problems) - 1

    def refuse(self, tensor: Any, problem: Problem) -> None:
        """``tensor`` carries ``problem`` to whatever reads it."""
        self.problems.append(problem)
        self.taint(tensor, frozenset({len(self.problems) - 1}))

    def carried(self, tensor: Any) -> frozenset[int] | None:
        """The problems ``tensor`` carries, or None."""
        return self.poison.get(id(tensor)) if isinstance(tensor, torch.Tensor) else None

    def name(self, tensor: torch.Tensor, node: str) -> None:
        """``tensor`` is the value of ``node`` from here on."""
        self.names[id(tensor)] = node

    def named(self, tensor: torch.Tensor) -> str | None:
        """The node ``tensor`` was named, or None (unlike :meth:`node`, no input is named by reading it)."""
        return self.names.get(id(tensor))

    def is_input(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is an argument, a parameter or buffer, or a global the function reads."""
        return id(tensor) in self.sources

    def module(self, path: str | None) -> Any:
        """The traced model's module at ``path`` (``layer2.0.bn1``), or None."""
        return self.modules.get(path)

    def own(self, owner: str, make: Any) -> Any:
        """The state ``owner`` (a handler module) keeps for this walk, made by ``make()`` on first use."""
        if owner not in self.owned:
            self.owned[owner] = make()
        return self.owned[owner]

    def taint(self, result: Any, reasons: frozenset[int]) -> None:
        for tensor in result if isinstance(result, (tuple, list)) else [result]:
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
        pieces = call.result if isinstance(call.result, (tuple, list)) else (call.result,)
        for name, piece in zip(call.targets, pieces):
            if name is not None and isinstance(piece, torch.Tensor):
                self.code_names[id(piece)] = name
        if call.compared:  # the branches taken on sizes since the call before: checked at run time
            write_checks(self, call)
        target = call.arguments[0] if call.arguments and isinstance(call.arguments[0], torch.Tensor) else None
        writes = (
            target is not None
            and not call.constant
            and (  # x.add_(y), x[i] = y, x += y; not x[i] (__getitem__)
                (call.name.endswith("_") and not call.name.endswith("__"))
                or call.name == "__setitem__"
                or call.name.startswith("__i")
            )
        )
        written = target if writes else call.keywords.get("out")
        if isinstance(written, torch.Tensor) and id(written) in self.mutable:  # a buffer: the batch count alone
            self.bookkeeping(call, written)
            return
        problems = len(self.problems)
        try:
            self.dispatch(call)
        finally:
            if writes:  # every view of its storage, a constant's too (c[:, :1].copy_(h)), changed here
                self.writes[storage_of(target)] = self.walked
            if writes and id(target) in self.constants:  # out[:, :2] = h: no longer its constant (a layer
                del self.constants[id(target)]  # made of it, c.add_(h), renamed it) ...
                if len(self.problems) > problems:  # ... and what reads it carries the write's problem
                    self.taint(target, frozenset(range(problems, len(self.problems))))

    def bookkeeping(self, call: Call, buffer: torch.Tensor) -> None:
        """A buffer written in place by the forward: a BatchNorm's batch count (``symgrad.bind`` counts it as
        the module does), or refused (an EMA, a step count, a cache), whose write the bound step would leave out."""
        source = self.sources.get(id(buffer))
        key = source.state_key if source is not None else None
        path, _, attribute = (key or "").rpartition(".")
        if key is None or (
            attribute == "num_batches_tracked"
            and call.name in IN_PLACE_BOOKKEEPING
            and isinstance(self.modules.get(path), torch.nn.modules.batchnorm._BatchNorm)
        ):
            return
        inside = f" (in {call.module})" if call.module else ""
        raise TraceError(
            f"{call.where}: error: '{call.name}' writes the buffer {key} in the forward{inside}, which "
            "the explicit training step does not do (it moves BatchNorm's statistics alone) (fix: "
            "return what the update reads as one more output and update the buffer in your training "
            "loop, or trace the model without the update)"
        )

    def dispatch(self, call: Call) -> None:
        """The named pre-checks in order (``PRE_CHECKS``), then the call's handler from the one table
        (``dispatch.py``), or :meth:`unknown`."""
        for _, taken in PRE_CHECKS:
            if taken(self, call):
                return
        TABLE.get(call.name, SpecBuilder.unknown)(self, call)

    def constant(self, call: Call) -> bool:
        """torch.full(...), torch.ones_like(x), torch.tensor(0.5): a value, not a node."""
        if not call.constant:
            return False
        self.kept.append(call.result)
        self.constants[id(call.result)] = (call, self.walked)
        self.names.pop(id(call.result), None)
        self.poison.pop(id(call.result), None)
        return True

    def no_grad(self, call: Call) -> bool:
        """A value autograd does not differentiate: refused where the loss reads it."""
        if call.undifferentiated != NO_GRAD:
            return False
        self.fail(
            call,
            "runs under torch.no_grad() or inference_mode(), so autograd gives its result no "
            "gradient, and the explicit backward would differentiate it",
            "compute it before the model's forward and pass it in as an argument (a teacher's output, "
            "a target), or train that model with autograd",
        )
        return True

    def custom_function(self, call: Call) -> bool:
        """... or differentiates by a backward of its own, which is not its forward's derivative."""
        return bool(call.undifferentiated) and not self.function_checked(call, call.undifferentiated)

    def rule_call(self, call: Call) -> None:
        """A rule's call: its arguments bound by PyTorch's names, then the op's hook or the general layer."""
        op, positional = BY_FUNCTION.get(call.function, SIGNATURES[call.name])
        bound = self.bind(call, positional)
        if bound is None:
            return
        if op in ("add", "sub", "mul", "div") and (
            self.fold_constants(op, bound, call) or integer_identity(self, op, bound, call)
        ):
            return
        if op in ("add", "mul") and not isinstance(bound["input"], torch.Tensor):
            bound["input"], bound["other"] = bound.get("other"), bound["input"]  # torch.mul(0.5, x): commutes
        hook = dispatch.OP_HOOKS.get(op)
        if hook is None:
            self.layer(op, bound, call)
        else:
            hook(self, op, bound, call)

    def function_checked(self, call: Call, applied: Applied) -> bool:
        """Whether the call, run in a custom ``autograd.Function``'s forward, is traced as any other: where
        that Function's own backward was checked equal to its forward's derivative (``custom_functions``,
        noted in ``checked_functions``); otherwise refused at its forward's first call, and what the
        Function's outputs feed carries that refusal."""
        if id(applied) not in self.function_refusals:
            found = check(applied)
            if not found.refusal:
                self.checked_functions.setdefault(applied.name, []).append(found)
                self.function_refusals[id(applied)] = None
            else:
                problem = Problem(
                    call.where,
                    call.module,
                    call.name,
                    f"runs in the forward of the torch.autograd."
                    f"Function {applied.name}, whose own backward {found.refusal} (float64, random "
                    f"arguments {found.shapes} and cotangent), which the explicit backward would not "
                    "follow: it differentiates the forward's ops",
                    "write the Function's math as torch "
                    "ops in the model, or make its backward its forward's derivative, or train that "
                    "model with autograd",
                )
                self.problems.append(problem)
                self.function_refusals[id(applied)] = len(self.problems) - 1
        index = self.function_refusals[id(applied)]
        if index is None:
            return True
        inherited = [
            self.poison[id(value)]
            for value in flat_arguments(call.arguments, call.keywords)
            if isinstance(value, torch.Tensor) and id(value) in self.poison
        ]
        self.taint(call.result, frozenset({index}).union(*inherited))
        return False

    def function_refusal(self, error: TraceError) -> TraceError:
        """``error`` (the loss's or the outputs' problems) as a :class:`Refusal` where the second run
        (``quiet``) reports a custom Function's refusal in it: one found at other sizes alone, which the
        second run would otherwise take for a model that does not run at those sizes."""
        lines = {self.problems[index].where for index in self.function_refusals.values() if index is not None}
        if self.quiet and any(f"{where}: error: " in str(error) for where in lines):
            return Refusal(str(error))
        return error

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
            self.problems.append(
                Problem(
                    call.where,
                    call.module,
                    call.name,
                    "reads a reshape of an int64 input, which only indexing (x[:, idx]) reads",
                    "pass the int64 input as it is (cross_entropy takes labels [N, ...])",
                )
            )
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
                    self.problems.append(
                        Problem(
                            call.where,
                            call.module,
                            call.name,
                            "reads a tensor that is neither an argument, a parameter or buffer of "
                            "the model, a module-level tensor, nor the result of a traced call",
                            "pass it to the traced function as an argument",
                        )
                    )
                    found = frozenset({len(self.problems) - 1})
                elif -2 in found and (name := loss_tail.reduction_layers(self, value, call)) is not None:
                    return name  # w.sum() read on by the network: layers, not a loss
                elif -2 in found:
                    self.problems.append(
                        Problem(call.where, call.module, call.name, *loss_tail.read_on_problem(self, value, call))
                    )
                    found = frozenset({len(self.problems) - 1})
                reasons.update(found)
                return None
            if value.dim() == 0 and found in self.source_names:  # timm's skipinit gain, nn.Parameter(torch.tensor(0.))
                self.problems.append(
                    Problem(
                        call.where,
                        call.module,
                        call.name,
                        f"reads '{found}', a 0-dim parameter or buffer, which a spec cannot hold "
                        "(its tensors have 1 to 8 dims)",
                        "make it a one-element tensor, e.g. nn.Parameter(torch.zeros(1)): it broadcasts the same way",
                    )
                )
                reasons.add(len(self.problems) - 1)
                return None
            return found
        return literal(value) if is_number(value) else value  # a size the code read (h * x.shape[1]): its number

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
            if operand.from_in and not (operand.constant_ok and is_number(value)):
                sources += named
            else:
                layer[operand.name] = named[0]
            for original, item in zip(values, named):
                if not isinstance(original, torch.Tensor) and not (operand.constant_ok and is_number(original)):
                    self.fail(call, f"argument '{operand.name}' is {original!r}, not a tensor", "pass a tensor", op)
                    return
        if reasons:
            self.taint(call.result, frozenset(reasons))
            return
        if sources:
            layer = {
                "op": op,
                "in": sources[0] if len(sources) == 1 else sources,
                **{key: value for key, value in layer.items() if key != "op"},
            }
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

    def alias(self, call: Call, source: torch.Tensor) -> None:
        """The result is the source's value under a new tensor object."""
        reasons: set[int] = set()
        found = self.operand(source, call, reasons)  # an unknown tensor becomes a problem at this call
        self.kept.append(call.result)
        if reasons:
            self.taint(call.result, frozenset(reasons))
        else:
            self.names[id(call.result)] = name_last_part(self, call, source, found)

    def part(self, call: Call, name: str, tensor: torch.Tensor, *arguments: int, result: Any = None) -> torch.Tensor:
        """One layer of a call that becomes several (``x[:, 0, None]``): ``name`` applied to ``tensor``."""
        function = getattr(torch, name)
        result = function(tensor, *arguments) if result is None else result
        self.add(Call(name, function, (tensor, *arguments), {}, result, call.where, call.module, call.leaf))
        return result

    def unknown(self, call: Call) -> None:
        if call.name in RANDOM:  # timm's drop_path: x.new_empty(...).bernoulli_(keep) in training mode
            return self.fail(
                call,
                "draws random numbers, which a spec cannot hold (stochastic depth and dropout "
                "are random in training mode only)",
                "trace the model in eval mode (--eval), or turn the randomness off (drop_path_rate=0)",
            )
        tensors = [a for a in flat_arguments(call.arguments, call.keywords) if isinstance(a, torch.Tensor)]
        reads_traced = any(id(t) in self.names or id(t) in self.poison or id(t) in self.sources for t in tensors)
        what = (
            "is not an op symgrad can differentiate"
            if reads_traced
            else "creates a tensor inside the traced code, which a spec cannot hold"
        )
        fix = FIXES.get(
            call.name,
            "write it with the ops `symgrad ops` lists"
            if reads_traced
            else "pass the tensor to the traced function as an argument",
        )
        self.fail(call, what, fix)


def refuse_method_hooks(builder_class: type) -> None:
    """Refuse a method named ``_<op>`` for a rule's op: the walk once found hooks by that name, and no
    longer calls one (``dispatch.OP_HOOKS`` does), so such a method would be dropped without a word."""
    stray = sorted(name for name in vars(builder_class) if name.startswith("_") and name[1:] in LAYER_RULES)
    if stray:
        raise ImportError(
            f"{builder_class.__name__} has per-op methods that nothing calls: {', '.join(stray)} (fix: "
            "move each into symgrad/trace/op_hooks.py as hook(builder, op, bound, call) under @op_hook(op))"
        )


refuse_method_hooks(SpecBuilder)

PRE_CHECKS = (
    ("random mask", random_masks.random_mask),
    ("constant", SpecBuilder.constant),
    ("no_grad", SpecBuilder.no_grad),
    ("custom Function", SpecBuilder.custom_function),
    ("loss scale", loss_tail.scale_reduction),
    ("int64 index view", index_view),
)
"""What the walk asks of every call before the table, in order: ``check(builder, call)`` is True where it
took the call (a mask being drawn, a constant, a no_grad value, a refused custom Function's forward, a
loss scaled after its reduction, a reshape of an int64 input)."""

HANDLER_MODULES = (attention, embedding, op_hooks, random_masks, views, loss_tail)
"""The modules whose decorators fill the table, imported before it is built."""

TABLE = dispatch.table(SpecBuilder.rule_call, lambda builder, call: loss_tail.loss_call(builder, call.name, call))
"""Recorded call name -> ``handler(builder, call)``: every rule's and loss's ``calls`` and the registered
handlers (``dispatch.py``)."""
