"""The reverse walk: from the loss back to every ``wrt`` input, one node at a time.

This is seed 001's "derive as you go". Visiting nodes in reverse topological order guarantees that
when a node is reached, every node that reads it has already sent its contribution. The walk then

1. sums the contributions (the branch sum, where a node feeds several others), summing each back
   to the node's shape first if an elementwise op broadcast it;
2. names the result ``grad_<node>``, one statement per node;
3. asks the node's rule for the pullback: the contribution to each operand that needs a gradient
   (operands that do not depend on a ``wrt`` input are skipped).

Afterwards ``sympy.cse`` runs over all backward statements so that any subexpression they share is
computed once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import sympy

from .algebra import TensorOp, op, primitive, tensor
from .comment import Comment
from .graph import Graph, Node
from .shapes import fixed_size

GRAD_LOSS = tensor("grad_loss")


@dataclass
class Statement:
    target: sympy.Symbol
    value: sympy.Expr
    node: str
    """The forward node this line belongs to."""
    comment: str | Comment = ""
    """A note (``spec line 12``, a rule's), or a backward step's :class:`Comment`."""
    math: sympy.Expr | None = None
    """How the docs write the value, where it differs from the code."""
    gradient_of: str | None = None
    """The node or input whose gradient this line computes (``grad_h``: ``h``); None for other values."""
    local_kind: str | None = None
    """For a value a rule named (``node.local``): its kind (``mask`` for a ReLU's step, ``local``, ...)."""


@dataclass
class Step:
    """One backward step of the derivation, for the docs."""

    node: str
    forward: str
    incoming: sympy.Symbol
    contributions: list[tuple[str, str, sympy.Expr]]
    """(operand, source node, contribution) triples."""
    locals: list[tuple[sympy.Symbol, sympy.Expr]] = field(default_factory=list)
    """Local gradients the step names (a ReLU's mask)."""


@dataclass
class Program:
    graph: Graph
    forward: list[Statement]
    backward: list[Statement]
    gradients: dict[str, sympy.Symbol]
    default_cotangent: sympy.Expr
    steps: list[Step] = field(default_factory=list)
    branch_sums: dict[str, list[str]] = field(default_factory=dict)
    """node -> the nodes whose contributions were summed into its gradient, where there are several."""

    @property
    def loss_symbol(self) -> sympy.Symbol:
        return tensor("loss")


def derive(graph: Graph, fused: bool = False) -> Program:
    """The forward and backward statements of ``graph``; ``fused`` lets rules use fused kernels."""
    forward = _forward_statements(graph, fused)
    needs_gradient = graph.depends_on_wrt()
    nodes = list(graph.nodes.values())
    contributions: dict[str, list[tuple[Node, str, sympy.Expr]]] = {}
    backward: list[Statement] = []
    steps: list[Step] = []
    branch_sums: dict[str, list[str]] = {}
    loss = graph.loss

    for node in reversed(nodes):
        if node is loss:
            grad = GRAD_LOSS
        elif node.name in contributions:
            grad = tensor(f"grad_{node.name}")
            incoming = contributions[node.name]
            joined = _pieces_joined(graph, node, incoming, contributions)
            value = joined or _branch_sum(
                [
                    _unbroadcast(graph, consumer, operand, node, contribution)
                    for consumer, operand, contribution in incoming
                ],
                fused,
            )
            if value.is_number:  # the paths cancel exactly (sub(x, x)): still a tensor of x's shape
                assert value == 0, value
                value = op("zeros_like", tensor(node.name))
            if len(incoming) > 1:
                branch_sums[node.name] = [consumer.name for consumer, _, _ in incoming]
                readers = tuple(sorted({"the outputs" if c.rule.op == "outputs" else c.name for c, _, _ in incoming}))
                comment = Comment("sum", node.name, readers)
                if joined is not None:
                    comment = Comment("joined", node.name, readers, kernel=joined.primitive.name)
            elif incoming[0][0].rule.op == "outputs":  # a spec that ends in outputs: the seed of the walk
                comment = Comment("output", node.name, (incoming[0][1].rsplit("_", 1)[1],))
            else:
                consumer, operand, _ = incoming[0]
                comment = Comment("pullback", consumer.name, (operand,), _forward_line(graph, consumer))
            backward.append(Statement(grad, value, node.name, comment, gradient_of=node.name))
        else:
            continue
        if node.kind == "input":
            continue
        wanted = frozenset(operand for operand, source in node.operands.items() if source in needs_gradient)
        if not wanted:
            continue
        symbols = graph.symbols(node)
        symbols.fused = fused
        pulled = node.rule.pullback(symbols, grad, wanted)
        missing = wanted - set(pulled)
        if missing:  # a rule that cannot differentiate an operand must say so, never drop it
            raise NotImplementedError(f"rule {node.rule.op} gave no gradient for {sorted(missing)}")
        for symbol, value in symbols.locals:
            backward.append(
                Statement(
                    symbol,
                    value,
                    node.name,
                    symbols.notes.get(symbol, f"local gradient of {node.name}"),
                    local_kind=symbols.kinds[symbol],
                )
            )
        for operand in sorted(pulled, key=list(node.operands).index):
            source = node.operands[operand]
            contributions.setdefault(source, []).append((node, operand, pulled[operand]))
        steps.append(
            Step(
                node.name,
                _describe(graph, node),
                grad,
                [(operand, node.operands[operand], pulled[operand]) for operand in pulled],
                symbols.locals,
            )
        )

    backward = _share_common_subexpressions(backward)
    targets = [statement.target for statement in forward + backward]
    if len(targets) != len(set(targets)):  # a name assigned twice would silently shadow a value
        duplicated = sorted({t.name for t in targets if targets.count(t) > 1})
        raise ValueError(f"derivation assigns {duplicated} more than once")
    kept = _input_names_kept(graph)
    forward = [_renamed(statement, kept) for statement in forward]
    backward = _without_copies(
        [_renamed(statement, {**kept, **_gradients_kept(graph, kept)}) for statement in backward]
    )
    gradients = {name: tensor(f"grad_{name}") for name in graph.wrt}
    default = loss.rule.default_cotangent(graph.symbols(loss))
    return Program(graph, forward, backward, gradients, default, steps, branch_sums)


def _input_names_kept(graph: Graph) -> dict[sympy.Symbol, sympy.Symbol]:
    """The outputs of layers that keep their input's name (``Rule.keeps_input_name``: the size checks of
    ``--static-sizes``), in a chain from a spec input, each to that input: the math after them reads ``x``,
    not ``x_size3``. After the walk, which names each node's value once."""
    roots: dict[str, str] = {}
    for node in graph.nodes.values():
        if node.kind == "layer" and node.rule.keeps_input_name:
            source = next(iter(node.operands.values()))
            if source in roots or graph.nodes[source].kind == "input":
                roots[node.name] = roots.get(source, source)
    return {tensor(name): tensor(root) for name, root in roots.items()}


def _gradients_kept(graph: Graph, kept: dict[sympy.Symbol, sympy.Symbol]) -> dict[sympy.Symbol, sympy.Symbol]:
    """``grad_x_size3`` -> ``grad_x`` where ``x = _size_check(x, ...)`` keeps the input's name: its gradient
    keeps it too, where the chain from the input is the input's one path (each link read by the next
    alone), so that every gradient along it is the same value."""
    renamed = {}
    for node, root in kept.items():
        link, alone = node.name, True
        while link != root.name and alone:
            link = next(iter(graph.nodes[link].operands.values()))
            alone = len(graph.consumers(link)) == 1
        if alone:
            renamed[tensor(f"grad_{node.name}")] = tensor(f"grad_{root.name}")
    return renamed


def _renamed(statement: Statement, kept: dict) -> Statement:
    if not kept:
        return statement
    math = statement.math.xreplace(kept) if statement.math is not None else None
    gradient_of = statement.gradient_of
    if gradient_of is not None and tensor(f"grad_{gradient_of}") in kept:
        gradient_of = kept[tensor(f"grad_{gradient_of}")].name.removeprefix("grad_")
    return dataclasses.replace(
        statement,
        target=statement.target.xreplace(kept),
        value=statement.value.xreplace(kept),
        math=math,
        gradient_of=gradient_of,
    )


def _without_copies(statements: list[Statement]) -> list[Statement]:
    """Less the statements a renaming made ``grad_x = grad_x``."""
    return [statement for statement in statements if statement.value != statement.target]


def _forward_statements(graph: Graph, fused: bool = False) -> list[Statement]:
    """One statement per node (after the locals its rule names); ``fused``: a rule may compute, with
    its value, what its fused pullback reads (training-mode batch_norm's batch statistics)."""
    statements = []
    for node in graph.nodes.values():
        if node.kind == "input":
            continue
        symbols = graph.symbols(node)
        symbols.fused = fused
        result = node.rule.forward(symbols)
        for symbol, value in symbols.locals:
            statements.append(Statement(symbol, value, node.name, local_kind=symbols.kinds[symbol]))
        statements.append(
            Statement(tensor(node.name), result.value, node.name, f"spec line {node.location.line}", result.math)
        )
    return statements


def _describe(graph: Graph, node: Node) -> str:
    from .printing import to_code

    return to_code(_forward_line(graph, node)[1])  # the emitted Python, as it runs


def _forward_line(graph: Graph, node: Node) -> tuple[sympy.Symbol, sympy.Expr]:
    """``node``'s forward line as a pullback's comment quotes it: its target and its value."""
    return tensor(node.name), node.rule.forward(graph.symbols(node)).value


def _pieces_joined(graph: Graph, node: Node, incoming: list, contributions: dict) -> sympy.Expr | None:
    """The gradient of a node cut into pieces that tile one dim (``q, k, v = qkv.unbind(0)``, ``x.chunk(2, 1)``,
    traced as ``narrow``s, each piece's gradient zero-padded back): the pieces' gradients joined in one ``cat``,
    or, where every piece is one entry whose gradient is an ``unsqueeze`` on that dim (``unbind``), one ``stack``,
    as autograd's ``split_backward`` and ``unbind_backward`` join them: the same values, bit for bit, in one
    kernel instead of a pad and an add per piece. None where the pieces do not tile the dim at every size
    (a size the spec's sizes do not fix), or where any contribution is not such a piece."""
    rank = len(node.shape)
    pieces = []
    for consumer, _, contribution in incoming:
        grad = tensor(f"grad_{consumer.name}")
        if consumer.rule.op != "narrow" or not isinstance(contribution, TensorOp):
            return None
        start, length = consumer.params["start"], consumer.params["length"]
        if contribution.primitive.name != "pad" or contribution.operands[0] != grad:
            return None
        if not all(isinstance(value, int | sympy.Integer) for value in (start, length)):
            return None
        pieces.append((int(start), int(length), consumer.params["dim"] % rank, consumer, grad))
    pieces.sort(key=lambda piece: piece[0])
    dims = {piece[2] for piece in pieces}
    ends = [piece[0] + piece[1] for piece in pieces]
    if len(pieces) < 2 or len(dims) > 1 or [piece[0] for piece in pieces] != [0, *ends[:-1]]:
        return None
    dim = dims.pop()
    if fixed_size(graph, node.name, dim) != ends[-1]:
        return None
    unsqueezed = [_unsqueezed(contributions.get(piece[3].name, ()), dim) for piece in pieces]
    if all(piece[1] == 1 for piece in pieces) and all(value is not None for value in unsqueezed):
        return op("stack", *unsqueezed, dim=dim)
    return op("cat", *(piece[4] for piece in pieces), dim=dim)


def _unsqueezed(incoming, dim: int) -> sympy.Expr | None:
    """``g`` where a piece's one contribution is ``g.unsqueeze(dim)`` (the squeeze after unbind's narrow)."""
    if len(incoming) != 1:
        return None
    contribution = incoming[0][2]
    if not isinstance(contribution, TensorOp) or contribution.primitive.name != "unsqueeze":
        return None
    return contribution.operands[0] if contribution.params["dim"] == dim else None


# a partial branch sum kept as one term, its two terms in the order given: a sum of three or more adds as
# autograd's engine adds them
primitive(
    "partial_sum",
    fresh=True,
    code=lambda operands, params, show: f"({operands[0]} + {operands[1]})",
    latex=lambda operands, params, show: rf"\left({operands[0]} + {operands[1]}\right)",
)


def _branch_sum(terms: list[sympy.Expr], fused: bool) -> sympy.Expr:
    """``terms`` (in the order the walk met their consumers, the latest in the forward first) added up.
    sympy's sum orders its terms its own way, which changes no value for two (a + b is b + a, bit for
    bit) but regroups three; the fused derivation keeps autograd's grouping and order: its engine adds
    each contribution into the buffer of the first as the nodes run, the latest created first,
    ((t0 + t1) + t2) + ..., the first's layout kept (a by-hand channels_first layer norm's input feeds
    a mean and two differences: ConvNeXt's float32 gradients were one ulp from autograd's there)."""
    if not fused or len(terms) < 3:
        return sympy.Add(*terms)
    total = op("partial_sum", terms[0], terms[1])
    for term in terms[2:-1]:
        total = op("partial_sum", total, term)
    return sympy.Add(total, terms[-1])


def _unbroadcast(graph: Graph, consumer: Node, operand: str, source: Node, contribution: sympy.Expr) -> sympy.Expr:
    """Sum a contribution back to the shape of the node it flows into, where the op may broadcast it.

    Broadcasting is decided at run time: an operand with fewer dims, or with size 1 on an axis, may be
    broadcast at other input sizes even where the spec's shapes agree (a squeeze-and-excitation gate
    ``x * s``, ``s`` of shape [N, C, 1, 1], traced where ``x`` is 1 x 1 too), so the sum is emitted
    for every such operand; where nothing was broadcast it costs nothing (``sum_to_size`` of a
    tensor to its own shape returns it)."""
    if not consumer.rule.broadcasts or contribution.is_number:  # a number (0 * y) has no shape
        return contribution
    lower_rank = len(source.shape) < len(consumer.shape)
    if consumer.shape != source.shape or lower_rank or 1 in source.shape:
        return op("sum_to_size", contribution, tensor(source.name))
    return contribution


def _share_common_subexpressions(statements: list[Statement]) -> list[Statement]:
    """Run ``sympy.cse`` over the backward statements; each shared value is defined just before
    the first statement that needs it."""
    replacements, values = sympy.cse(
        [statement.value for statement in statements], symbols=sympy.numbered_symbols("shared_"), order="none"
    )
    if not replacements:
        return statements
    definitions = dict(replacements)
    order = {symbol: index for index, (symbol, _) in enumerate(replacements)}
    result: list[Statement] = []
    defined: set[sympy.Symbol] = set()
    for statement, value in zip(statements, values):
        needed, stack = set(), [value]
        while stack:
            for symbol in stack.pop().free_symbols:
                if symbol in definitions and symbol not in needed and symbol not in defined:
                    needed.add(symbol)
                    stack.append(definitions[symbol])
        for symbol in sorted(needed, key=order.__getitem__):  # in cse's order, each before its first reader
            result.append(Statement(symbol, definitions[symbol], statement.node, "shared by several gradients"))
            defined.add(symbol)
        result.append(dataclasses.replace(statement, value=value))
    return result


def per_sample_statements(program: Program) -> tuple[list[Statement], dict[str, sympy.Symbol], list[str]]:
    """``per_sample_grad_<w>``: each sample's gradient of its own loss by each shared parameter.

    With a per-sample loss no op here mixes samples, so ``grad_<node>[n]`` already carries sample
    n alone; a parameter's per-sample gradient is then the sum, over the layers that read it, of
    each layer's per-sample pullback. Parameters are the ``wrt`` inputs that only ever serve as a
    layer's weight or bias; anything else is refused rather than guessed at.
    """
    from .errors import SpecError

    graph = program.graph
    loss = graph.loss
    if loss.params["reduction"] != "per_sample":
        raise SpecError(
            "per-sample gradients need `reduction: per_sample` in the loss",
            loss.location,
            "set the loss's reduction to per_sample, or drop per_sample from extras",
        )
    from .shapes import batch_inputs

    batched = batch_inputs(graph)
    data = set(batched)
    statements, results = [], {}
    for name in graph.wrt:
        consumers = graph.consumers(name)
        if name in data:
            continue  # batch data (x): sample n's loss only sees x[n], so its gradient is already per sample
        terms = []
        for node, operand in consumers:
            pullback = node.rule.per_sample_pullback
            term = pullback(graph.symbols(node), tensor(f"grad_{node.name}"), operand) if pullback else None
            if term is None:
                raise SpecError(
                    f"per-sample gradients of '{name}' as the {operand} of {node.rule.op} "
                    f"'{node.name}' are not supported",
                    node.location,
                    f"remove '{name}' from wrt, or drop per_sample from extras",
                )
            terms.append(term)
        symbol = tensor(f"per_sample_grad_{name}")
        statements.append(
            Statement(
                symbol, sympy.Add(*terms), name, f"{name} is read by {', '.join(node.name for node, _ in consumers)}"
            )
        )
        results[name] = symbol
    if not results:
        raise SpecError(
            "no wrt tensor is a layer weight or bias, so there is no per-sample parameter gradient",
            loss.location,
            "add a weight to wrt, or drop per_sample from extras",
        )
    return statements, results, batched
