"""``symgrad trace``: PyTorch code (``FILE.py:NAME``) to a spec, with its options and how they are read
(``--input`` shapes, ``--arg`` and ``--init`` values as YAML literals, never code). ``symgrad.cli`` adds it
to the command group."""

from __future__ import annotations

import re
from pathlib import Path

import click

from .cli_errors import fail
from .errors import SymgradError

LOSS_CHOICES = ("mse", "half_sq_error", "l1", "smooth_l1", "huber", "cross_entropy", "nll")
"""``symgrad trace --loss`` values (``trace.LOSS_NAMES`` maps them to the spec's loss ops)."""


@click.command(name="trace")
@click.argument("target")
@click.option(
    "--input",
    "--shape",
    "inputs",
    multiple=True,
    metavar="NAME=D0,D1,...",
    help="A tensor argument's shape (NAME=int64:D0,... for class labels); repeat for each.",
)
@click.option(
    "--arg", "values", multiple=True, metavar="NAME=VALUE", help="A non-tensor argument (a number, string, list)."
)
@click.option("--init", default=None, metavar="'NAME=VALUE,...'", help="Arguments for building an nn.Module class.")
@click.option(
    "--loss",
    "loss_kind",
    default=None,
    type=click.Choice(sorted(LOSS_CHOICES)),
    help="Put this loss after a forward that returns its prediction.",
)
@click.option(
    "--target", "target_name", default="target", show_default=True, help="The target's input name (with --loss)."
)
@click.option(
    "--reduction",
    default=None,
    type=click.Choice(["sum", "mean", "per_sample"]),
    help="The --loss reduction (default: PyTorch's, mean; sum for half_sq_error).",
)
@click.option(
    "--eval",
    "eval_mode",
    is_flag=True,
    help="Trace every submodule in eval mode, as model.eval() sets it "
    "(running statistics as inputs), whatever mode the model set; one spec.",
)
@click.option(
    "--train",
    "train_mode",
    is_flag=True,
    help="Trace every submodule in train mode, as model.train() sets it "
    "(batch statistics), whatever mode the model set; one spec.",
)
@click.option(
    "--modes",
    "module_modes",
    default=None,
    metavar="'PATH=eval,...'",
    help="Set submodules' modes after model.train() (model.eval() with --eval), in order: backbone=eval "
    "traces a frozen backbone (its BatchNorm keeps its running statistics).",
)
@click.option(
    "--wrt",
    default=None,
    help="Comma-separated tensors to differentiate by (default: arguments and parameters), "
    "or `parameters`: the parameters alone, as a training step (symgrad.bind) needs.",
)
@click.option("--name", "spec_name", default=None, help="Module name for the spec (default: NAME_gradients).")
@click.option(
    "-o", "--output", default="-", type=click.Path(dir_okay=False), help="Spec file to write (default: stdout)."
)
@click.option(
    "--timeout",
    default=None,
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Stop with an error if tracing takes longer than this.",
)
@click.option("--flat", is_flag=True, help="Every layer inline, instead of one block per repeated submodule class.")
@click.option(
    "--explain",
    metavar="NAME",
    is_eager=True,
    expose_value=False,
    callback=lambda context, _, name: explain_and_exit(context, name),
    help="Print how a call (F.conv2d, x.view, torch.add) becomes a layer: "
    "the pre-checks it meets, its handler, the layer op and the rule's file; then exit (no TARGET).",
)
@click.option(
    "--static-sizes",
    is_flag=True,
    help="Trace at these --input sizes alone, for code that follows the "
    "input's size in ways a spec cannot say: the generated code and symgrad.bind refuse any other size.",
)
def trace_command(
    target,
    inputs,
    values,
    init,
    loss_kind,
    target_name,
    reduction,
    eval_mode,
    train_mode,
    module_modes,
    wrt,
    spec_name,
    output,
    timeout,
    flat,
    static_sizes,
):
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
                raise TraceError(
                    f"error: --input {item!r} is not NAME=D0,D1,... (fix: write e.g. x=8,3,32,32 or labels=int64:8)"
                ) from None
            if dtype not in ("", "float32", "int64"):
                raise TraceError(
                    f"error: --input {item!r} has dtype {dtype!r} (fix: use int64 for labels, or no dtype)"
                )
            if dtype == "int64":
                dtypes[name] = "int64"
        if not shapes:
            raise TraceError(
                "error: no --input given (fix: pass each tensor argument's shape, e.g. --input x=8,3,32,32)"
            )
        arguments = dict(literal_pair(item, "--arg") for item in values)
        init_arguments = dict(literal_pair(item, "--init") for item in split_top_level(init)) if init else None
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

            text, evaluation = trace_modes(
                function,
                shapes,
                wrt_list,
                name,
                arguments=arguments,
                dtypes=dtypes,
                timeout=timeout,
                blocks=not flat,
                static_sizes=static_sizes,
            )
        else:
            text = trace(
                function,
                shapes,
                wrt_list,
                name,
                loss=loss,
                arguments=arguments,
                dtypes=dtypes,
                mode=mode if module_modes is None else None,
                timeout=timeout,
                blocks=not flat,
                static_sizes=static_sizes,
            )
        from .retrace import options_line, with_options  # what bind's refusals print to trace it again

        line = options_line(
            inputs,
            values,
            init,
            loss_kind,
            target_name,
            reduction,
            eval_mode,
            train_mode,
            module_modes,
            wrt,
            spec_name,
            timeout,
            flat,
            static_sizes,
        )
        text, evaluation = with_options(text, line), evaluation and with_options(evaluation, line)
        if evaluation is not None and output == "-":
            raise TraceError(
                "error: the model runs other layers in eval mode than in train mode (BatchNorm, "
                "dropout or its outputs), so symgrad writes two specs (fix: pass -o FILE.yaml: the "
                "eval-mode spec goes beside it as FILE_eval.yaml; or trace one mode with --train or --eval)"
            )
    except SymgradError as error:
        fail(error)
    if evaluation is not None:
        from .write import write_text

        beside = Path(output).with_name(f"{Path(output).stem}_eval.yaml")
        try:
            write_text(Path(output), text)
            write_text(beside, evaluation)
        except SymgradError as error:
            fail(error)
        click.echo(
            f"wrote {output} (train mode) and {beside} (eval mode); next: symgrad generate {output} "
            f"{beside} -o DIR, then symgrad.bind(DIR/{name}.py, model)"
        )
        return
    if output == "-":
        click.echo(text, nl=False)
    else:
        from .write import write_text

        try:
            write_text(Path(output), text)
        except SymgradError as error:
            fail(error)
        click.echo(f"wrote {output}; next: symgrad generate {output} --verify")


def explain_and_exit(context: click.Context, name: str | None) -> None:
    """``--explain NAME``: print :func:`symgrad.trace.explain.explain` and exit."""
    if name is None or context.resilient_parsing:
        return
    from .trace.explain import explain

    click.echo(explain(name), nl=False)
    context.exit(0)


def literal_pair(item: str, option: str) -> tuple[str, object]:
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
        raise TraceError(
            f"error: {option} {item!r}: the value is not a number, string or list (fix: write e.g. {name}=[64, 128])"
        ) from None
    if not plain_literal(value):
        raise TraceError(
            f"error: {option} {item!r}: the value is not a number, string or list (fix: write e.g. {name}=[64, 128])"
        )
    return name, value


def plain_literal(value) -> bool:
    if isinstance(value, list):
        return all(plain_literal(item) for item in value)
    return value is None or isinstance(value, (bool, int, float, str))


def split_top_level(text: str) -> list[str]:
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
