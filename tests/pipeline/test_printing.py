"""printing.fit: one printed statement laid out black-style within 100 columns, meaning unchanged
(the same syntax tree), string literals whole."""

from __future__ import annotations

import ast
import textwrap

import pytest

from symgrad.printing import WIDTH, comment_lines, fit, literal_lines, prose

LONG = "a_rather_long_name_for_a_tensor"
LONG60 = "decoder_spatial_and_channel_squeeze_excitation_attention_conv"
LONG44 = "a_rather_long_name_for_a_tensor_that_is_long"

CASES = [
    pytest.param(
        f"grad_x = F.conv_transpose2d({LONG}, {LONG}, stride=32, padding=(1, 2), output_padding=(3, 4))", 4, id="call"
    ),
    pytest.param(
        f"grad_x = {LONG} * {LONG} + F.pad({LONG}.narrow(3, 0, 1).flip(3), [1, {LONG}.shape[3] - 2]) "
        f"- {LONG} / ({LONG} + 1)",
        4,
        id="sum-of-products",
    ),
    pytest.param(
        f"local = F.pad({LONG}.narrow(3, 0, 1).flip(3), [1, {LONG}.shape[3] - 2]).sum_to_size({LONG}.shape)",
        4,
        id="method-after-call",
    ),
    pytest.param(f"{LONG}, {LONG}_2, {LONG}_3, {LONG}_4 = saved", 4, id="tuple-target"),
    pytest.param(f"return {LONG}, {LONG}_2, {LONG}_3, {LONG}_4", 4, id="return-tuple"),
    pytest.param(f"def gradients({LONG}, {LONG}_2, {LONG}_3, grad_loss=None):", 0, id="signature"),
    pytest.param(f'raise RuntimeError("{LONG} is one literal: (never, cut) at its commas")', 12, id="string-literal"),
    pytest.param(
        f'message = f"{{name}}: an f-string (whole), [brackets], {{(a, b)}}" + {LONG} + {LONG}', 4, id="f-string"
    ),
    pytest.param(
        f"mask = -{LONG} * (-{LONG} > 0).to({LONG}.dtype) ** 2 + torch.where({LONG} > 0, {LONG}, -{LONG})",
        4,
        id="unary-and-power",
    ),
    pytest.param(f"value = {{'{LONG}': [1, 2, 3], '{LONG}_2': ({LONG}, {LONG}), '{LONG}_3': None}}", 0, id="dict"),
    pytest.param(
        "grads = _backward_from_saved(" + ", ".join(f"w{i}" for i in range(40)) + ", saved, grad_loss=g)",
        16,
        id="many-arguments",
    ),
    # 60-character names (SwinUNETR's, smp's scSE decoder's): a keyword, a key, a target longer than half a line
    pytest.param(
        f"return Gradients({LONG60}=grad_{LONG60}, x=grad_x, {LONG60}_2=grad_{LONG60}_2)",
        4,
        id="keyword-wider-than-half-a-line",
    ),
    pytest.param(
        f'PARAMS = {{"{LONG60}": "decoder.{LONG60}.weight", "x": "x.weight"}}', 0, id="entry-wider-than-half-a-line"
    ),
    pytest.param(f"grad_{LONG60} = grad_{LONG60}_output.sum(dim=(0, 2, 3))", 4, id="target-and-callee-wide"),
    pytest.param(
        f"if {LONG60}.is_cpu and {LONG60}.shape[0] * {LONG60}.shape[2:].numel() >= THRESHOLD:", 4, id="if-condition"
    ),
    # a colon that is no dict entry's: a slice's bounds, an annotated parameter, a lambda (review of fee35bb)
    pytest.param(
        f"y = {LONG44}[:, {LONG44}_start_index:{LONG44}_stop_value.size({LONG44}_dimension_index):2]",
        4,
        id="three-part-slice",
    ),
    pytest.param(
        f"y = {LONG44}[:, {LONG44}_start + 1:{LONG44}_stop_plus_some_more_characters_here + 2:{LONG44}_step]",
        4,
        id="slice-bounds-with-operators",
    ),
    pytest.param(
        f"y = {LONG44}[:, {LONG44}_start_index_value_here:] + {LONG44}[::{LONG44}_step.size({LONG44}_dim)]",
        4,
        id="slices-with-empty-bounds",
    ),
    pytest.param(
        f"def f(x, {LONG44}_with_an_annotation: torch.Tensor = torch.zeros(3, 4, 5, 6, 7, 8, 9, 10)):",
        0,
        id="annotated-default",
    ),
    pytest.param(
        f"f = wrapper(callback=lambda: {LONG44}_function_called_here({LONG44}_first, {LONG44}_second))",
        4,
        id="lambda-keyword",
    ),
    # assert condition, message: never one tuple (a tuple is always true)
    pytest.param(
        f"assert {LONG44} == {LONG44}_other, 'the message that explains what went wrong with these'",
        4,
        id="assert-with-message",
    ),
    pytest.param(
        f"assert {LONG44}.size(0), 'a message long enough that it does not fit after the condition here'",
        4,
        id="assert-message-below",
    ),
]


@pytest.mark.parametrize("code,indent", CASES)
def test_fit_keeps_the_syntax_tree_and_the_width(code: str, indent: int):
    laid_out = " " * indent + fit(code, indent)
    assert len(" " * indent + code) > WIDTH  # each case needs laying out
    assert max(map(len, laid_out.split("\n"))) <= WIDTH, laid_out
    if code.startswith("def"):  # a signature: give it a body
        source, original = laid_out + "\n    pass", code + "\n    pass"
    elif code.startswith("if"):  # a condition: give it a body
        source, original = "def f():\n" + laid_out + "\n        pass", f"def f():\n    {code}\n        pass"
    elif indent == 0:  # a module-level statement
        source, original = laid_out, code
    else:  # a statement at its indent: the body of a function (a return may stand there)
        source, original = "def f():\n" + laid_out, "def f():\n" + " " * indent + code
    assert ast.dump(ast.parse(source)) == ast.dump(ast.parse(original)), laid_out


def test_fit_leaves_a_line_that_fits_alone_and_puts_a_comment_above_a_long_one():
    assert fit("x = F.relu(y)", 4) == "x = F.relu(y)"
    assert fit("x = F.relu(y)", 4, "spec line 3") == "x = F.relu(y)  # spec line 3"
    long = f"x = F.conv2d({LONG}, {LONG}, stride=2, padding=1, dilation=2, groups=4)"
    laid_out = fit(long, 4, "spec line 3")
    assert laid_out.startswith("# spec line 3\n    x = F.conv2d(")


def test_a_string_literal_wider_than_the_line_stays_whole():
    literal = '"' + " ".join([LONG] * 4) + ', (a, b)"'
    laid_out = fit(f"raise RuntimeError({literal})", 8)
    assert laid_out == f"raise RuntimeError(\n            {literal}\n        )"


def test_a_long_delete_splits_into_a_parenthesised_tuple():
    names = ", ".join(f"{LONG}_{i}" for i in range(5))
    laid_out = fit(f"del {names}", 4)
    namespace = {f"{LONG}_{i}": i for i in range(5)}
    exec(compile(laid_out, "del", "exec"), {}, namespace)
    assert namespace == {} and laid_out.startswith("del (\n")


def test_prose_wraps_at_spaces_and_never_breaks_a_word():
    text = " ".join([LONG] * 8)
    wrapped = "    " + prose(text, 4)
    assert all(len(line) <= WIDTH for line in wrapped.split("\n"))
    assert wrapped.split() == text.split()


def test_every_statement_of_a_traced_resnet_keeps_its_syntax_tree_when_laid_out():
    """Real statements (convolution_backward calls, batch norm, cross-entropy, long names): each
    laid out at a function body's indent parses to the statement printed on one line."""
    from pathlib import Path

    import torch

    from symgrad.pipeline import build_text
    from symgrad.printing import to_code
    from symgrad.reverse import derive
    from symgrad.trace import LossChoice, load_target, trace

    torch.manual_seed(0)
    model = load_target(f"{Path(__file__).resolve().parents[1] / 'trace' / 'inputs' / 'resnet_style.py'}:TinyResNet")
    text = trace(
        model, {"x": (2, 3, 16, 16)}, name="tiny_resnet", loss=LossChoice("cross_entropy", "labels"), mode="train"
    )
    graph = build_text(text, "tiny_resnet.yaml").graph
    statements = [
        statement
        for program in (derive(graph), derive(graph, fused=True))
        for statement in program.forward + program.backward
    ]
    laid_out = 0
    for statement in statements:
        code = f"{statement.target.name} = {to_code(statement.value)}"
        lines = "    " + fit(code, 4)
        assert max(map(len, lines.split("\n"))) <= WIDTH, lines
        assert ast.dump(ast.parse(textwrap.dedent(lines))) == ast.dump(ast.parse(code)), lines
        laid_out += "\n" in lines
    assert laid_out >= 10  # the long ones were laid out, not merely left alone


def test_arguments_that_fit_together_go_on_one_line_and_the_call_closes_there():
    code = "native_bn1 = torch.native_batch_norm(conv1, bn1_weight, bn1_bias, bn1_running_mean, bn1_running_var, True)"
    assert fit(code, 4) == (
        "native_bn1 = torch.native_batch_norm(\n        conv1, bn1_weight, bn1_bias, bn1_running_mean, bn1_running_var, True)"
    )
    # a tuple keeps its own lines (its trailing comma is its meaning); a def's parameters their "):" line
    tuple_code = "return (" + ", ".join(f"(name_{index}, value_{index})" for index in range(8)) + ",)"
    assert fit(tuple_code, 4).endswith("\n    )") and ast.parse(fit(tuple_code, 0))
    define = "def block(" + ", ".join(f"argument_{index}" for index in range(9)) + "):"
    assert fit(define, 0).endswith("\n):")


def test_a_long_list_of_plain_names_fills_its_lines():
    names = [f"saved_layer{index}_{block}" for index in range(1, 5) for block in range(3)]
    laid_out = fit(", ".join(names) + " = saved", 4).splitlines()  # three lines of names, not twelve
    assert len(laid_out) == 5 and laid_out[0] == "(" and laid_out[-1] == "    ) = saved", laid_out
    assert all(len(line) <= WIDTH for line in laid_out)
    assert ast.dump(ast.parse(textwrap.dedent("    " + "\n".join(laid_out)))) == ast.dump(
        ast.parse(", ".join(names) + " = saved")
    )


def test_a_fused_kernels_tuple_is_unpacked_where_it_is_made():
    from symgrad.pipeline import build

    source = build("examples/seed3_conv_relu_conv.yaml").rendered.files["seed3_conv_relu_conv.py"]
    assert "grad_relu1, grad_w2, _ = _convolution_backward(" in source
    assert "local_conv2[" not in source  # no entry-by-entry reads of a tuple that is unpacked


@pytest.mark.parametrize("indent", [4, 8])
def test_a_comment_whose_expression_is_wider_than_the_line_is_cut_at_a_bracket(indent):
    """SwinUNETR's index comment, ``table[index]`` of two 52-character module paths, ran to 108 columns in the
    block form: it is cut after the bracket, no line past 100 columns, no character lost."""
    table = "layers1_0_blocks_1_attn_relative_position_bias_table"
    index = "layers1_0_blocks_1_attn_relative_position_index"
    comment = f"layers1_0_blocks_1_attn_index = {table}[{index}].flatten(0, 1): pulled back to its input"
    lines = (" " * indent + comment_lines(comment, indent)).splitlines()
    assert max(map(len, lines)) <= WIDTH, lines
    assert all(line.startswith(" " * indent + "# ") for line in lines)
    assert "".join(line.strip()[2:] for line in lines).replace(" ", "") == comment.replace(" ", "")
    assert lines[1].strip() == f"# {index}].flatten(0, 1): pulled back to its input", lines


def test_a_spec_of_60_character_names_generates_lines_within_100_columns_and_runs():
    """Every line of the module and its test file within 100 columns where the names are 60 characters long
    (the keywords of ``return Gradients(...)``, the test file's names, the channels_last test, an assignment
    whose target and callee share no line); the module imports and its gradients are autograd's."""
    import sys

    import torch

    from symgrad.pipeline import build_text

    x, w, b, g, c = (
        f"{what}_of_the_spatial_and_channel_squeeze_excitation_attention"[:62]
        for what in ("image", "weight", "bias", "scale", "output")
    )
    spec = f"""name: squeeze_excitation_unit_of_a_decoder_with_a_long_name
inputs:
  {x}: {{shape: [2, 3, 6, 6]}}
  {w}: {{shape: [4, 3, 3, 3]}}
  {b}: {{shape: [4]}}
  {g}: {{shape: [4]}}
  target: {{shape: [2, 4, 6, 6]}}
layers:
  - {{op: conv2d, in: {x}, weight: {w}, bias: {b}, padding: 1, out: {c}}}
  - {{op: group_norm, in: {c}, weight: {g}, num_groups: 2, out: normalised}}
  - {{op: relu, out: activated}}
loss: {{op: mse_loss, in: activated, target: target}}
wrt: [{x}, {w}, {b}, {g}]
"""
    files = build_text(spec, "long.yaml").rendered.files
    assert min(map(len, (x, w, b, g, c))) >= 60
    for name, content in files.items():
        if name.endswith(".py"):
            wide = [(number, line) for number, line in enumerate(content.splitlines(), 1) if len(line) > WIDTH]
            assert not wide, (name, wide[:3])
            compile(content, name, "exec")
    module = type(sys)("long")
    exec(compile(files["squeeze_excitation_unit_of_a_decoder_with_a_long_name.py"], "long.py", "exec"), module.__dict__)
    generator = torch.Generator().manual_seed(0)
    inputs = {
        name: torch.randn(shape, dtype=torch.float64, generator=generator).requires_grad_(name != "target")
        for name, shape in ((x, (3, 3, 5, 7)), (w, (4, 3, 3, 3)), (b, (4,)), (g, (4,)), ("target", (3, 4, 5, 7)))
    }
    expected = torch.autograd.grad(module.forward(**inputs), [inputs[name] for name in (x, w, b, g)])
    actual = module.gradients(**inputs)
    for name, value in zip((x, w, b, g), expected):
        assert (getattr(actual, name) - value).abs().max() <= 1e-12 * value.abs().max()


def test_a_long_message_becomes_adjacent_literals_within_the_width():
    """The test file's ZERO_BY_STRUCTURE reasons (430 characters with 60-character names): cut after spaces into
    literals Python joins back into the message."""
    message = " ".join([LONG60, "is the bias of", LONG60, "which feeds only training-mode batch_norm; it's zero"] * 2)
    laid_out = "        " + literal_lines(message, 8)
    assert max(map(len, laid_out.split("\n"))) <= WIDTH, laid_out
    assert ast.literal_eval("(" + laid_out + ")") == message


@pytest.mark.parametrize("indent", [4, 8])
def test_literal_lines_count_the_space_each_literal_keeps(indent: int):
    """Words that fill a line to within a column or two of the width, across the boundary: the space a
    literal ends with counts (a 90-character first word at column 8 made a 101-column line). Non-ASCII
    text stays readable, and counts as what it shows."""
    room = WIDTH - indent - 2  # inside the quotes
    for first in range(room - 12, room + 3):
        for message in ("a" * first + " " + "b" * 5, "a" * 40 + " " + "b" * (first - 41) + " c", "é" * first + " ü ü"):
            laid_out = " " * indent + literal_lines(message, indent)
            assert ast.literal_eval("(" + laid_out + ")") == message
            if first <= room:  # every word fits a line of its own
                assert max(map(len, laid_out.split("\n"))) <= WIDTH, laid_out
    assert literal_lines("é ü") == '"é ü"'


def test_a_long_conditional_expression_puts_its_condition_and_alternative_on_lines_of_their_own():
    """The compiled path's choice of an upsample adjoint: ``kernel(...) if not compiling else adjoint(...)``
    in black's layout, within the width and the same expression; a comprehension's ``if`` is left whole."""
    code = (
        "grad_conv_up1_5 = (torch.ops.aten.upsample_bilinear2d_backward(grad_up_2, grad_up_2.shape[2:], "
        "conv_up1_5.shape, False, 2.0, 2.0) if not torch.compiler.is_compiling() else _interpolate_adjoint("
        "grad_up_2, conv_up1_5.shape, scale_factor=2, mode='bilinear', align_corners=False))"
    )
    laid_out = "    " + fit(code)
    lines = laid_out.split("\n")
    assert max(map(len, lines)) <= WIDTH, laid_out
    assert "        if not torch.compiler.is_compiling()" in lines
    assert any(line.startswith("        else _interpolate_adjoint(") for line in lines), laid_out
    assert ast.dump(ast.parse(textwrap.dedent(laid_out))) == ast.dump(ast.parse(code))
    comprehension = (
        "values = [size_of_the_first_axis_of_the_input + size_of_the_second_axis_of_the_input if axis "
        "% 2 else 0 for axis in range(9)]"
    )
    assert ast.dump(ast.parse(textwrap.dedent("    " + fit(comprehension)))) == ast.dump(ast.parse(comprehension))
