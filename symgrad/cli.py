"""The ``symgrad`` command line. Exit codes: 0 ok, 1 verification failed or files stale, 2 bad input.

Longer than most modules here because each subcommand's options, help and one-line error handling are
declared beside it; each command's body only calls the library (``pipeline``, ``trace``, ``certify``)."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import click

from . import __version__
from .errors import SymgradError
from .write import spec_of

LOSS_CHOICES = ("mse", "half_sq_error", "l1", "smooth_l1", "huber", "cross_entropy", "nll")
"""``symgrad trace --loss`` values (``trace.LOSS_NAMES`` maps them to the spec's loss ops)."""

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
                raise SymgradError(f"{path}: error: the folder holds no *.yaml or *.yml spec, so there is nothing "
                                   "to do (fix: pass a spec file, or the folder that holds the specs)")
            specs.extend(found)
        else:
            specs.append(path)
    return specs


def _fail(error: Exception) -> None:
    click.echo(str(error) if isinstance(error, SymgradError) else f"error: {error}", err=True)
    sys.exit(2)


class _OneLineErrors(click.Group):
    """Every command gives a result or a one-line error, never a traceback: an error symgrad did not
    foresee is said in one line, as its own (``SYMGRAD_TRACEBACK=1`` shows where it was raised)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort, SystemExit,
                KeyboardInterrupt):
            raise
        except SymgradError as error:
            _fail(error)
        except Exception as error:  # noqa: BLE001 - said in one line, as asked
            if os.environ.get("SYMGRAD_TRACEBACK"):
                raise
            first = (str(error).strip().splitlines() or [""])[0][:300]
            click.echo(f"error: symgrad {ctx.invoked_subcommand or ''} failed: {type(error).__name__}: {first} (fix: "
                       "this is a bug in symgrad: please report it with the command and its spec; "
                       "SYMGRAD_TRACEBACK=1 shows where)", err=True)
            sys.exit(2)


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
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
@click.option("-o", "--output", "output", default="generated", show_default=True, type=click.Path(),
              help="Directory to write <name>.py, test_<name>.py and <name>.md into.")
@click.option("--verify", is_flag=True, help="Compare the generated gradients with torch.autograd in float64.")
@click.option("--force", is_flag=True, help="Overwrite generated files even if they were edited by hand.")
@click.option("--show-derivation", is_flag=True, help="Print the whole derivation document too.")
@click.option("--hvp", is_flag=True, help="Also emit hvp(...): closed-form Hessian-vector products.")
@click.option("--per-sample", is_flag=True, help="Also emit per_sample_gradients(...) (needs reduction: per_sample).")
@click.option("--flat", is_flag=True, help="Write a spec's blocks out instance by instance (one function for all).")
@click.option("--no-recompute", is_flag=True, help="Keep every value the backward reads, as autograd does "
              "(default: a cheap activation, GELU's or SiLU's output, is computed again from its input, which is "
              "kept; a ReLU output only its own pullback reads is kept as a byte mask; a pooling's input as its "
              "layout). The same as --keep autograd.")
@click.option("--keep", type=click.Choice(["autograd", "all", "lean"]), default=None,
              help="What the forward keeps for the backward: all (the default: every value, but "
              "masks and layouts where those are all it reads), lean (each batch norm's activation "
              "output, a convolution's input, made again in the backward, bit for bit, from the batch "
              "norm's input and statistics), autograd (as --no-recompute).")
def generate(specs, output, verify, force, show_derivation, hvp, per_sample, flat, no_recompute, keep):
    """Derive the gradients of each SPEC (a file or a directory of *.yaml) and write the modules."""
    from .pipeline import build

    failed = False
    rendered_all = []
    if no_recompute and keep not in (None, "autograd"):
        _fail(ValueError(f"--no-recompute is --keep autograd, not --keep {keep} "
                         "(fix: drop one of them)"))
    try:
        extras = (("hvp",) if hvp else ()) + (("per_sample",) if per_sample else ())
        for spec_path in _expand(specs):  # derive everything first: a bad spec writes no files
            rendered_all.append((spec_path, build(spec_path, _spec_label(spec_path, Path(output)), extras=extras,
                                                  flat=flat, recompute=not no_recompute, keep=keep)))
        _refuse_name_clashes([(spec_path, result.rendered.name) for spec_path, result in rendered_all],
                             Path(output), force)
    except SymgradError as error:
        _fail(error)
    from .write import write_files

    for spec_path, result in rendered_all:
        try:
            written = write_files(result.rendered, Path(output), force=force)
        except SymgradError as error:
            _fail(error)
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
                _fail(error)
            ok = report.worst() <= TOLERANCE_FLOAT64
            failed |= not ok
            shapes = "; ".join(", ".join(f"{k}{list(v)}" for k, v in s.items()) for s in result.shapes)
            click.echo(f"  verify (float64, random cotangent, inputs by role, shapes {shapes}):")
            if report.problem:
                click.echo(f"    FAILED: {report.problem}")
            else:
                click.echo(f"    forward vs torch.nn.functional reference: rel error {report.forward_error:.2e}")
                for name, error in report.gradient_errors.items():
                    click.echo(f"    grad {name}: rel error {error:.2e} vs torch.autograd.grad "
                               f"[{'ok' if error <= TOLERANCE_FLOAT64 else 'FAILED'}]")
    sys.exit(1 if failed else 0)


def _refuse_name_clashes(named: list[tuple[Path, str]], output: Path, force: bool) -> None:
    """Two specs with one ``name:`` would write the same files: refuse, naming both, whether both are
    in this call or one was generated into ``output`` before (its header names its spec)."""
    from .write import read_generated, read_header

    seen: dict[str, Path] = {}
    for spec_path, name in named:
        spec = spec_path.resolve()
        if name in seen and seen[name] != spec:
            raise SymgradError(f"error: {seen[name]} and {spec} both have name: {name}, so both would write "
                               f"{output / name}.py (fix: give one of them another name:)")
        seen[name] = spec
        existing = output / f"{name}.py"
        parsed = read_header(read_generated(existing)) if existing.is_file() else None
        other = spec_of(existing, parsed[0]["spec"]).resolve() if parsed else None
        if other is not None and not force and other != spec and other.is_file():  # a renamed spec is no clash
            raise SymgradError(f"error: {existing} was generated from {other}, "
                               f"and {spec} has the same name: {name} (fix: give one of them another name:, "
                               "write to another folder with -o, or pass --force to replace it)")


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
@click.option("-o", "--output", "output", default="generated", show_default=True, type=click.Path(),
              help="Directory to write <name>.md and <name>.html into.")
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
        result = build(spec, Path(spec).as_posix())
    except SymgradError as error:
        _fail(error)
    module = module_from_source(result.rendered.files[f"{result.rendered.name}.py"], result.rendered.name)
    shapes32 = {node.name: node.shape for node in result.graph.inputs} if float32_shapes == "spec" else result.shapes[0]
    started = time.perf_counter()

    def progress(message: str) -> None:
        click.echo(f"[{time.perf_counter() - started:5.1f} s] {message}", err=True)

    for warning in _zero_gradient_warnings(result):
        click.echo(warning, err=True)
    try:
        table = accuracy_table(result.graph, module, result.shapes, shapes32, progress=progress,
                               tolerance=TOLERANCE_FLOAT64)
    except SymgradError as error:
        _fail(error)
    rows = table.rows
    header = ("gradient", "float64 vs autograd", "float32 vs float64", "autograd float32 vs float64", "gradcheck",
              "gradgradcheck")
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in range(len(header))]
    click.echo("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    click.echo("float64: largest-entry error, random cotangent, small shapes; float32: 2-norm error against float64 "
               f"at the {float32_shapes} shapes; errors relative to the larger of the gradient's own size and all "
               "gradients' typical size; inputs drawn by role; gradcheck and gradgradcheck through the explicit "
               "backward at small shapes, on the first, middle and last differentiated input.")
    for problem in table.problems:
        click.echo(f"FAILED: {problem}")
    sys.exit(1 if table.problems else 0)


def _zero_gradient_warnings(result) -> list[str]:
    from .roles import zero_by_structure

    return [f"warning: {result.spec_label}: the gradient of {name} is zero by structure: {why}"
            for name, why in zero_by_structure(result.graph).items()]


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
        _fail(error)
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
            _fail(error)
        for result in built:
            for layer in certify_spec(result.graph):
                if layer.entries:
                    certified += 1
                    click.echo(f"certified  {result.spec_label}: {layer.label}: adjoint = transpose of PyTorch's "
                               f"forward ({layer.entries} entries), residual 0")
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
    click.echo(f"{certified} certified, {failed} failed, {too_large} too large to certify exactly, "
               f"in {time.perf_counter() - started:.1f} s")
    if certified == 0 and failed == 0 and too_large == 0:
        click.echo("error: nothing to certify: the specs have no linear layer", err=True)
        sys.exit(2)
    sys.exit(1 if failed or too_large else 0)


def _registry_certificates():
    """One callable per built-in certificate case; each returns its success line or raises AssertionError."""
    from .certify import CASES, LINEAR_CASES, certify as prove, certify_linear

    def conv_case(case):
        input_entries, weight_entries = prove(case)
        return (f"{case.label}: input adjoint = A(w)^T ({input_entries} entries), "
                f"weight adjoint = W(x)^T ({weight_entries} entries), residual 0")

    def linear_case(label, inputs, layer, linear):
        entries = certify_linear(label, inputs, layer, linear)
        return f"{label}: adjoint of {', '.join(linear)} = transpose of PyTorch's forward ({entries} entries), residual 0"

    return ([lambda case=case: conv_case(case) for case in CASES]
            + [lambda item=item: linear_case(*item) for item in LINEAR_CASES])


@main.command(name="trace")
@click.argument("target")
@click.option("--input", "--shape", "inputs", multiple=True, metavar="NAME=D0,D1,...",
              help="A tensor argument's shape (NAME=int64:D0,... for class labels); repeat for each.")
@click.option("--arg", "values", multiple=True, metavar="NAME=VALUE", help="A non-tensor argument (a number, string, list).")
@click.option("--init", default=None, metavar="'NAME=VALUE,...'", help="Arguments for building an nn.Module class.")
@click.option("--loss", "loss_kind", default=None, type=click.Choice(sorted(LOSS_CHOICES)),
              help="Put this loss after a forward that returns its prediction.")
@click.option("--target", "target_name", default="target", show_default=True, help="The target's input name (with --loss).")
@click.option("--reduction", default=None, type=click.Choice(["sum", "mean", "per_sample"]),
              help="The --loss reduction (default: PyTorch's, mean; sum for half_sq_error).")
@click.option("--eval", "eval_mode", is_flag=True, help="Trace every submodule in eval mode, as model.eval() sets it "
              "(running statistics as inputs), whatever mode the model set; one spec.")
@click.option("--train", "train_mode", is_flag=True, help="Trace every submodule in train mode, as model.train() sets it "
              "(batch statistics), whatever mode the model set; one spec.")
@click.option("--modes", "module_modes", default=None, metavar="'PATH=eval,...'",
              help="Set submodules' modes after model.train() (model.eval() with --eval), in order: backbone=eval "
              "traces a frozen backbone (its BatchNorm keeps its running statistics).")
@click.option("--wrt", default=None, help="Comma-separated tensors to differentiate by (default: arguments and parameters), "
              "or `parameters`: the parameters alone, as a training step (symgrad.bind) needs.")
@click.option("--name", "spec_name", default=None, help="Module name for the spec (default: NAME_gradients).")
@click.option("-o", "--output", default="-", type=click.Path(dir_okay=False), help="Spec file to write (default: stdout).")
@click.option("--timeout", default=None, type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Stop with an error if tracing takes longer than this.")
@click.option("--flat", is_flag=True, help="Every layer inline, instead of one block per repeated submodule class.")
def trace_command(target, inputs, values, init, loss_kind, target_name, reduction, eval_mode, train_mode, module_modes,
                  wrt, spec_name, output, timeout, flat):
    """Turn a PyTorch function or nn.Module (FILE.py:NAME) into a spec.

    Without --train or --eval the model is traced as it sets its modes, each submodule in its own
    (self.backbone.eval() in __init__: a frozen backbone); a model that returns its outputs is traced in
    its other mode too, as a whole (model.eval(), or model.train() where its root is in eval mode), and
    symgrad.bind runs whichever the model's modes are in."""
    from .trace import LOSS_NAMES, LossChoice, TraceError, load_target, trace

    try:
        if eval_mode and train_mode:
            raise TraceError("error: --eval and --train both given (fix: choose one)")
        shapes, dtypes = {}, {}
        for item in inputs:
            name, _, sizes = item.partition("=")
            dtype, _, sizes = sizes.rpartition(":")
            try:
                shapes[name] = tuple(int(size) for size in sizes.split(","))
            except ValueError:
                raise TraceError(f"error: --input {item!r} is not NAME=D0,D1,... (fix: write e.g. x=8,3,32,32 "
                                 "or labels=int64:8)") from None
            if dtype not in ("", "float32", "int64"):
                raise TraceError(f"error: --input {item!r} has dtype {dtype!r} (fix: use int64 for labels, or no dtype)")
            if dtype == "int64":
                dtypes[name] = "int64"
        if not shapes:
            raise TraceError("error: no --input given (fix: pass each tensor argument's shape, e.g. --input x=8,3,32,32)")
        arguments = dict(_literal_pair(item, "--arg") for item in values)
        init_arguments = dict(_literal_pair(item, "--init") for item in _split_top_level(init)) if init else None
        function = load_target(target, init_arguments)
        if module_modes is not None:  # the whole model in the flag's mode, then each entry
            from .modes import apply_modes

            apply_modes(function, module_modes, evaluation=eval_mode)
        loss = LossChoice(LOSS_NAMES[loss_kind], target_name, reduction) if loss_kind else None
        name = spec_name or re.sub(r"\W", "_", target.rsplit(":", 1)[1]).lower() + "_gradients"
        mode = "eval" if eval_mode else "train" if train_mode else None
        wrt_list = (wrt if wrt == "parameters" else wrt.split(",")) if wrt else None
        evaluation = None
        import torch

        if loss is None and mode is None and isinstance(function, torch.nn.Module):  # as set, and the other mode
            from .trace import trace_modes

            text, evaluation = trace_modes(function, shapes, wrt_list, name, arguments=arguments, dtypes=dtypes,
                                           timeout=timeout, blocks=not flat)
        else:
            text = trace(function, shapes, wrt_list, name, loss=loss, arguments=arguments, dtypes=dtypes,
                         mode=mode if module_modes is None else None, timeout=timeout, blocks=not flat)
        from .retrace import options_line, with_options  # what bind's refusals print to trace it again

        line = options_line(inputs, values, init, loss_kind, target_name, reduction, eval_mode, train_mode,
                            module_modes, wrt, spec_name, timeout, flat)
        text, evaluation = with_options(text, line), evaluation and with_options(evaluation, line)
        if evaluation is not None and output == "-":
            raise TraceError("error: the model runs other layers in eval mode than in train mode (BatchNorm, "
                             "dropout or its outputs), so symgrad writes two specs (fix: pass -o FILE.yaml: the "
                             "eval-mode spec goes beside it as FILE_eval.yaml; or trace one mode with --train or --eval)")
    except SymgradError as error:
        _fail(error)
    if evaluation is not None:
        from .write import write_text

        beside = Path(output).with_name(f"{Path(output).stem}_eval.yaml")
        try:
            write_text(Path(output), text)
            write_text(beside, evaluation)
        except SymgradError as error:
            _fail(error)
        click.echo(f"wrote {output} (train mode) and {beside} (eval mode); next: symgrad generate {output} "
                   f"{beside} -o DIR, then symgrad.bind(DIR/{name}.py, model)")
        return
    if output == "-":
        click.echo(text, nl=False)
    else:
        from .write import write_text

        try:
            write_text(Path(output), text)
        except SymgradError as error:
            _fail(error)
        click.echo(f"wrote {output}; next: symgrad generate {output} --verify")


def _literal_pair(item: str, option: str) -> tuple[str, object]:
    """``NAME=VALUE`` with VALUE a YAML literal (number, string, bool, list): never code. A value for the
    model's own code, not a name: ``relu=off`` is False, as YAML 1.1 reads it (a spec's names read ``off``)."""
    import yaml

    from .trace import TraceError

    name, equals, text = item.partition("=")
    name = name.strip()
    if not equals or not name.isidentifier():
        raise TraceError(f"error: {option} {item!r} is not NAME=VALUE (fix: write e.g. {option} sigma=0.1)")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        raise TraceError(f"error: {option} {item!r}: the value is not a number, string or list "
                         f"(fix: write e.g. {name}=[64, 128])") from None
    if not _plain_literal(value):
        raise TraceError(f"error: {option} {item!r}: the value is not a number, string or list "
                         f"(fix: write e.g. {name}=[64, 128])")
    return name, value


def _plain_literal(value) -> bool:
    if isinstance(value, list):
        return all(_plain_literal(item) for item in value)
    return value is None or isinstance(value, (bool, int, float, str))


def _split_top_level(text: str) -> list[str]:
    """``a=1,b=[2,3]`` into ``a=1`` and ``b=[2,3]``: commas inside brackets stay."""
    parts, depth, current = [], 0, ""
    for character in text:
        if character in "[{(":
            depth += 1
        elif character in "]})":
            depth -= 1
        if character == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += character
    return [part for part in [*parts, current] if part.strip()]


@main.command(name="spec-help")
@click.option("--ops", "show_ops", is_flag=True, help="Print the table of supported ops instead.")
def spec_help(show_ops):
    """Print the spec format reference (docs/spec.md, shipped in the package)."""
    from importlib import resources

    click.echo(resources.files("symgrad.docs").joinpath("ops.md" if show_ops else "spec.md").read_text("utf-8"), nl=False)


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
