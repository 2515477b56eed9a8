"""What ``symgrad generate --keep lean`` makes again in the backward instead of keeping it.

Between the schedule and the deletions of :func:`symgrad.schedule.schedule`: a value the backward reads
(a convolution's or linear map's input, for its weight gradient; a ReLU's output, for its own
pullback) that the forward made from what the saving forward keeps anyway by cheap elementwise steps
is not kept: the backward makes it again right before the first line that reads it, and frees it
at its last read. The steps, each bit for bit the forward's value:

- a training-mode batch norm's output, from its input and the batch mean and 1 / std its backward
  reads anyway (``_batch_norm_again``: the CPU kernel's own ``input * alpha + beta``, by the same
  kernel in eval mode fed alpha, one pass in the input's dtype, or the forward's kernel again;
  tests/pipeline/test_rematerialization.py checks it bitwise);
- a layer norm's, group norm's or instance norm's output (a ViT's or ConvNeXt's LayerNorm before
  a linear map), from its input, weight and bias, which its backward reads anyway: the fused call
  again (``torch.native_layer_norm``, ``_group_norm``, ``_instance_norm``: no state, the same kernel
  on the same input, bit for bit); the policy for each normalisation is :data:`NORMALISED`;
- an activation (``Primitive.recomputable``: ReLU, SiLU, GELU, hardswish, ...) of such a value: the
  same kernel on the same input (an activation of a value kept anyway, a ViT MLP's GELU of its
  first linear map's output, which GELU's backward reads, is made again already with ``--keep
  all``: ``schedule._recomputed``); one whose recompute is costly (``Primitive.costly_to_recompute``:
  SiLU's exp per element) only where it is among the step's largest values (:func:`costly_made_again`),
  else kept as ``--keep all`` keeps it;
- the sum of two such values, or of one and a kept value (a residual block's ``bn2 + identity``):
  one rounding, whichever term comes first;
- a concatenation or an interpolation (:data:`REARRANGED`) of such values or of kept ones (a U-Net's
  decoder input, ``torch.cat([skip, F.interpolate(up)])``): the same copy, the same resampling kernel.

A value is made again only from values that stay anyway (the forward's inputs and parameters, what
the backward reads for other reasons), never from another value made again (no chains: in a stage
of residual blocks every other block's output stays, and the next one is made from it), but for a
:data:`REARRANGED` value, which reads such a value where it is made (its recipe is emitted first).
"""

from __future__ import annotations

import dataclasses
import math

import sympy

from .algebra import TensorOp, op
from .kept import VIEWS
from .reverse import Statement

COMMENT = "made again (--keep lean): not kept by the forward"

REARRANGED = ("cat", "interpolate")
"""Values made again from their operands by the same kernel (a copy, a fixed resampling: bit for bit),
an operand made again by another recipe read from it (a U-Net's ``torch.cat([skip, F.interpolate(up)])``,
the decoder convolution's input, from two batch norms' activations)."""
NORMALISED = {
    "native_batch_norm": "statistics",
    "native_layer_norm": "kernel",
    "native_group_norm": "kernel",
    "native_instance_norm": "kernel",
}
"""The policy for a normalisation's output (entry 0 of its fused call): ``statistics``, a training-mode
batch norm's, from its input and the batch mean and 1 / std (``_batch_norm_again``: the kernel itself
would move the running statistics a second time); ``kernel``, the fused call again on the same input,
weight and bias (no state, the same kernel in the same order: bit for bit; the statistics it returns
again are dropped, the kept ones stay)."""


LARGEST_SHARE = 0.5
"""--keep lean makes a costly activation's output again only where it holds at least this share of the
elements of the largest value the step's backward reads (:func:`costly_made_again`)."""


def costly_made_again(forward: list[Statement], backward: list[Statement], graph=None) -> set:
    """The outputs of costly activations (``Primitive.costly_to_recompute``: SiLU's, an exp per
    element) that ``--keep lean`` makes again in the backward: those of at least :data:`LARGEST_SHARE`
    of the elements of the largest forward value the backward reads (a node's own output, at the
    traced sizes of ``graph``); the smaller ones are kept, as ``--keep all`` keeps them. A lean step's
    peak is where its largest values live together (the widest layer's backward: EfficientNet's
    expanded 48 x 56² SiLU output beside its convolution's output, which the batch norm's backward
    keeps anyway); a smaller output costs its recompute (on one thread ~0.28 ms per MB of bfloat16,
    1.3x silu_backward's own time) for bytes that mostly do not reach that peak (EfficientNet-B0's
    stages at 8 x 112² under AMP, at aa46d03: the peak 16.3 -> 16.7 MiB in the default layout, 17.1 ->
    18.9 in channels_last, against autograd's 25.2 and 28.5; one thread's step 0.937x -> 0.974x
    autograd's in the default layout, 0.932x -> 0.957x in channels_last: medians of six alternating runs).
    A block's body (shared by instances of several sizes) is given its largest instance's sizes and the
    network's largest value (``body_graphs.instance_sizes``: one choice for every instance, kept where
    every instance's output is small beside the network's largest, as the flat module keeps it); without
    ``graph`` every costly output the backward reads is made again."""
    read = set().union(*(statement.value.free_symbols for statement in backward))
    costly = {
        statement.target
        for statement in forward
        if statement.target in read
        and isinstance(statement.value, TensorOp)
        and statement.value.primitive.costly_to_recompute
    }
    if graph is None or not costly:
        return costly
    sizes = {
        statement.target: _elements(graph, statement)
        for statement in forward
        if statement.target in read and statement.target.name == statement.node
    }
    largest = getattr(graph, "largest", None) or max(
        (size for size in sizes.values() if size is not None), default=None
    )
    if largest is None:
        return costly
    return {symbol for symbol in costly if sizes.get(symbol) is None or sizes[symbol] >= LARGEST_SHARE * largest}


def _elements(graph, statement: Statement) -> int | None:
    """The elements of ``statement``'s value at ``graph``'s traced sizes; None where unknown."""
    node = graph.nodes.get(statement.node)
    shape = getattr(node, "shape", None)
    if not shape or not all(isinstance(size, int) for size in shape):
        return None
    return math.prod(shape)


def rebuilt(
    forward: list[Statement], backward: list[Statement], kept_by_caller: set
) -> tuple[list[Statement], list[str]]:
    """``backward`` with each value it reads from ``forward`` that can be made again from what stays
    anyway made right before its first read (``kept_by_caller``: the loss's inputs and outputs,
    which stay whole); also the names of the values no longer kept."""
    made = {statement.target: statement for statement in forward}
    entries = _entries(forward)
    read = set().union(*(statement.value.free_symbols for statement in backward))
    made_back = {statement.target for statement in backward}
    kept = {symbol for symbol in read - made_back if symbol in made}
    viewed = _viewed(forward, kept)
    # a value the backward makes itself (plan._recomputed's activation) or another recipe makes
    # already is made once: no second recipe reads it
    claimed = set(made_back)
    recipes: dict[sympy.Symbol, list[Statement]] = {}
    for statement in forward:  # in forward order: a value made again never feeds another one
        target = statement.target
        if target not in kept or target in kept_by_caller or target in viewed:
            continue
        recipe = _recipe(target, made, entries, kept - {target}, claimed | set(recipes), set(recipes))
        if recipe:
            recipes[target] = recipe
            kept.discard(target)
            claimed |= {part.target for part in recipe}
    names = [symbol.name for symbol in recipes]
    result: list[Statement] = []

    def emit(symbol):  # a recipe after those of the values made again that it reads (a REARRANGED one's)
        recipe = recipes.pop(symbol)
        reads = set().union(*(part.value.free_symbols for part in recipe)) - {part.target for part in recipe}
        for other in sorted(reads & recipes.keys(), key=str):
            emit(other)
        result.extend(recipe)

    for statement in backward:
        for symbol in sorted(statement.value.free_symbols & recipes.keys(), key=str):
            if symbol in recipes:
                emit(symbol)
        result.append(statement)
    return result, names


def _viewed(forward: list[Statement], kept: set) -> set:
    """The forward values a view of which (or a view of a view) stays: making one again frees
    nothing."""
    views = {}
    for statement in forward:
        value = statement.value
        if isinstance(value, TensorOp) and value.primitive.name in VIEWS and value.operands[0].is_Symbol:
            views.setdefault(value.operands[0], set()).add(statement.target)
    viewed: set = set()
    for statement in reversed(forward):
        if views.get(statement.target, set()) & (kept | viewed):
            viewed.add(statement.target)
    return viewed


def _entries(forward: list[Statement]) -> dict:
    """{(tuple symbol, index): the symbol naming that entry} for each ``t = fused[i]``."""
    entries = {}
    for statement in forward:
        value = statement.value
        if isinstance(value, TensorOp) and value.primitive.name == "item" and value.operands[0].is_Symbol:
            entries[(value.operands[0], value.params["index"])] = statement.target
    return entries


def _recipe(symbol, made: dict, entries: dict, kept: set, rebuilt: set, ready: set) -> list[Statement] | None:
    """The statements that make ``symbol`` again from ``kept`` values and inputs, in order; None
    where some step is not a cheap exact one or reads a value neither kept nor cheaply made
    (``rebuilt``: the values made in the backward already, by another recipe or as its own, which
    none is made from, but a :data:`REARRANGED` value from ``ready``, the values other recipes make:
    their recipes are emitted before its; not a value the backward makes itself, whose place is its
    own first read, nor a step inside another recipe, which that recipe may overwrite)."""
    if symbol not in made or symbol in kept:
        return []  # an input or a parameter, which the caller passes again, or a value that stays
    if symbol in rebuilt:
        return None
    statement = made[symbol]
    value = statement.value
    if isinstance(value, sympy.Add):
        terms = value.args
        if len(terms) != 2 or not all(term.is_Symbol for term in terms):
            return None  # a sum of three rounds in the order the forward added: not made again
        steps = [_recipe(term, made, entries, kept, rebuilt, ready) for term in terms]
    elif isinstance(value, TensorOp) and value.primitive.name in REARRANGED:
        if not all(operand.is_Symbol for operand in value.operands):
            return None
        # an operand made again by another recipe is read from it (emitted first), not made twice
        steps = [_recipe(operand, made, entries, kept | ready, rebuilt, ready) for operand in value.operands]
    elif (
        isinstance(value, TensorOp)
        and value.primitive.recomputable
        and not value.primitive.costly_to_recompute  # schedule._recomputed's choice (costly_made_again)
        and len(value.operands) == 1
    ):
        if not value.operands[0].is_Symbol:
            return None
        steps = [_recipe(value.operands[0], made, entries, kept, rebuilt, ready)]
    elif isinstance(value, TensorOp) and value.primitive.name == "item" and value.params["index"] == 0:
        native = value.operands[0]
        call = made[native].value if native in made else None
        how = NORMALISED.get(call.primitive.name) if isinstance(call, TensorOp) else None
        if how is None or native in rebuilt:
            return None
        if how == "statistics":  # a batch norm: its output from its input and batch statistics
            again = _batch_norm_again(native, call, entries, kept)
            if again is None:
                return None
            statement = dataclasses.replace(statement, value=again)
            steps = [_recipe(operand, made, entries, kept, rebuilt, ready) for operand in again.operands]
        else:  # the same kernel on the same input: the tuple again, its output read from it
            if not all(operand.is_Symbol for operand in call.operands):
                return None
            steps = [_recipe(operand, made, entries, kept, rebuilt, ready) for operand in call.operands]
            steps.append([dataclasses.replace(made[native], comment=COMMENT)])
    else:
        return None
    if any(step is None for step in steps):
        return None
    made_again = [part for step in steps for part in step]
    return made_again + [dataclasses.replace(statement, comment=COMMENT)]


def _batch_norm_again(native, call: TensorOp, entries: dict, kept: set):
    """``batch_norm_again(input, weight, bias, mean, invstd)`` for ``native[0]``, where ``native``
    is the training-mode ``native_batch_norm`` ``call`` whose batch mean and 1 / std stay anyway;
    else None."""
    mean, invstd = entries.get((native, 1)), entries.get((native, 2))
    if mean not in kept or invstd not in kept:
        return None
    named = dict(zip(call.params["operand_names"], call.operands))
    names = tuple(name for name in ("input", "weight", "bias") if name in named)
    names += ("mean", "invstd")
    operands = [named[name] for name in names if name in named] + [mean, invstd]
    if not all(operand.is_Symbol for operand in operands):
        return None
    return op("batch_norm_again", *operands, operand_names=names, eps=call.params["eps"])
