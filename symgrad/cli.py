"""The ``symgrad`` command line. Exit codes: 0 ok, 1 verification failed or files stale, 2 bad input."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from . import __version__
from .errors import SymgradError

TOLERANCE_FLOAT64 = 1e-12


def _spec_label(path: Path) -> str:
    """How the spec is named in generated headers: relative to the working directory when possible."""
    try:
        label = os.path.relpath(path)
    except ValueError:
        label = path.name
    label = Path(label).as_posix()
    return label if not label.startswith("../") and " " not in label else path.name


def _expand(paths: tuple[str, ...]) -> list[Path]:
    specs = []
    for item in paths:
        path = Path(item)
        if path.is_dir():
            specs.extend(sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml")))
        else:
            specs.append(path)
    return specs


def _fail(error: Exception) -> None:
    click.echo(str(error) if isinstance(error, SymgradError) else f"error: {error}", err=True)
    sys.exit(2)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="symgrad")
def main() -> None:
    """Explicit, closed-form, differentiable PyTorch gradients for layer chains described in YAML."""


@main.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", "output", default="generated", show_default=True, type=click.Path(file_okay=False),
              help="Directory to write <name>.py, test_<name>.py and <name>.md into.")
@click.option("--verify", is_flag=True, help="Compare the generated gradients with torch.autograd in float64.")
@click.option("--force", is_flag=True, help="Overwrite generated files even if they were edited by hand.")
@click.option("--show-derivation", is_flag=True, help="Print the whole derivation document too.")
def generate(specs, output, verify, force, show_derivation):
    """Derive the gradients of each SPEC (a file or a directory of *.yaml) and write the modules."""
    from .pipeline import build

    failed = False
    rendered_all = []
    try:
        for spec_path in _expand(specs):  # derive everything first: a bad spec writes no files
            rendered_all.append(build(spec_path, _spec_label(spec_path)))
    except SymgradError as error:
        _fail(error)
    from .emit import write_files

    for result in rendered_all:
        try:
            written = write_files(result.rendered, Path(output), force=force)
        except SymgradError as error:
            _fail(error)
        click.echo(f"{result.spec_label}: {result.rendered.name}")
        click.echo("  forward:")
        for line in result.forward_text:
            click.echo(f"    {line}")
        click.echo("  backward:")
        for line in result.rendered.summary:
            click.echo(f"    {line}")
        click.echo("  wrote: " + ", ".join(str(path) for path in written))
        if show_derivation:
            click.echo(result.rendered.files[f"{result.rendered.name}.md"])
        if verify:
            from .check import load_module, verify as run_verify

            module = load_module(Path(output) / f"{result.rendered.name}.py")
            report = run_verify(result.graph, module, result.shapes)
            ok = report.worst() <= TOLERANCE_FLOAT64
            failed |= not ok
            shapes = "; ".join(", ".join(f"{k}{list(v)}" for k, v in s.items()) for s in result.shapes)
            click.echo(f"  verify (float64, random cotangent, shapes {shapes}):")
            click.echo(f"    forward vs torch.nn.functional reference: max rel error {report.forward_error:.2e}")
            for name, error in report.gradient_errors.items():
                click.echo(f"    grad {name}: max rel error {error:.2e} vs torch.autograd.grad "
                           f"[{'ok' if error <= TOLERANCE_FLOAT64 else 'FAILED'}]")
    sys.exit(1 if failed else 0)


@main.command()
@click.argument("paths", nargs=-1, type=click.Path())
def check(paths):
    """Exit 1 and list stale files when generated files no longer match their specs (default: generated/)."""
    from .emit import read_header
    from .pipeline import build

    files = []
    for item in paths or ("generated",):
        path = Path(item)
        files.extend(sorted(path.glob("*.py")) if path.is_dir() else [path])
    stale = []
    checked = 0
    for path in files:
        parsed = read_header(path.read_text(encoding="utf-8", errors="replace"))
        if parsed is None or path.name.startswith("test_"):
            continue
        fields, _ = parsed
        spec_path = Path(fields["spec"])
        try:
            result = build(spec_path, fields["spec"])
        except SymgradError as error:
            stale.append(f"{path}: its spec {spec_path} no longer builds: {error}")
            continue
        for name, text in result.rendered.files.items():
            target = path.parent / name
            checked += 1
            if not target.exists() or target.read_text(encoding="utf-8") != text:
                stale.append(f"{target}: out of date with {spec_path} (symgrad {__version__}); "
                             f"run `symgrad generate {spec_path} -o {path.parent}`")
    for line in stale:
        click.echo(line, err=True)
    if stale:
        sys.exit(1)
    click.echo(f"{checked} generated files are up to date")


@main.command()
def ops():
    """List the supported ops: forward formula and local gradient."""
    from .rules import all_rules

    for rule in all_rules():
        name, forward, backward = rule.table_row()
        click.echo(f"{name}\n  forward:  {forward}\n  backward: {backward}")
