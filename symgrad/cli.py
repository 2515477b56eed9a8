"""The ``symgrad`` command line. Exit codes: 0 ok, 1 verification failed or files stale, 2 bad input."""

from __future__ import annotations

import os
import re
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
@click.option("--hvp", is_flag=True, help="Also emit hvp(...): closed-form Hessian-vector products.")
@click.option("--per-sample", is_flag=True, help="Also emit per_sample_gradients(...) (needs reduction: per_sample).")
def generate(specs, output, verify, force, show_derivation, hvp, per_sample):
    """Derive the gradients of each SPEC (a file or a directory of *.yaml) and write the modules."""
    from .pipeline import build

    failed = False
    rendered_all = []
    try:
        for spec_path in _expand(specs):  # derive everything first: a bad spec writes no files
            extras = (("hvp",) if hvp else ()) + (("per_sample",) if per_sample else ())
            rendered_all.append(build(spec_path, _spec_label(spec_path), extras=extras))
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
        extras = tuple(fields["extras"].split(",")) if fields.get("extras") else ()
        try:
            result = build(spec_path, fields["spec"], extras=extras)
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
@click.argument("specs", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", "output", default="generated", show_default=True, type=click.Path(file_okay=False),
              help="Directory to write <name>.md and <name>.html into.")
@click.option("--force", is_flag=True, help="Overwrite documents even if they were edited by hand.")
def docs(specs, output, force):
    """Write only the derivation documents (Markdown and HTML) of each SPEC."""
    from .emit import DOCUMENTS, Rendered, write_files
    from .pipeline import build

    try:
        built = [build(path, _spec_label(path)) for path in _expand(specs)]
        for result in built:
            names = [pattern.format(name=result.rendered.name) for pattern in DOCUMENTS]
            documents = Rendered(result.rendered.name, {name: result.rendered.files[name] for name in names}, [])
            for path in write_files(documents, Path(output), force=force):
                click.echo(f"wrote {path}")
    except SymgradError as error:
        _fail(error)


@main.command(name="verify")
@click.argument("spec", type=click.Path())
@click.option("--float32-shapes", type=click.Choice(["spec", "small"]), default="spec", show_default=True,
              help="Shapes for the float32 accuracy column: the spec's own, or the small test shapes.")
def verify_command(spec, float32_shapes):
    """Compare SPEC's generated gradients with torch.autograd and print a table per gradient."""
    from .check import accuracy_table, module_from_source
    from .pipeline import build

    try:
        result = build(spec, _spec_label(Path(spec)))
    except SymgradError as error:
        _fail(error)
    module = module_from_source(result.rendered.files[f"{result.rendered.name}.py"], result.rendered.name)
    shapes32 = {node.name: node.shape for node in result.graph.inputs} if float32_shapes == "spec" else result.shapes[0]
    rows = accuracy_table(result.graph, module, result.shapes, shapes32)
    header = ("gradient", "float64 vs autograd", "float32 vs float64", "autograd float32 vs float64", "gradcheck",
              "gradgradcheck")
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in range(len(header))]
    click.echo("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    click.echo("float64: max relative error, random cotangent, small shapes; float32: relative error in the 2-norm "
               f"at the {float32_shapes} shapes; checks through the explicit backward at small shapes.")
    failed = any(float(row[1]) > TOLERANCE_FLOAT64 or row[4] != "pass" or row[5] != "pass" for row in rows)
    sys.exit(1 if failed else 0)


STARTER_SPEC = """\
# A symgrad spec: a layer chain, a loss, and the tensors to differentiate by.
# Generate with `symgrad generate spec.yaml`; the format is in docs/spec.md.
name: my_gradients               # the module name (a Python identifier)
inputs:                          # every tensor, with an example shape, in argument order
  x: {shape: [8, 3, 64, 64]}
  w1: {shape: [16, 3, 3, 3]}
  w2: {shape: [3, 16, 3, 3]}
  y: {shape: [8, 3, 64, 64]}
layers:                          # torch.nn.functional names and argument names
  - {op: conv2d, weight: w1, padding: 1, out: h}     # reads x, the first input
  - {op: relu, out: a}                               # reads the previous layer
  - {op: conv2d, weight: w2, padding: 1, out: r}
  - {op: add, in: [r, x], out: p}                    # a skip connection: gradients add up
loss: {op: half_sq_error, in: p, target: y, reduction: per_sample}   # sum, mean or per_sample
wrt: [x, w1, w2]                 # gradients to derive, returned in this order
"""


@main.command()
@click.argument("path", default="spec.yaml", type=click.Path(dir_okay=False))
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def init(path, force):
    """Write a commented starter spec to PATH (default spec.yaml)."""
    target = Path(path)
    if target.exists() and not force:
        click.echo(f"error: {target} already exists (fix: choose another path or pass --force)", err=True)
        sys.exit(2)
    target.write_text(STARTER_SPEC, encoding="utf-8")
    click.echo(f"wrote {target}; next: symgrad generate {target} --verify")


@main.command()
def certify():
    """Prove, exactly, that every emitted linear adjoint is the transpose (see symgrad/certify.py)."""
    from .certify import CASES, LINEAR_CASES, certify as prove, certify_linear

    failed = False
    for case in CASES:
        try:
            input_entries, weight_entries = prove(case)
            click.echo(f"certified  {case.label}: input adjoint = A(w)^T ({input_entries} entries), "
                       f"weight adjoint = W(x)^T ({weight_entries} entries), residual 0")
        except AssertionError as error:
            failed = True
            click.echo(f"FAILED     {error}")
    for label, inputs, layer, linear in LINEAR_CASES:
        try:
            entries = certify_linear(label, inputs, layer, linear)
            click.echo(f"certified  {label}: adjoint of {', '.join(linear)} = transpose of PyTorch's forward "
                       f"({entries} entries), residual 0")
        except AssertionError as error:
            failed = True
            click.echo(f"FAILED     {error}")
    sys.exit(1 if failed else 0)


@main.command(name="trace")
@click.argument("target")
@click.option("--shape", "shapes", multiple=True, required=True, metavar="NAME=D0,D1,...",
              help="Shape of an argument; repeat for each argument.")
@click.option("--wrt", default=None, help="Comma-separated tensors to differentiate by (default: the arguments).")
@click.option("--name", "spec_name", default=None, help="Module name for the spec (default: NAME_gradients).")
@click.option("-o", "--output", default="-", type=click.Path(dir_okay=False), help="Spec file to write (default: stdout).")
def trace_command(target, shapes, wrt, spec_name, output):
    """Turn a PyTorch function or nn.Module (FILE.py:NAME) into a spec."""
    from .trace import load_target, trace

    try:
        parsed = {}
        for item in shapes:
            name, _, sizes = item.partition("=")
            try:
                parsed[name] = tuple(int(size) for size in sizes.split(","))
            except ValueError:
                raise SymgradError(f"error: --shape {item!r} is not NAME=D0,D1,... (fix: write e.g. x=8,3,32,32)") from None
        function, files = load_target(target)
        name = spec_name or re.sub(r"\W", "_", target.rsplit(":", 1)[1]).lower() + "_gradients"
        text = trace(function, parsed, wrt.split(",") if wrt else None, name, files)
    except SymgradError as error:
        _fail(error)
    if output == "-":
        click.echo(text, nl=False)
    else:
        Path(output).write_text(text, encoding="utf-8")
        click.echo(f"wrote {output}; next: symgrad generate {output} --verify")


@main.command()
@click.option("--markdown", is_flag=True, help="Print the table as Markdown (docs/ops.md is this output).")
def ops(markdown):
    """List the supported ops: forward formula and local gradient, from the rule registry."""
    from .rules import all_rules

    if markdown:
        click.echo("# Supported ops\n\nGenerated by `symgrad ops --markdown` from the rule registry; "
                   "seed 001's operation / forward / backward table.\n")
        click.echo("| op | forward | backward (local gradient) |\n|---|---|---|")
    for rule in all_rules():
        name, forward, backward = rule.table_row()
        if markdown:
            cells = [cell.replace("|", "\\|") for cell in (name, forward, backward)]
            click.echo(f"| `{cells[0]}` | {cells[1]} | {cells[2]} |")
        else:
            click.echo(f"{name}\n  forward:  {forward}\n  backward: {backward}")
