"""What the derivation documents of a spec with blocks show: the network's overview (its top-level
graph with each parameter folded into the op that reads it, and the table of block instances), each
op kind derived once, and each block's and the top level's compact step table, each step linked to
its line of the generated module.

A document that grows with the number of distinct blocks and op kinds, not with depth: a ResNet-50's
is about as long as a ResNet-18's.
"""

from __future__ import annotations

import re

from .printing import to_latex


def module_lines(module: str, function: str) -> dict[str, int]:
    """{forward node: the 1-based line of ``module`` where ``function``'s backward starts pulling
    that node back}: the first comment of the function naming the node (``# bn1's ...``,
    ``# relu = F.relu(bn1): ...``) or the constant of its chain of blocks, or the call of a block
    instance's backward (``grads_x4 = ...``)."""
    lines = module.splitlines()
    start = next((index for index, line in enumerate(lines) if line.startswith(f"def {function}(")), None)
    if start is None:
        return {}
    found: dict[str, int] = {}
    for index in range(start + 1, len(lines)):
        line = lines[index]
        if re.match(r"[A-Za-z_@]", line):  # the next definition (a signature's closing `):` is not)
            break
        named = (
            re.match(r"\s+# (?:the instances of )?(\w+)", line)  # a step's comment
            or re.match(r"\s+grads_(\w+) = ", line)
        )  # a block instance's backward called
        if named:
            found.setdefault(named.group(1), index + 1)
    return found


def kind_of(node, step) -> tuple[str, str]:
    """An op kind: the rule's op, the operands it passes gradients to, and the mode where the node
    has one (a batch norm in training mode derives differently from one in eval mode). Its title and
    its anchor."""
    operands = [operand for operand, _, _ in step.contributions]
    training = node.params.get("training")
    mode = "" if not isinstance(training, bool) else (" (training)" if training else " (eval)")
    title = f"`{node.rule.op}`{mode}, to its {', '.join(operands) or 'nothing'}"
    anchor = "op-" + re.sub(r"[^a-z0-9]+", "-", f"{node.rule.op}{mode} {' '.join(operands)}".lower()).strip("-")
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


def step_rows(section, kinds: dict, module: str, function: str, blocks: dict[str, str], page) -> list[dict]:
    """A section's compact step table: each node of its backward, its forward as code, its op kind
    (derived once, in ``kinds``, first seen here) or the block it calls, and its line in ``module``."""
    program = section.planned.program
    graph = program.graph
    block = bool(section.instances)
    lines = module_lines(module, function)
    rows = []
    for step in program.steps:
        if block and step.node == "loss":  # the block's end: its output's gradient comes from the caller
            continue
        node = graph.nodes[step.node]
        called = blocks.get(node.rule.op) if hasattr(node.rule, "derived") else None
        chain = re.search(r"\b[A-Z][A-Z0-9_]+\b", step.forward)
        if called or chain:
            kind = (
                f"[block {called}](#block-{called})"
                if called
                else "the [chain of block instances](#overview), each its [block](#blocks)'s backward"
            )
        else:
            title, anchor = kind_of(node, step)
            if anchor not in kinds:
                kinds[anchor] = dict(title=title, anchor=anchor, uses=0, **op_kind_view(step, section.title, page))
            kinds[anchor]["uses"] += 1
            kind = f"[{title}](#{anchor})"
        line = lines.get(step.node) or (lines.get(chain.group(0)) if chain else None)
        rows.append(
            dict(
                number=len(rows) + 1,
                node=step.node,
                forward=step.forward,
                kind=kind,
                line=line,
                kind_html=_html_link(kind),
            )
        )
    return rows


def _html_link(markdown: str) -> str:
    """A Markdown cell's links and code spans as HTML (its text: identifiers, op names, fixed words)."""
    from markupsafe import escape

    text = str(escape(markdown))
    text = re.sub(r"\[([^\]]*)\]\(([^)]*)\)", r'<a href="\2">\1</a>', text)
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", text)


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
