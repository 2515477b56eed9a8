"""The names the generated module's templates (``templates/module.py.jinja`` and its sections in
``templates/module/``) write themselves, declared once, here: what ``spec.check_identifier`` refuses
and ``names.check_module_source`` reads (:mod:`symgrad.names`), so a spec name never collides with one.

A template that writes a new name of its own adds it here: ``tests/pipeline/test_template_names.py`` reads
the templates' text and fails, naming it, until this declaration holds every name they write.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TemplateNames:
    """The names a module template gives things itself, by where a spec name would clash with them."""

    top: frozenset[str]
    """Defined at module level, or an argument or local of a function that takes the spec's tensors."""
    block: frozenset[str]
    """An argument or local of a block's own functions (``p``, ``save``, ``saved``, ``grad_output``)."""
    block_functions: tuple[str, ...]
    """The suffixes of a block's functions after its name (``_forward``, ``_backward``)."""
    verbatim: frozenset[str] = frozenset()
    """The functions and classes written out as they are, which never see a spec name (``_scope``)."""


MODULE = TemplateNames(
    top=frozenset(
        {
            "BLOCKS",
            "CHANNELS_LAST",
            "EVAL_MODULE",
            "ExplicitGradient",
            "ExplicitOutputs",
            "F",
            "Gradients",
            "MOMENTA",
            "NamedTuple",
            "OUTPUTS",
            "OUTPUTS_KIND",
            "PerSampleGradients",
            "REACHED_BY",
            "RUNNING",
            "contextlib",
            "ctx",
            "dtype",
            "enabled",
            "forward",
            "grad_loss",
            "grad_outputs",
            "gradients",
            "grads",
            "hvp",
            "kept",
            "keys",
            "leaves",
            "others",
            "parameter_grads",
            "params",
            "per_sample_gradients",
            "recompute",
            "saved",
            "tensors",
            "torch",
            "values",
        }
    ),
    block=frozenset({"grad_output", "p", "save", "saved"}),
    block_functions=("_backward", "_forward"),
    verbatim=frozenset(
        {
            "Gradients",
            "PerSampleGradients",
            "_channels_last",
            "_check_versions",
            "_in_layouts",
            "_memory_format",
            "_prefixed",
            "_random_state",
            "_random_state_restored",
            "_run_backward",
            "_run_forward",
            "_scope",
            "_unreached",
            "_unread_as_none",
            "_versions",
        }
    ),
)
"""Where the module template's own names are, by scope."""

WRITTEN = frozenset(
    {
        "BLOCKS",
        "CHANNELS_LAST",
        "EVAL_MODULE",
        "ExplicitGradient",
        "ExplicitOutputs",
        "F",
        "Gradients",
        "MOMENTA",
        "NamedTuple",
        "OUTPUTS_KIND",
        "PerSampleGradients",
        "REACHED_BY",
        "RUNNING",
        "contextlib",
        "dtype",
        "enabled",
        "grad_outputs",
        "grads",
        "kept",
        "keys",
        "leaves",
        "others",
        "parameter_grads",
        "params",
        "saved",
        "tensors",
        "torch",
        "unread",
        "values",
    }
)
"""The names the module template writes outside the functions written out verbatim: what it imports, the
functions and classes it defines, the arguments of each function that also takes the spec's tensors and the
names it assigns."""

SUFFIXES = frozenset({"_layout"})
"""What the template puts after a spec name (``x_layout``)."""
