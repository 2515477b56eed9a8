"""The ``symgrad`` command line. Exit codes: 0 ok, 1 verification failed or files stale, 2 bad input.

Longer than most modules here because each subcommand's options, help and one-line error handling are
declared beside it; each command's body only calls the library (``pipeline``, ``trace``, ``certify``).
``symgrad trace`` is ``cli_trace.py``; how every command fails in one line is ``cli_errors.py``."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

from . import __version__
from .cli_errors import OneLineErrors, fail
from .cli_trace import trace_command
from .errors import SymgradError
from .write import spec_of

TOLERANCE_FLOAT64 = 1e-12


def _spec_label(path: Path, output: Path) -> str:
    """How generated headers name the spec: relative to the folder the files are written to, so
    ``symgrad check`` finds it from any working directory; the bare name if no such path exists."""
    try:
        label = Path(os.path.relpath(path.resolve(), output.resolve())).as_posix()
    except ValueError:  # another drive
        label = path.name
    return label if " " not in label else path.name


def _expand(paths: tuple[str, ...]) -> list[Path]:
    """The spec files named: each file as given, each folder's ``*.yaml`` and ``*.yml`` files; a
    folder with none is an error (a command that silently did nothing would look like success)."""
    specs = []
    for item in paths:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
            if not found:
                raise SymgradError(
                    f"{path}: error: the folder holds no *.yaml or *.yml spec, so there is nothing "
                    "to do (fix: pass a spec file, or the folder that holds the specs)"
                )
            specs.extend(found)
        else:
            specs.append(path)
    return specs


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="symgrad")
def main() -> None:
    """Explicit, closed-form, differentiable PyTorch gradient code for your model: trace the model to a
    spec, generate its gradient module (with a test and a derivation), train the model with it in Python
    (symgrad.bind), and check in CI that generated files still match their specs.

    \b
    symgrad trace net.py:Net --input x=8,3,32,32 --wrt parameters -o specs/net.yaml
    symgrad generate specs -o gen        # gen/net_gradients.py (+ _eval), their tests and derivations
    symgrad check gen                    # exit 1 when a generated file no longer matches its spec"""


@main.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path())
@click.option(
    "-o",
    "--output",
    "output",
    default="generated",
    show_default=True,
    type=click.Path(),
    help="Directory to write <name>.py, test_<name>.py and <name>.md into.",
)
@click.option("--verify", is_flag=True, help="Compare the generated gradients with torch.autograd in float64.")
@click.option("--force", is_flag=True, help="Overwrite generated files even if they were edited by hand.")
@click.option("--show-derivation", is_flag=True, help="Print the whole derivation document too.")
@click.option("--hvp", is_flag=True, help="Also emit hvp(...): closed-form Hessian-vector products.")
@click.option("--per-sample", is_flag=True, help="Also emit per_sample_gradients(...) (needs reduction: per_sample).")
@click.option("--flat", is_flag=True, help="Write a spec's blocks out instance by instance (one function for all).")
@click.option(
    "--no-recompute",
    is_flag=True,
    help="Keep every value the backward reads, as autograd does "
    "(default: a cheap activation, GELU's or SiLU's output, is computed again from its input, which is "
    "kept; a ReLU output only its own pullback reads is kept as a byte mask; a pooling's input as its "
    "layout). The same as --keep autograd.",
)
@click.option(
    "--keep",
    type=click.Choice(["autograd", "all", "lean"]),
    default=None,
    help="What the forward keeps for the backward: all (the default: every value, but "
    "masks and layouts where those are all it reads), lean (each batch norm's activation "
    "output, a convolution's input, made again in the backward, bit for bit, from the batch "
    "norm's input and statistics), autograd (as --no-recompute).",
)
def generate(specs, output, verify, force, show_derivation, hvp, per_sample, flat, no_recompute, keep):
    """Derive the gradients of each SPEC (a file or a directory of *.yaml) and write the modules."""
    from .pipeline import build

    failed = False
    rendered_all = []
    if no_recompute and keep not in (None, "autograd"):
        fail(ValueError(f"--no-recompute is --keep autograd, not --keep {keep} (fix: drop one of them)"))
    try:
        extras = (("hvp",) if hvp else ()) + (("per_sample",) if per_sample else ())
        for spec_path in _expand(specs):  # derive everything first: a bad spec writes no files
            rendered_all.append(
                (
                    spec_path,
                    build(
                        spec_path,
                        _spec_label(spec_path, Path(output)),
                        extras=extras,
                        flat=flat,
                        recompute=not no_recompute,
                        keep=keep,
                    ),
                )
            )
        _refuse_name_clashes(
            [(spec_path, result.rendered.name) for spec_path, result in rendered_all], Path(output), force
        )
    except SymgradError as error:
        fail(error)
    from .write import write_files

    for spec_path, result in rendered_all:
        try:
            written = write_files(result.rendered, Path(output), force=force)
        except SymgradError as error:
            fail(error)
        click.echo(f"{spec_path.as_posix()}: {result.rendered.name}")
        for warning in _zero_gradient_warnings(result):
            click.echo(warning, err=True)
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
            try:
                report = run_verify(result.graph, module, result.shapes)
            except SymgradError as error:
                fail(error)
            ok = report.worst() <= TOLERANCE_FLOAT64
            failed |= not ok
            shapes = "; ".join(", ".join(f"{k}{list(v)}" for k, v in s.items()) for s in result.shapes)
            click.echo(f"  verify (float64, random cotangent, inputs by role, shapes {shapes}):")
            if report.problem:
                click.echo(f"    FAILED: {report.problem}")
            else:
                click.echo(f"    forward vs torch.nn.functional reference: rel error {report.forward_error:.2e}")
                for name, error in report.gradient_errors.items():
                    click.echo(
                        f"    grad {name}: rel error {error:.2e} vs torch.autograd.grad "
                        f"[{'ok' if error <= TOLERANCE_FLOAT64 else 'FAILED'}]"
                    )
    sys.exit(1 if failed else 0)


def _refuse_name_clashes(named: list[tuple[Path, str]], output: Path, force: bool) -> None:
    """Two specs with one ``name:`` would write the same files: refuse, naming both, whether both are
    in this call or one was generated into ``output`` before (its header names its spec)."""
    from .write import read_generated, read_header

    seen: dict[str, Path] = {}
    for spec_path, name in named:
        spec = spec_path.resolve()
        if name in seen and seen[name] != spec:
            raise SymgradError(
                f"error: {seen[name]} and {spec} both have name: {name}, so both would write "
                f"{output / name}.py (fix: give one of them another name:)"
            )
        seen[name] = spec
        existing = output / f"{name}.py"
        parsed = read_header(read_generated(existing)) if existing.is_file() else None
        other = spec_of(existing, parsed[0]["spec"]).resolve() if parsed else None
        if other is not None and not force and other != spec and other.is_file():  # a renamed spec is no clash
            raise SymgradError(
                f"error: {existing} was generated from {other}, "
                f"and {spec} has the same name: {name} (fix: give one of them another name:, "
                "write to another folder with -o, or pass --force to replace it)"
            )


@main.command()
@click.argument("paths", nargs=-1, type=click.Path())
def check(paths):
    """Exit 1 and list stale files when generated files no longer match their specs (default: generated/).

    Exit 2 when there is nothing to check: a missing folder, or no file that symgrad generated."""
    from .stale import check as stale_files

    checked, stale = stale_files(paths or ("generated",))
    for line in stale:
        click.echo(line, err=True)
    if stale:
        sys.exit(1)
    click.echo(f"{checked} generated files are up to date")


@main.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path())
@click.option(
    "-o",
    "--output",
    "output",
    default="generated",
    show_default=True,
    type=click.Path(),
    help="Directory to write <name>.md and <name>.html into.",
)
@click.option("--force", is_flag=True, help="Overwrite documents even if they were edited by hand.")
def docs(specs, output, force):
    """Write only the derivation documents (Markdown and HTML) of each SPEC."""
    from .emit import DOCUMENTS, Rendered
    from .pipeline import build
    from .write import write_files

    try:
        built = [build(path, _spec_label(path, Path(output))) for path in _expand(specs)]
        for result in built:
            names = [pattern.format(name=result.rendered.name) for pattern in DOCUMENTS]
            documents = Rendered(result.rendered.name, {name: result.rendered.files[name] for name in names}, [])
            for path in write_files(documents, Path(output), force=force):
                click.echo(f"wrote {path}")
    except SymgradError as error:
        fail(error)


@main.command(name="verify")
@click.argument("spec", type=click.Path())
@click.option(
    "--float32-shapes",
    type=click.Choice(["spec", "small"]),
    default="spec",
    show_default=True,
    help="Shapes for the float32 accuracy column: the spec's own, or the small test shapes.",
)
def verify_command(spec, float32_shapes):
    """Compare SPEC's generated gradients with torch.autograd and print a table per gradient."""
    from .check import accuracy_table, module_from_source
    from .pipeline import build

    try:
        result = build(spec, Path(spec).as_posix())
    except SymgradError as error:
        fail(error)
    module = module_from_source(result.rendered.files[f"{result.rendered.name}.py"], result.rendered.name)
    shapes32 = {node.name: node.shape for node in result.graph.inputs} if float32_shapes == "spec" else result.shapes[0]
    started = time.perf_counter()

    def progress(message: str) -> None:
        click.echo(f"[{time.perf_counter() - started:5.1f} s] {message}", err=True)

    for warning in _zero_gradient_warnings(result):
        click.echo(warning, err=True)
    try:
        table = accuracy_table(
            result.graph, module, result.shapes, shapes32, progress=progress, tolerance=TOLERANCE_FLOAT64
        )
    except SymgradError as error:
        fail(error)
    rows = table.rows
    header = (
        "gradient",
        "float64 vs autograd",
        "float32 vs float64",
        "autograd float32 vs float64",
        "gradcheck",
        "gradgradcheck",
    )
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in range(len(header))]
    click.echo("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    click.echo(
        "float64: largest-entry error, random cotangent, small shapes; float32: 2-norm error against float64 "
        f"at the {float32_shapes} shapes; errors relative to the larger of the gradient's own size and all "
        "gradients' typical size; inputs drawn by role; gradcheck and gradgradcheck through the explicit "
        "backward at small shapes, on the first, middle and last differentiated input."
    )
    for problem in table.problems:
        click.echo(f"FAILED: {problem}")
    sys.exit(1 if table.problems else 0)


def _zero_gradient_warnings(result) -> list[str]:
    from .roles import zero_by_structure

    return [
        f"warning: {result.spec_label}: the gradient of {name} is zero by structure: {why}"
        for name, why in zero_by_structure(result.graph).items()
    ]


STARTER_SPEC = """\
# A symgrad spec: a layer chain, a loss, and the tensors to differentiate by.
# Generate with `symgrad generate spec.yaml`; `symgrad spec-help` prints the format.
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
    from .write import write_text

    target = Path(path)
    if target.exists() and not force:
        click.echo(f"error: {target} already exists (fix: choose another path or pass --force)", err=True)
        sys.exit(2)
    try:
        write_text(target, STARTER_SPEC)
    except SymgradError as error:
        fail(error)
    click.echo(f"wrote {target}; next: symgrad generate {target} --verify")


@main.command()
@click.argument("specs", nargs=-1, type=click.Path())
def certify(specs):
    """Prove, exactly, that emitted linear adjoints are transposes: of the rules each SPEC uses, at its
    arguments (small shapes), or with no SPEC of every rule's built-in cases. Ends with a summary line."""
    started = time.perf_counter()
    certified, failed, too_large = 0, 0, 0
    if specs:
        from .certify import certify_spec
        from .pipeline import build

        try:
            built = [build(path, Path(path).as_posix()) for path in _expand(specs)]
        except SymgradError as error:
            fail(error)
        for result in built:
            for layer in certify_spec(result.graph):
                if layer.entries:
                    certified += 1
                    click.echo(
                        f"certified  {result.spec_label}: {layer.label}: adjoint = transpose of PyTorch's "
                        f"forward ({layer.entries} entries), residual 0"
                    )
                elif layer.too_large:
                    too_large += 1
                    click.echo(f"TOO LARGE  {result.spec_label}: {layer.label}: {layer.problem}")
                else:
                    failed += 1
                    click.echo(f"FAILED     {result.spec_label}: {layer.problem}")
    else:
        for attempt in _registry_certificates():
            try:
                message = attempt()
                certified += 1
                click.echo(f"certified  {message}")
            except AssertionError as error:
                failed += 1
                click.echo(f"FAILED     {error}")
    click.echo(
        f"{certified} certified, {failed} failed, {too_large} too large to certify exactly, "
        f"in {time.perf_counter() - started:.1f} s"
    )
    if certified == 0 and failed == 0 and too_large == 0:
        click.echo("error: nothing to certify: the specs have no linear layer", err=True)
        sys.exit(2)
    sys.exit(1 if failed or too_large else 0)


def _registry_certificates():
    """One callable per built-in certificate case; each returns its success line or raises AssertionError."""
    from .certify import CASES, LINEAR_CASES, certify as prove, certify_linear

    def conv_case(case):
        input_entries, weight_entries = prove(case)
        return (
            f"{case.label}: input adjoint = A(w)^T ({input_entries} entries), "
            f"weight adjoint = W(x)^T ({weight_entries} entries), residual 0"
        )

    def linear_case(label, inputs, layer, linear):
        entries = certify_linear(label, inputs, layer, linear)
        return (
            f"{label}: adjoint of {', '.join(linear)} = transpose of PyTorch's forward ({entries} entries), residual 0"
        )

    return [lambda case=case: conv_case(case) for case in CASES] + [
        lambda item=item: linear_case(*item) for item in LINEAR_CASES
    ]


main.add_command(trace_command)  # symgrad trace (symgrad/cli_trace.py)


@main.command(name="spec-help")
@click.option("--ops", "show_ops", is_flag=True, help="Print the table of supported ops instead.")
def spec_help(show_ops):
    """Print the spec format reference (docs/spec.md, shipped in the package)."""
    from importlib import resources

    click.echo(
        resources.files("symgrad.docs").joinpath("ops.md" if show_ops else "spec.md").read_text("utf-8"), nl=False
    )


@main.command()
@click.option("--markdown", is_flag=True, help="Print the table as Markdown (docs/ops.md is this output).")
def ops(markdown):
    """List the supported ops: forward formula and local gradient, from the rule registry."""
    from .rules import all_rules

    if markdown:
        click.echo(
            "# Supported ops\n\nGenerated by `symgrad ops --markdown` from the rule registry; "
            "seed 001's operation / forward / backward table.\n"
        )
        click.echo("| op | forward | backward (local gradient) |\n|---|---|---|")
    for rule in all_rules():
        name, forward, backward = rule.table_row()
        if markdown:
            cells = [cell.replace("|", "\\|") for cell in (name, forward, backward)]
            click.echo(f"| `{cells[0]}` | {cells[1]} | {cells[2]} |")
        else:
            click.echo(f"{name}\n  forward:  {forward}\n  backward: {backward}")
