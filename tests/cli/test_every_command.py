"""Every command gives a result or a one-line error, never a traceback (issue 38, item 9): each
command run over the example specs and a few hostile ones (a `{like: NODE}` size, an input named as
certify's own target, a name the module uses itself, bytes that are no YAML, an empty file, a folder
with no spec, a path that does not exist)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from symgrad.cli import main

ROOT = Path(__file__).resolve().parents[2]

LIKE = """name: up_like
inputs:
  x: {shape: [2, 4, 16, 16]}
  w: {shape: [4, 4, 3, 3]}
  t: {shape: [2, 8, 16, 16]}
layers:
  - {op: conv2d, weight: w, padding: 1, stride: 2, out: down}
  - {op: interpolate, in: down, size: {like: x}, mode: bilinear, align_corners: false, out: up}
  - {op: pad, in: up, pad: {like: t}, out: padded}
  - {op: cat, in: [padded, x], dim: 1, out: joined}
loss: {op: mse_loss, target: t}
wrt: [x, w]
"""

HOSTILE = {
    "like_sizes.yaml": LIKE,  # every traced U-Net: interpolate(size=skip.shape[-2:])
    "input_named_y.yaml": LIKE.replace("  t:", "  y:")
    .replace("pad: {like: t}", "pad: {like: y}")
    .replace("target: t", "target: y")
    .replace("name: up_like", "name: named_y"),
    "name_clash.yaml": LIKE.replace("out: up}", "out: keys}")
    .replace("in: up,", "in: keys,")
    .replace("name: up_like", "name: clash"),
    "binary.yaml": "\x00\x01\x02",
    "empty.yaml": "",
    "not_a_mapping.yaml": "- 1\n- 2\n",
}


@pytest.fixture(scope="module")
def specs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("specs")
    paths = {}
    for name, text in HOSTILE.items():
        (folder / name).write_text(text, encoding="utf-8")
        paths[name] = folder / name
    (folder / "no_specs").mkdir()
    paths["no_specs"] = folder / "no_specs"
    paths["missing.yaml"] = folder / "missing.yaml"
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        paths[example.name] = example
    return paths


def _one_line_or_result(result, command: list[str]) -> None:
    shown = f"{command}: exit {result.exit_code}\n{result.output}"
    assert result.exception is None or isinstance(result.exception, SystemExit), (shown, repr(result.exception))
    assert "Traceback" not in result.output and "Traceback" not in result.stderr, shown
    assert result.exit_code in (0, 1, 2), shown
    if result.exit_code == 2:
        errors = [line for line in result.stderr.splitlines() if line.strip()]
        if errors[0].startswith("Usage: "):  # click's own usage error: its usage line, a hint, one error
            errors = errors[2:]
        assert len(errors) == 1 and "error" in errors[0].lower(), shown


SPECS = [
    "like_sizes.yaml",
    "input_named_y.yaml",
    "name_clash.yaml",
    "binary.yaml",
    "empty.yaml",
    "not_a_mapping.yaml",
    "no_specs",
    "missing.yaml",
    "unrolled_blocks.yaml",
    "upsampling_decoder.yaml",
    "seed3_conv_relu_conv.yaml",
]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("command", ["generate", "docs", "verify", "check"])
def test_every_command_gives_a_result_or_one_line(spec, command, specs, tmp_path):
    path = str(specs[spec])
    arguments = {
        "generate": ["generate", path, "-o", str(tmp_path / "out")],
        "docs": ["docs", path, "-o", str(tmp_path / "out")],
        "verify": ["verify", path],
        "check": ["check", path],
    }[command]
    _one_line_or_result(CliRunner().invoke(main, arguments), arguments)


@pytest.mark.parametrize(
    "spec", ["like_sizes.yaml", "input_named_y.yaml", "name_clash.yaml", "binary.yaml", "no_specs", "missing.yaml"]
)
def test_certify_gives_a_result_or_one_line(spec, specs):
    result = CliRunner().invoke(main, ["certify", str(specs[spec])])
    _one_line_or_result(result, ["certify", spec])
    if spec in ("like_sizes.yaml", "input_named_y.yaml"):  # each linear layer proved: cat too, linear in both
        assert result.exit_code == 0 and "4 certified, 0 failed" in result.output, result.output


@pytest.mark.parametrize(
    "arguments",
    [
        ["trace", "missing.py:Model", "--input", "x=1,3,8,8"],
        ["trace", "{examples}/seed_pytorch.py:Nothing"],
        ["trace", "{examples}/seed_pytorch.py"],
        ["ops"],
        ["ops", "conv9d"],
        ["spec-help"],
        ["init", "{tmp}/spec.yaml"],
        ["init", "{tmp}"],
        ["generate"],
        ["check", "{tmp}/nothing"],
    ],
)
def test_the_other_commands_give_a_result_or_one_line(arguments, tmp_path):
    arguments = [item.format(examples=ROOT / "examples", tmp=tmp_path) for item in arguments]
    _one_line_or_result(CliRunner().invoke(main, arguments), arguments)


def test_an_error_symgrad_did_not_foresee_is_one_line(monkeypatch, specs, tmp_path):
    import symgrad.pipeline

    def broken(*_, **__):
        raise RuntimeError("something deep\nwith a second line")

    monkeypatch.setattr(symgrad.pipeline, "_build", broken)
    result = CliRunner().invoke(main, ["generate", str(specs["like_sizes.yaml"]), "-o", str(tmp_path)])
    _one_line_or_result(result, ["generate"])
    assert (
        result.exit_code == 2 and "RuntimeError: something deep" in result.stderr and "bug in symgrad" in result.stderr
    )


def test_wrt_params_suggests_parameters():
    result = CliRunner().invoke(
        main,
        [
            "trace",
            f"{ROOT / 'examples' / 'seed_pytorch.py'}:ResidualBlock",
            "--input",
            "x=2,4,8,8",
            "--input",
            "target=2,4,8,8",
            "--wrt",
            "params",
        ],
    )
    _one_line_or_result(result, ["trace", "--wrt", "params"])
    assert result.exit_code == 2 and "did you mean 'parameters'?" in result.stderr, result.stderr


def test_a_too_long_block_name_is_said_to_be_too_long_not_an_unknown_key(tmp_path):
    from symgrad.errors import SpecError
    from symgrad.pipeline import build_text

    name = "b" * 65
    text = (ROOT / "examples" / "unrolled_blocks.yaml").read_text().replace("gradient_step", name)
    with pytest.raises(SpecError) as raised:
        build_text(text, "long.yaml")
    message = str(raised.value)
    assert "long.yaml:19:" in message and "65 characters" in message and "unknown key" not in message, message
