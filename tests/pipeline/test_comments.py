"""A backward statement's comment is a reference to its forward node (``symgrad.comment.Comment``): the
derivation makes it as parts, planning renames the symbols of the forward line it quotes, and ``emit``
makes it its text once, with the final names; nothing edits comment text afterwards."""

from __future__ import annotations

from symgrad.algebra import tensor
from symgrad.comment import Comment
from symgrad.emit import printed_lines
from symgrad.lifetimes import Scheduled
from symgrad.pipeline import build_text
from symgrad.plan import renamed_statements
from symgrad.reverse import Statement, derive

BRANCHED = """name: branched
inputs:
  x: {shape: [2, 3]}
  w: {shape: [4, 3], source: fc.weight}
  b: {shape: [4], source: fc.bias}
  t: {shape: [2, 4]}
layers:
  - {op: linear, in: x, weight: w, bias: b, out: fc}
  - {op: relu, in: fc, out: r}
  - {op: add, in: [r, fc], out: s}
loss: {op: mse_loss, in: s, target: t}
wrt: [x, w, b]
"""


def test_the_walk_makes_each_comment_as_parts_naming_its_forward_node():
    program = derive(build_text(BRANCHED, "branched.yaml", documents=False, tests=False).graph)
    comments = {statement.target.name: statement.comment for statement in program.backward}
    assert comments["grad_fc"] == Comment("sum", "fc", ("r", "s"))
    pulled = comments["grad_x"]
    assert (pulled.kind, pulled.node, pulled.names) == ("pullback", "fc", ("input",))
    target, value = pulled.quoted
    assert target == tensor("fc") and {tensor("x"), tensor("w"), tensor("b")} <= value.free_symbols
    assert str(pulled) == "fc = F.linear(x, w, b): pulled back to its input"
    assert all(comments[name].quoted == pulled.quoted for name in ("grad_w", "grad_b"))


def test_a_rename_reaches_the_quoted_forward_line_and_emit_quotes_it_once_with_the_final_names():
    """The pullbacks of one forward line to its bias, weight and input, line after line, are printed
    under one comment, its text made from the renamed symbols: ``params["fc.weight"]``, not ``w``."""
    program = derive(build_text(BRANCHED, "branched.yaml", documents=False, tests=False).graph)
    pulled = {statement.target.name: statement for statement in program.backward}
    run = [Scheduled(pulled[name]) for name in ("grad_b", "grad_w", "grad_x")]
    entries = {tensor("w"): tensor('params["fc.weight"]'), tensor("b"): tensor('params["fc.bias"]')}
    renamed = renamed_statements(run, entries)
    assert all(isinstance(item.statement.comment, Comment) for item in renamed)  # still parts, not text
    lines = printed_lines(renamed, own_line=4)
    assert [line.comment for line in lines] == [
        'fc = F.linear(x, params["fc.weight"], params["fc.bias"]): pulled back to its bias, weight and input',
        "",
        "",
    ]
    assert str(run[0].statement.comment) == "fc = F.linear(x, w, b): pulled back to its bias"  # not edited
    # a pullback of another forward line, or a plain note, between them starts a comment of its own
    other = Scheduled(Statement(tensor("grad_q"), tensor("grad_y"), "y", "a note (a remark)"))
    lines = printed_lines([renamed[0], other, renamed[1]])
    assert [line.comment for line in lines] == [
        'fc = F.linear(x, params["fc.weight"], params["fc.bias"]): pulled back to its bias',
        "a note (a remark)",
        'fc = F.linear(x, params["fc.weight"], params["fc.bias"]): pulled back to its weight',
    ]
