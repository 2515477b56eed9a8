"""The Python API, mirroring the command line: ``symgrad.generate(path)`` or ``symgrad.generate(text=...)``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .pipeline import Built, build, build_text


@dataclass(repr=False)
class Generated:
    """Everything ``symgrad generate`` would write, in memory. Shows itself as math in Jupyter."""

    built: Built
    spec_text: str | None = None
    """The spec's text where it came from Python (``generate(text=...)``): :meth:`write` keeps it beside the
    module, so that a refusal of ``symgrad.bind`` prints a retrace command that reads it and works as printed."""

    @property
    def name(self) -> str:
        return self.built.rendered.name

    @property
    def files(self) -> dict[str, str]:
        return dict(self.built.rendered.files)

    @property
    def code(self) -> str:
        """The gradient module's source."""
        return self.built.rendered.files[f"{self.name}.py"]

    @property
    def test_code(self) -> str:
        return self.built.rendered.files[f"test_{self.name}.py"]

    @property
    def markdown(self) -> str:
        return self.built.rendered.files[f"{self.name}.md"]

    @property
    def html(self) -> str:
        return self.built.rendered.files[f"{self.name}.html"]

    @property
    def latex(self) -> str:
        """The emitted gradients as one LaTeX ``aligned`` block."""
        return self.built.rendered.latex

    def write(self, directory: str | Path = "generated", force: bool = False) -> list[Path]:
        """The files ``symgrad generate`` writes, into ``directory``; a spec given as text is written there too,
        as its ``label`` (a file name) or, without one, ``<name>.yaml``: ``symgrad.bind``'s retrace command
        reads the traced shapes and name from it, so that it works as printed."""
        from .emit import write_files

        written = write_files(self.built.rendered, Path(directory), force=force)
        label = self.built.spec_label
        name = f"{self.name}.yaml" if label == "<spec>" else label
        if self.spec_text is not None and Path(name).name == name and Path(name).suffix in (".yaml", ".yml"):
            spec = Path(directory) / name  # the file the module's header names (a label with a folder: none)
            spec.write_text(self.spec_text)
            written.append(spec)
        return written

    def __repr__(self) -> str:
        graph = self.built.graph
        return (
            f"<symgrad.Generated {self.name!r}: gradients of {', '.join(graph.wrt)} in "
            f"{len(self.built.rendered.summary)} backward statements; files {', '.join(self.files)}>"
        )

    def _repr_markdown_(self) -> str:
        return self.markdown.split("-->\n", 1)[-1]

    def _repr_latex_(self) -> str:
        return f"$${self.latex}$$"


def generate(
    spec: str | Path | None = None,
    *,
    text: str | None = None,
    label: str | None = None,
    recompute: bool = True,
    keep: str | None = None,
) -> Generated:
    """Derive the gradients of a spec file (``spec``) or of spec ``text``; raises ``SpecError`` on bad input.
    ``keep`` (``symgrad generate --keep``): what the forward keeps for the backward. ``"all"`` (the
    default): every value the backward reads, but a ReLU output only its pullback reads as a byte
    mask, a pool's input as its layout, a cheap activation of a kept value made again. ``"lean"``:
    less still, each batch norm's activation output (a convolution's input) made again in the
    backward, bit for bit, from the batch norm's input and statistics. ``"autograd"``
    (``recompute=False``, ``--no-recompute``): every value the backward reads, as autograd keeps it."""
    if (spec is None) == (text is None):
        raise TypeError("pass either a spec path or text=...")
    if text is not None:
        return Generated(build_text(text, label or "<spec>", recompute=recompute, keep=keep), spec_text=text)
    return Generated(build(spec, label, recompute=recompute, keep=keep))
