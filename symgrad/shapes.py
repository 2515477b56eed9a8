"""Small input shapes consistent with a spec, for float64 checks, gradcheck and gradgradcheck.

The spec's example shapes are often far too large for finite differences (the seed's ``x`` has
4 million entries). Here every input size becomes a sympy symbol and the rules' own shape inference
runs on the symbols, recording its equalities (``x.shape[1] == w1.shape[1] * groups``). Equalities
of a lone symbol are solved by substitution; what remains free is shrunk by coordinate descent, one
size at a time, checking each candidate with the ordinary numeric inference. A size of 2 or more in
the spec stays at 2 or more in every node, so strides still stride and kernels still slide.

A second configuration, with each free size grown a little, shows that the generated code is
shape-generic (it usually also makes a strided conv's ``output_padding`` non-zero).
"""

from __future__ import annotations

import math
from fractions import Fraction

import sympy

from .errors import SpecError
from .graph import Graph, sized
from .rules.base import Checker

DESCENT_WORK = 40_000
"""Single-size trials times graph nodes the shrinking may spend: hundreds of trials for a small
network, fewer for a long chain, so the time stays linear in the graph's size."""


ROUNDING = (sympy.floor, sympy.ceiling, sympy.Mod, sympy.Min, sympy.Max, sympy.Piecewise)
"""Functions sympy.solve cannot invert in closed form but may spend seconds trying (nested floors of
strided convs): equalities holding them stay unsolved, and each candidate is checked numerically."""


def _linear_solution(difference: sympy.Expr) -> tuple[sympy.Symbol | None, sympy.Expr | None]:
    """A symbol that ``difference == 0`` fixes, with its value, where the equation is linear in it with
    a constant coefficient (the sizes' equalities are sums and products of sizes): no search, no solve."""
    difference = sympy.expand(difference)
    for symbol in sorted(difference.free_symbols, key=str):
        coefficient = difference.diff(symbol)
        if coefficient.is_number and coefficient != 0:
            value = sympy.expand(symbol - difference / coefficient)
            if symbol not in value.free_symbols:
                return symbol, value
    return None, None


ABBREVIATE = 40
"""A symbolic size of more tree nodes than this is named by a fresh symbol for the nodes that read it.
A conv chain's spatial size grows a term per layer (``x_2 + 3 - w0_2 + 3 - w1_2 ...``): built out in
full, inferring N layers costs N**2 and sympy's ``Add`` sorting on top. Sizes are expanded again only
where an equality reads them, so a plain chain never pays, and results are the same either way."""


def _tree_size(expr: sympy.Expr, limit: int) -> int:
    """Tree nodes of ``expr``, counting stops past ``limit`` (so this costs at most ``limit`` steps)."""
    count = 0
    for _ in sympy.preorder_traversal(expr):
        count += 1
        if count > limit:
            break
    return count


def _tied_sizes(
    graph: Graph, node_shapes: dict | None = None, wanted: tuple[str, ...] | None = None
) -> tuple[dict[sympy.Symbol, sympy.Expr], list[sympy.Symbol]]:
    """Solve the ops' size equalities; ``node_shapes``, if given, receives the symbolic shape of every
    node named in ``wanted`` (default: every node). Solved once per graph (a build asks up to five
    times: the tests' shapes, the non-degenerate ones, the model check's, the batch inputs), and kept
    in the graph as its consumer index is, for as long as its nodes are the same."""
    kept = graph.__dict__.get("_tied_sizes")
    if kept is None or kept[0] is not graph.nodes or kept[1] != len(graph.nodes):
        kept = graph.__dict__["_tied_sizes"] = (graph.nodes, len(graph.nodes), *_solve_tied_sizes(graph))
    substitution, free, shapes_of = kept[2:]
    if node_shapes is not None:
        node_shapes.update(shapes_of(wanted))
    return dict(substitution), list(free)


def fixed_size(graph: Graph, name: str, axis: int) -> int | None:
    """Node ``name``'s size along ``axis`` where the spec fixes it at every size of its inputs (a reshape's
    literal 3), else None; None too where the sizes cannot be solved symbolically (asked once per graph)."""
    if graph.__dict__.get("_sizes_unsolved") is graph.nodes:
        return None
    symbolic: dict = {}
    try:
        _tied_sizes(graph, symbolic, (name,))
    except SpecError:  # a block's body not inferable at symbolic sizes
        graph.__dict__["_sizes_unsolved"] = graph.nodes
        return None
    size = sympy.sympify(symbolic[name][axis])
    return int(size) if size.is_Integer else None


def _solve_tied_sizes(graph: Graph):
    """:func:`_tied_sizes`' work: (the substitution, the free symbols, a function from the wanted
    node names to their symbolic shapes)."""
    symbols = {}
    shapes = {}
    for node in graph.inputs:
        shapes[node.name] = tuple(
            symbols.setdefault((node.name, axis), sympy.Symbol(f"{node.name}_{axis}", positive=True, integer=True))
            for axis in range(len(node.shape))
        )
    definitions: dict[sympy.Symbol, sympy.Expr] = {}
    """Abbreviations: each fresh symbol's value in the input sizes and earlier abbreviations."""

    def abbreviated(size):
        if isinstance(size, sympy.Basic) and not size.is_Atom and _tree_size(size, ABBREVIATE) > ABBREVIATE:
            symbol = sympy.Dummy(f"size{len(definitions)}")
            definitions[symbol] = size
            return symbol
        return size

    written_out: dict[sympy.Symbol, sympy.Expr] = {}

    def write_out(symbol: sympy.Symbol) -> sympy.Expr:
        """An abbreviation in input sizes. The terms of nested sums are gathered and added once: adding
        them level by level would rebuild a growing sum at every level, again N**2 for a chain."""
        if symbol not in written_out:
            terms, stack = [], [symbol]
            while stack:
                value = definitions[stack.pop()]
                for term in value.args if value.is_Add else (value,):
                    if term in definitions:
                        stack.append(term)
                    else:
                        terms.append(expanded(term))
            written_out[symbol] = sympy.Add(*terms)
        return written_out[symbol]

    def expanded(expr: sympy.Expr) -> sympy.Expr:
        inner = [symbol for symbol in expr.free_symbols if symbol in definitions]
        return expr.xreplace({symbol: write_out(symbol) for symbol in inner}) if inner else expr

    constraints = []
    for node in graph.nodes.values():
        if node.kind == "input":
            continue
        check = Checker(node.location, node.rule.op, symbolic=True)
        shapes[node.name] = tuple(
            abbreviated(size)
            for size in node.rule.infer_shape(
                {operand: shapes[source] for operand, source in node.operands.items()},
                sized(node.params, lambda name: shapes[name]),
                check,
            )
        )
        constraints += check.constraints
    substitution: dict[sympy.Symbol, sympy.Expr] = {}

    def resolve(expr: sympy.Expr) -> sympy.Expr:  # substitutions are chained, never rewritten
        while True:
            replaced = expr.xreplace(substitution)
            if replaced == expr:
                return expr
            expr = replaced

    at_spec = {symbols[(node.name, axis)]: size for node in graph.inputs for axis, size in enumerate(node.shape)}
    for left, right in constraints:
        left, right = expanded(sympy.sympify(left)), expanded(sympy.sympify(right))
        if left.xreplace(at_spec) != right.xreplace(at_spec):
            # no tie: a broadcast whose one side is 1 in the spec (a gate's one channel times C), and stays 1
            for side in (left, right):
                if side.is_Symbol and at_spec.get(side) == 1 and side not in substitution:
                    substitution[side] = sympy.Integer(1)
            continue
        left, right = resolve(left), resolve(right)
        if left == right:
            continue
        solved = value = None
        if left.is_Symbol and left not in right.free_symbols:
            solved, value = left, right
        elif right.is_Symbol and right not in left.free_symbols:
            solved, value = right, left
        elif not (left - right).has(*ROUNDING):  # e.g. x_2 == x_2 - w_2 + 3: a residual add fixes the kernel size
            solved, value = _linear_solution(left - right)
        if solved is None:
            continue  # checked numerically for each candidate
        substitution[solved] = value
    substitution = {symbol: resolve(value) for symbol, value in substitution.items()}

    def shapes_of(wanted: tuple[str, ...] | None) -> dict[str, tuple]:
        return {
            name: tuple(resolve(expanded(sympy.sympify(size))) for size in shape)
            for name, shape in shapes.items()
            if wanted is None or name in wanted
        }

    free = [symbol for symbol in symbols.values() if symbol not in substitution]
    return substitution, free, shapes_of


LAMBDIFY_TERMS = 100
"""A size that sums more terms than this is evaluated term by term, not compiled by lambdify."""


def _size_functions(graph: Graph, substitution, free):
    """For each input, one function per axis from the free sizes (a dict) to that size."""
    functions = {}
    for node in graph.inputs:
        functions[node.name] = []
        for axis in range(len(node.shape)):
            symbol = sympy.Symbol(f"{node.name}_{axis}", positive=True, integer=True)
            expr = sympy.sympify(substitution.get(symbol, symbol))
            if expr.is_Symbol:
                functions[node.name].append(lambda values, s=expr: values[s])
            elif expr.is_number:
                functions[node.name].append(lambda values, e=int(expr): e)
            elif (
                expr.is_Add
                and len(expr.args) > LAMBDIFY_TERMS
                and all(
                    (term.is_Symbol or term == 1) and coefficient.is_Rational
                    for term, coefficient in expr.as_coefficients_dict().items()
                )
            ):
                # a deep chain's sum of sizes: Python's compiler recurses once per term of lambdify's source
                terms = [
                    (
                        term if term.is_Symbol else None,
                        int(coefficient)
                        if coefficient.is_Integer
                        else Fraction(int(coefficient.p), int(coefficient.q)),
                    )
                    for term, coefficient in expr.as_coefficients_dict().items()
                ]
                functions[node.name].append(
                    lambda values, t=terms: sum(
                        coefficient * (1 if term is None else values[term]) for term, coefficient in t
                    )
                )
            else:
                arguments = sorted(expr.free_symbols, key=str)
                try:
                    compiled = sympy.lambdify(arguments, expr, modules="math")
                except RecursionError:  # too deep for Python's compiler: substituted instead (slower)
                    functions[node.name].append(
                        lambda values, e=expr, a=arguments: e.xreplace({s: sympy.Integer(values[s]) for s in a})
                    )
                    continue
                functions[node.name].append(lambda values, f=compiled, a=arguments: f(*(values[s] for s in a)))
    return functions


def _shapes_for(functions, free, values: dict[sympy.Symbol, int]) -> dict[str, tuple[int, ...]] | None:
    shapes = {}
    for name, axes in functions.items():
        shape = []
        for function in axes:
            try:
                size = function(values)
            except ZeroDivisionError:  # a size that divides by another, at a trial where that one is 0
                return None
            if size != int(size) or size < 1:
                return None
            shape.append(int(size))
        shapes[name] = tuple(shape)
    return shapes


MIN_STATISTIC = 8
"""Entries each normalisation statistic must see at the test shapes (or as many as at the spec's):
a batch_norm over 2 values is all rounding, and no test of anything."""


def _statistic_size(graph: Graph, node) -> int | None:
    shapes = {operand: graph.nodes[source].shape for operand, source in node.operands.items()}
    return node.rule.elements_per_statistic(shapes, node.params)


LARGEST_TEST_NODE = 2**18
"""Entries (2 MiB in float64) no node may exceed at the test shapes unless it has more at the spec's.
Shrunk kernels can grow what they slide over: 3x3 kernels (padding 1) shrunk to 2 grow the image a
pixel a layer. A 200-conv chain's test carries that (every input 2 x 2 x 2 x 2 but the target,
202 x 202); a 5,000-conv chain's (growing to 5,002 x 5,002) could not, and keeps its 3x3 kernels
but for the few that the descent's budget shrinks (a 5 x 5 image). Refusing any node larger than
at the spec's shapes instead mixed 2x2 and 3x3 kernels and 2 and 3 channels in every chain of
over 6 convs, where gradgradcheck then crossed ReLU kinks."""


def _valid(graph: Graph, shapes, floors: dict[str, int] | None = None) -> bool:
    """Whether ``shapes`` fit the ops and keep every size of 2 or more at 2 or more, every node within
    ``LARGEST_TEST_NODE`` entries (or its entries at the spec's shapes) and every normalisation's
    statistics over enough entries (``floors``: {node: entries}; default: ``MIN_STATISTIC`` or the
    spec's, where fewer)."""
    if shapes is None:
        return False
    try:
        resized = graph.with_input_shapes(shapes)
    except SpecError:
        return False
    for name, node in resized.nodes.items():
        original = graph.nodes[name].shape
        if any(new < 2 <= old for new, old in zip(node.shape, original)):
            return False
        if math.prod(node.shape) > max(LARGEST_TEST_NODE, math.prod(original)):
            return False
        if node.rule is not None:
            size = _statistic_size(resized, node)
            if size is None:
                continue
            floor = floors[name] if floors is not None and name in floors else None
            if size < (floor or min(MIN_STATISTIC, _statistic_size(graph, graph.nodes[name]))):
                return False
    return True


def small_shapes(graph: Graph) -> list[dict[str, tuple[int, ...]]]:
    """Two small, different, consistent sets of input shapes (falling back to the spec's own); found
    once per graph, as :func:`_tied_sizes` is (the pipeline and :func:`non_degenerate_shapes` ask)."""
    kept = graph.__dict__.get("_small_shapes")
    if kept is None or kept[0] is not graph.nodes or kept[1] != len(graph.nodes):
        kept = graph.__dict__["_small_shapes"] = (graph.nodes, len(graph.nodes), _small_shapes(graph))
    return [dict(shapes) for shapes in kept[2]]


def _small_shapes(graph: Graph) -> list[dict[str, tuple[int, ...]]]:
    substitution, free = _tied_sizes(graph)
    functions = _size_functions(graph, substitution, free)
    spec_sizes = {
        sympy.Symbol(f"{node.name}_{axis}", positive=True, integer=True): size
        for node in graph.inputs
        for axis, size in enumerate(node.shape)
    }
    values = {symbol: spec_sizes[symbol] for symbol in free}
    if not _valid(graph, _shapes_for(functions, free, values)):
        spec_shapes = {node.name: node.shape for node in graph.inputs}
        return [spec_shapes, spec_shapes]
    values, floors = _batch_grown(graph, functions, free, values)
    # first shrink every free size together (cheap), then one size at a time within a fixed
    # budget of trials, so that long chains stay linear in time and the result is deterministic
    for ceiling in (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64):
        trial = {symbol: min(value, ceiling) for symbol, value in values.items()}
        if _valid(graph, _shapes_for(functions, free, trial), floors):
            values = trial
            break
    budget = max(20, DESCENT_WORK // len(graph.nodes))
    for _ in range(3):
        changed = False
        for symbol in free:
            for candidate in range(1, values[symbol]):
                if budget <= 0:
                    break
                budget -= 1
                trial = {**values, symbol: candidate}
                if _valid(graph, _shapes_for(functions, free, trial), floors):
                    values, changed = trial, True
                    break
        if not changed or budget <= 0:
            break
    grown = dict(values)
    budget = max(20, DESCENT_WORK // len(graph.nodes))
    for index, symbol in enumerate(free):  # grow each size a little where the ops allow it
        if budget <= 0:  # a long chain: the rest grow together, by one, if the ops allow it
            trial = {**grown, **{rest: grown[rest] + 1 for rest in free[index:]}}
            if _valid(graph, _shapes_for(functions, free, trial), floors):
                grown = trial
            break
        for growth in (1, 2, 3):
            budget -= 1
            trial = {**grown, symbol: grown[symbol] + growth}
            if _valid(graph, _shapes_for(functions, free, trial), floors):
                grown = trial
                break
    return [_shapes_for(functions, free, values), _shapes_for(functions, free, grown)]


LARGEST_TEST_BATCH = 16
"""The batch :func:`_batch_grown` may grow the tests' shapes to (from the spec's)."""


def _batch_grown(graph: Graph, functions, free, values: dict) -> tuple[dict, dict[str, int] | None]:
    """``values`` (the spec's sizes) with the batch grown, where a train-mode normalisation over
    the batch sees fewer than ``MIN_STATISTIC`` entries at the spec's shapes, to the least batch at
    which each such one sees ``MIN_STATISTIC`` (at most ``LARGEST_TEST_BATCH``); with the entries
    each normalisation must then keep ({node: entries}, for :func:`_valid`). A network traced at
    batch 2 whose last maps are 1x1 normalises two values a channel there: its output is +-1 (times
    the scale) by the sign of their difference d, with derivative eps / (d^2 + eps)^(3/2): about 0,
    but 1/sqrt(eps) within sqrt(eps) of a tie. A stack of them is a step function, where finite
    differences measure nothing and rounding is amplified by orders of magnitude (timm's RegNet,
    LeViT at batch 2: autograd's gradients and the explicit ones fail gradcheck alike, with the same
    analytical value). ``values`` unchanged (and None) where no normalisation is that small or none
    grows with the batch."""

    def statistics(shapes) -> dict[str, int]:
        resized = graph.with_input_shapes(shapes)
        return {
            name: size
            for name, node in resized.nodes.items()
            if node.rule is not None and (size := _statistic_size(resized, node)) is not None
        }

    shapes = _shapes_for(functions, free, values)
    at_spec = statistics(shapes)
    small = {name: size for name, size in at_spec.items() if size < MIN_STATISTIC}
    sources = {item.name for item in graph.spec.inputs if item.source}
    data = [node.name for node in graph.inputs if node.name not in sources and node.shape]
    # the batch: the free size that moves the first axis of the data inputs (if exactly one does)
    symbols = []
    for symbol in free:
        moved = _shapes_for(functions, free, {**values, symbol: values[symbol] + 1})
        if moved and any(moved[name][0] != shapes[name][0] for name in data):
            symbols.append(symbol)
    if not small or len(symbols) != 1:
        return values, None
    batch, size = symbols[0], values[symbols[0]]
    doubled = _shapes_for(functions, free, {**values, batch: 2 * size})
    try:
        doubled = statistics(doubled) if doubled else {}
    except SpecError:
        return values, None
    per_sample = {name: at_spec[name] / size for name in small if doubled.get(name) == 2 * at_spec[name]}
    if not per_sample:
        return values, None
    wanted = min(LARGEST_TEST_BATCH, max(size, *(math.ceil(MIN_STATISTIC / each) for each in per_sample.values())))
    trial = {**values, batch: wanted}
    if wanted == size or not _valid(graph, _shapes_for(functions, free, trial)):
        return values, None
    grown = statistics(_shapes_for(functions, free, trial))
    return trial, {name: min(MIN_STATISTIC, grown[name]) for name in grown}


def batch_inputs(graph: Graph) -> list[str]:
    """The inputs whose dim 0 is the per-sample loss's batch axis: tied to it by the ops' own size
    rules, and of the batch size in the spec (a broadcast operand of size 1 is tied but is no batch)."""
    node_shapes: dict[str, tuple] = {}
    _tied_sizes(graph, node_shapes, ("loss", *(node.name for node in graph.inputs)))
    if not node_shapes.get("loss"):
        return []
    batch, batch_size = node_shapes["loss"][0], graph.loss.shape[0]
    return [node.name for node in graph.inputs if node_shapes[node.name][0] == batch and node.shape[0] == batch_size]


NON_DEGENERATE = 7
"""The spatial size (or the spec's, where smaller) of the shapes :func:`non_degenerate_shapes` gives:
a 2x2 map has no interior (every window touches a border), and no kernel meets a gradient of a layout
that only a larger map has, so a check at the smallest shapes alone misses a wrong kernel call."""


def non_degenerate_shapes(graph: Graph, least: int = NON_DEGENERATE) -> dict[str, tuple[int, ...]] | None:
    """Consistent input shapes whose every free spatial size (an input's dims 2 and on, which the
    ops do not tie to another's) is at least ``least`` (a weight's, its kernel, at most the spec's),
    the other sizes as :func:`small_shapes` makes them; None when no such shapes fit the ops within
    ``LARGEST_TEST_NODE`` entries a node, or when they are the spec's own or the smallest shapes."""
    substitution, free = _tied_sizes(graph)
    functions = _size_functions(graph, substitution, free)
    spec_sizes = {
        sympy.Symbol(f"{node.name}_{axis}", positive=True, integer=True): size
        for node in graph.inputs
        for axis, size in enumerate(node.shape)
    }
    small = small_shapes(graph)[0]
    axes = {symbol: _input_axis(symbol, small) for symbol in free}
    small_values = {symbol: small[axis[0]][axis[1]] for symbol, axis in axes.items() if axis}
    spec = {node.name: tuple(node.shape) for node in graph.inputs}

    from .roles import input_roles

    weights = {name for name, (role, *_) in input_roles(graph).items() if role == "weight"}

    def size(symbol: sympy.Symbol, ceiling: int) -> int:
        axis = axes[symbol]
        if not axis or axis[1] < 2:
            return small_values.get(symbol, spec_sizes[symbol])
        grown = max(small_values[symbol], ceiling)
        return min(grown, spec_sizes[symbol]) if axis[0] in weights else grown  # a kernel stays the spec's

    for ceiling in (least, least + 1, 8, 12, 16, 24, 32, 48, 64):
        trial = {symbol: size(symbol, ceiling) for symbol in free}
        shapes = _shapes_for(functions, free, trial)
        if _valid(graph, shapes):
            return None if shapes in (spec, small) else shapes
    return None


def _input_axis(symbol: sympy.Symbol, shapes: dict) -> tuple[str, int] | None:
    """The input and axis a free size symbol stands for (``x_2``: x's axis 2), or None."""
    name, _, axis = symbol.name.rpartition("_")
    if not axis.isdigit() or name not in shapes or int(axis) >= len(shapes[name]):
        return None
    return name, int(axis)


def data_shapes(graph: Graph) -> dict[str, tuple[int, ...]]:
    """Small shapes of the data inputs with every parameter and buffer (an input with a ``source``) at its
    own size: the sizes tied to none of them (batch, and spatial where the ops allow) shrunk together as
    far as the ops allow, for a check on the model itself (``SMALL_INPUTS``, :mod:`symgrad.verify`)."""
    substitution, free = _tied_sizes(graph)
    functions = _size_functions(graph, substitution, free)
    spec_sizes = {
        sympy.Symbol(f"{node.name}_{axis}", positive=True, integer=True): size
        for node in graph.inputs
        for axis, size in enumerate(node.shape)
    }
    sources = {item.name for item in graph.spec.inputs if item.source}
    fixed = {
        symbol
        for node in graph.inputs
        if node.name in sources
        for axis in range(len(node.shape))
        for symbol in sympy.sympify(
            substitution.get(sympy.Symbol(f"{node.name}_{axis}", positive=True, integer=True), 0)
        ).free_symbols
    } & set(free)
    fixed |= {symbol for symbol in free if symbol.name.rsplit("_", 1)[0] in sources}
    values = {symbol: spec_sizes[symbol] for symbol in free}
    for ceiling in (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64):
        trial = {symbol: value if symbol in fixed else min(value, ceiling) for symbol, value in values.items()}
        shapes = _shapes_for(functions, free, trial)
        if _valid(graph, shapes):
            return {node.name: shapes[node.name] for node in graph.inputs if node.name not in sources}
    return {node.name: tuple(node.shape) for node in graph.inputs if node.name not in sources}
