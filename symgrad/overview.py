"""What the derivation documents of a spec with blocks show: the network's overview (its top-level
graph with each parameter folded into the op that reads it, and the table of block instances), each
op kind derived once, and each block's and the top level's compact step table, each step linked to
its line of the generated module.

A document that grows with the number of distinct blocks and op kinds, not with depth: a ResNet-50's
is about as long as a ResNet-18's.
"""

from __future__ import annotations

from .printing import to_latex
from .rules.call import BlockRule, ChainRule


def node_lines(printed, where: dict[int, dict[str, int]]) -> dict[str, tuple[int | None, int | None]]:
    """{forward node: the module's lines of (the first comment about it, its last statement)} for a
    function's backward ``printed`` (its :class:`~symgrad.emit.Line` list: each comment's ``reference``,
    the node it is about; each statement's ``node``), from ``where`` each line landed as the module was
    printed (:func:`symgrad.documents.placed_lines`, header included): no line of the module is read back."""
    comments: dict[str, int] = {}
    statements: dict[str, int] = {}
    for line in printed:
        at = where.get(id(line), {})
        if line.reference and "comment" in at:
            comments.setdefault(line.reference, at["comment"])
        if line.node and "statement" in at:  # a block's call: after the lines making its gradient
            statements[line.node] = at["statement"]
    return {node: (comments.get(node), statements.get(node)) for node in {**comments, **statements}}


def kind_of(node, step) -> tuple[str, str]:
    """An op kind: the rule's op, the operands it passes gradients to, and the mode where the node
    has one (a batch norm in training mode derives differently from one in eval mode). Its title and
    its anchor."""
    operands = [operand for operand, _, _ in step.contributions]
    training = node.params.get("training")
    mode = "" if not isinstance(training, bool) else (" (training)" if training else " (eval)")
    title = f"`{node.rule.op}`{mode}, to its {', '.join(operands) or 'nothing'}"
    text = f"{node.rule.op}{mode} {' '.join(operands)}".lower()
    anchor = "op-" + "-".join("".join(c if c.isascii() and c.isalnum() else " " for c in text).split())
    return title, anchor


def op_kind_view(step, section_title: str, page) -> dict:
    """One op kind's derivation, shown on its first node (``step``): incoming gradient, local
    gradients, and what the chain rule passes to each operand."""
    locals_ = [f"{to_latex(symbol)} = {to_latex(value)}" for symbol, value in step.locals]
    incoming = to_latex(step.incoming)
    return dict(
        node=step.node,
        forward=step.forward,
        where=section_title,
        incoming=incoming,
        incoming_mathml=page(incoming),
        locals=locals_,
        locals_mathml=[page(local) for local in locals_],
        contributions=[
            dict(operand=operand, source=source, latex=latex, mathml=page(latex))
            for operand, source, value in step.contributions
            for latex in (to_latex(value),)
        ],
    )


def step_rows(section, kinds: dict, blocks: dict[str, str], page) -> list[dict]:
    """A section's compact step table: each node of its backward, its forward as code, its op kind
    (derived once, in ``kinds``, first seen here) or the block it calls, and its line in the module
    (``section.lines``): the first comment about the node (a block's or a chain's without one: its call)."""
    program = section.planned.program
    graph = program.graph
    block = bool(section.instances)
    rows = []
    for step in program.steps:
        if block and step.node == "loss":  # the block's end: its output's gradient comes from the caller
            continue
        node = graph.nodes[step.node]
        called = blocks.get(node.rule.op) if isinstance(node.rule, BlockRule) else None
        chain = isinstance(node.rule, ChainRule)
        if called:
            links = [("", f"block {called}", f"#block-{called}")]
        elif chain:
            links = [("the ", "chain of block instances", "#overview"), (", each its ", "block", "#blocks")]
            links.append(("'s backward", "", ""))
        else:
            title, anchor = kind_of(node, step)
            if anchor not in kinds:
                kinds[anchor] = dict(title=title, anchor=anchor, uses=0, **op_kind_view(step, section.title, page))
            kinds[anchor]["uses"] += 1
            links = [("", title, f"#{anchor}")]
        comment, statement = (section.lines or {}).get(step.node, (None, None))
        line = comment or (statement if called or chain else None)
        rows.append(
            dict(
                number=len(rows) + 1,
                node=step.node,
                forward=step.forward,
                kind="".join(before + (f"[{text}]({href})" if href else "") for before, text, href in links),
                line=line,
                kind_html=_html_links(links),
            )
        )
    return rows


def _html_links(links: list[tuple[str, str, str]]) -> str:
    """A step's kind cell on the page: each (text before, link text, its href), the link text's code
    spans (between backticks: an op's name) as code, all of it escaped (identifiers, op names, fixed words)."""
    from markupsafe import escape

    def shown(text: str) -> str:
        parts = str(escape(text)).split("`")
        return "".join(f"<code>{part}</code>" if index % 2 else part for index, part in enumerate(parts))

    return "".join(
        str(escape(before)) + (f'<a href="{href}">{shown(text)}</a>' if href else "") for before, text, href in links
    )


def instance_rows(spec, graph) -> list[dict]:
    """The block table: each instance in the order the forward runs them, its block, its
    hyper-parameters and its output's shape (``graph``: the spec with every block written out)."""
    return [
        dict(
            instance=layer.out,
            block=layer.block,
            hyper=", ".join(f"{name}={value}" for name, value, *_ in layer.hyper),
            shape=list(graph.nodes[layer.out].shape) if layer.out in graph.nodes else "",
        )
        for layer in spec.layers
        if layer.block
    ]
