"""The commands a refusal of ``symgrad.bind`` prints: trace the model again as it was traced, and generate.

``symgrad trace`` writes its own options into the spec, as a comment (``# symgrad trace options:
--input x=2,3,8,8 --wrt parameters``); a refusal reads them back from the spec the generated module
names, so that the printed command, run as printed, writes the same spec at the same path (both modes'
specs where there were two) and generates every module of it into the module's folder: the next
``bind`` then passes. A spec traced from Python (``symgrad.trace``) has no such comment: the options are
then read off the spec itself (its data inputs' shapes, ``--wrt parameters``, its name). A model of
another class than the one traced gets a spec and a module of its own name, never written over the
traced one's.
"""

from __future__ import annotations

import inspect
import re
import shlex
from pathlib import Path
from types import ModuleType

from .write import shown_path, spec_of

OPTIONS = "# symgrad trace options: "
"""How a traced spec's comment line with the trace's options starts."""
MODE_OPTIONS = ("--train", "--eval")
"""Options that set the modes: left out where a refusal gives the modes the model is in now."""


def options_line(
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
    static_sizes=False,
) -> str:
    """The comment line ``symgrad trace`` writes into a spec: its options, as a shell reads them (with
    ``--static-sizes`` kept, every retrace bind prints traces at fixed sizes too)."""
    options = [*(("--input", item) for item in inputs), *(("--arg", item) for item in values)]
    options += [
        (flag, value)
        for flag, value in (
            ("--init", init),
            ("--loss", loss_kind),
            ("--target", target_name if loss_kind and target_name != "target" else None),
            ("--reduction", reduction),
            ("--modes", module_modes),
            ("--wrt", wrt),
            ("--name", spec_name),
            ("--timeout", None if timeout is None else f"{timeout:g}"),
        )
        if value is not None
    ]
    given_flags = (("--eval", eval_mode), ("--train", train_mode), ("--flat", flat), ("--static-sizes", static_sizes))
    flags = [flag for flag, given in given_flags if given]
    return OPTIONS + " ".join([*(f"{flag} {shlex.quote(str(value))}" for flag, value in options), *flags]) + "\n"


def with_options(text: str, line: str) -> str:
    """A traced spec's text with ``line`` (:func:`options_line`) after its first comment line."""
    first, _, rest = text.partition("\n")
    return f"{first}\n{line}{rest}" if first.startswith("#") else line + text


def _options_of(text: str) -> list[str] | None:
    for line in text.splitlines():
        if line.startswith(OPTIONS):
            try:
                return shlex.split(line[len(OPTIONS) :])
            except ValueError:
                return None
        if not line.startswith("#"):
            return None
    return None


def _options_from_spec(text: str) -> list[str]:
    """The options that trace the model to ``text`` again, read off the spec: each data input's shape
    (an input without a ``source``), ``--wrt parameters`` where no data input is differentiated, its name."""
    import yaml

    try:
        document = yaml.safe_load(text)
        inputs, wrt = document["inputs"], document.get("wrt") or []
    except Exception:  # noqa: BLE001 - an unreadable spec: the shapes are the user's to give
        return ["--input", "..."]
    options, loss = [], document.get("loss")
    target = loss.get("target") if isinstance(loss, dict) else None
    if isinstance(loss, dict):  # a loss put after the model by --loss: its op, target and reduction
        from .trace.losses import LOSS_NAMES

        choice = next((key for key, op in LOSS_NAMES.items() if op == loss.get("op")), None)
        options += ["--loss", choice] if choice else []
        options += ["--target", target] if choice and isinstance(target, str) and target != "target" else []
        options += ["--reduction", loss["reduction"]] if choice and isinstance(loss.get("reduction"), str) else []
    for key, value in inputs.items():
        if key != target and isinstance(value, dict) and "source" not in value and "shape" in value:
            dtype = "int64:" if value.get("dtype") == "int64" else ""
            options += ["--input", f"{key}={dtype}{','.join(map(str, value['shape']))}"]
    data = {options[index + 1].partition("=")[0] for index in range(0, len(options), 2) if options[index] == "--input"}
    if not data & set(wrt):
        options += ["--wrt", "parameters"]
    if isinstance(document.get("name"), str):
        options += ["--name", document["name"]]
    return options or ["--input", "..."]


def _without(options: list[str], flags: tuple[str, ...], valued: tuple[str, ...] = ()) -> list[str]:
    kept, skip = [], False
    for item in options:
        if skip:
            skip = False
        elif item in valued:
            skip = True
        elif item not in flags:
            kept.append(item)
    return kept


def spec_path(generated: ModuleType) -> Path:
    """The spec ``generated`` was generated from, as its docstring names it beside its file; a module whose
    spec came from Python (``symgrad.generate(text=...).write``) names none: its ``<name>.yaml`` beside it."""
    match = re.search(r"from\s+(\S+\.ya?ml)\b", getattr(generated, "__doc__", None) or "")
    file = getattr(generated, "__file__", None)
    if not file:  # a module made in memory: no folder to find a spec in
        return Path(match.group(1) if match else "SPEC.yaml")
    return spec_of(Path(file), match.group(1) if match else "<spec>")


def hyper_difference(generated: ModuleType, model) -> str | None:
    """The first hyper-parameter of ``model`` (its widths aside) other than in the fingerprint of the spec
    ``generated`` was made from, with both values; None where the spec cannot be read or none differs
    (the module itself holds their hashes alone)."""
    import yaml

    from .fingerprint import fingerprint_of, is_width

    try:
        traced = yaml.safe_load(spec_path(generated).read_text())["fingerprint"]
    except Exception:  # noqa: BLE001 - no spec beside it, or none with a fingerprint: the hashes said it
        return None
    now = fingerprint_of(model)
    for path, entry in traced.items() if isinstance(traced, dict) else ():
        before, after = (entry or {}).get("hyper") or {}, now.get(path, {}).get("hyper", {})
        for key in [*before, *(key for key in after if key not in before)]:
            if not is_width(key) and before.get(key, ...) != after.get(key, ...):
                has = f"no {key}" if key not in after else f"{key}={after[key]!r:.100}"
                was = f"without {key}" if key not in before else f"with {key}={before[key]!r:.100}"
                return f"{path or 'the model'} ({now[path]['class']}) has other hyper-parameters than traced: {has}, traced {was}"
    return None


def retrace(generated: ModuleType, model, modes: str = "", change: tuple | None = None) -> str:
    """The commands that trace ``model`` again, as ``generated``'s spec was traced (``modes``: options
    that set the modes as the model has them now, in place of the traced ones; ``change``: (flag, name,
    value) in place of that flag's ``name=...``, or without it where value is None; or a list of such), and generate every
    module of that spec where ``generated`` is."""
    file = getattr(generated, "__file__", None)
    spec = spec_path(generated)
    train = spec.with_name(spec.name.replace("_eval.", ".", 1))
    if spec.stem.endswith("_eval") and train.is_file() and "\neval: " in train.read_text(errors="replace"):
        spec = train  # an eval-mode twin: traced with its train-mode spec, by one command
    text = spec.read_text(errors="replace") if spec.is_file() else ""
    options = _options_of(text) or _options_from_spec(text) if text else ["--input", "..."]
    if modes:
        options = _without(options, MODE_OPTIONS, ("--modes",)) + shlex.split(modes)
    for flag, argument, value in [change] if change and isinstance(change[0], str) else change or []:
        kept = [
            index
            for index in range(len(options))
            if not (
                options[index] == flag
                and index + 1 < len(options)
                and options[index + 1].partition("=")[0] == argument
                or index
                and options[index - 1] == flag
                and options[index].partition("=")[0] == argument
            )
        ]
        options = [options[index] for index in kept] + ([flag, f"{argument}={value}"] if value is not None else [])
    traced_class = re.search(r"^# Traced by symgrad from (\w+)\.forward", text, re.MULTILINE)
    name, after = None, ""
    if traced_class and traced_class.group(1) != type(model).__name__:  # another model: its own spec and module
        name = re.sub(r"\W", "_", type(model).__name__).lower() + "_gradients"
        spec = spec.with_name(f"{name}.yaml")
        options = _without(options, (), ("--name",))
    folder = Path(file).parent if file else None
    output = "" if folder is None or shown_path(folder) == "generated" else f" -o {shown_path(folder)}"
    shown = " ".join(
        shown_path(item) for item in [spec, *([spec.with_name(f"{spec.stem}_eval.yaml")] if "\neval: " in text else [])]
    )
    if name:  # its eval-mode spec, where the trace writes one: whichever the shell finds
        shown = f"{shown_path(spec.with_name(name))}*.yaml"
        after = f", then bind {shown_path((folder or Path('.')) / f'{name}.py')}"
    try:
        source = shown_path(inspect.getsourcefile(type(model)) or "FILE.py")
    except (TypeError, OSError, ValueError):
        source = "FILE.py"
    command = " ".join(shlex.quote(item) if item != "..." else item for item in options)
    return (
        f"symgrad trace {source}:{type(model).__name__} {command} -o {shown_path(spec)} && "
        f"symgrad generate {shown}{output}{after}"
    )


def spec_and_output(file: Path | None, label: str) -> tuple[str, str]:
    """The spec, and `` -o FOLDER`` (or ""), with which ``symgrad generate``, run from here, writes ``file``
    again: its header names the spec relative to the file's folder, and the folder may not be
    ``generate``'s default."""
    if file is None:
        return label, ""
    folder = shown_path(file.parent)
    return shown_path(spec_of(file, label)), "" if folder == "generated" else f" -o {folder}"
