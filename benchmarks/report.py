"""What every benchmark's report shares: the machine it ran on, its saved JSON run, and its section of
a Markdown report (BENCHMARKS.md), replaced in place so that the other sections stay.

``python -m benchmarks`` (``benchmarks/__main__.py``), ``benchmarks.training``, ``.gradients``, ``.ops``,
``.step_pieces`` and ``.captured_backward`` import these; this module imports none of them."""

from __future__ import annotations

import json
import os
import platform
import re
from pathlib import Path

import torch


def machine_description(device: str) -> str:
    """The CPU model, its logical CPUs, torch's version and threads (and the GPU's name on CUDA)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            model = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    text = f"{model}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads"
    if device == "cuda":
        text += f", {torch.cuda.get_device_name()}"
    return text


def format_bytes(value: float) -> str:
    return f"{value / 2**20:.1f} MiB"


def has_matplotlib() -> bool:
    """Whether the [plot] extra is installed (a report's tables need no plot)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def save_run(saved: dict, path) -> None:
    """A run's measurements as JSON at ``path`` (its folder made)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(saved, indent=1))


def write_report(path, section: str, title: str) -> None:
    """``section`` as the section ``title`` of the Markdown file ``path`` (its folder made), said on stdout."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_section(path, section, title)
    print(f"wrote {path}")


def write_section(path: Path, section: str, title: str) -> None:
    """``path`` with its section ``title`` (a heading line of its own; the title quoted in prose is not it)
    replaced by ``section``, up to the next ``## `` heading; appended where it has none."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    heading = re.search(rf"^{re.escape(title)}$", text, flags=re.MULTILINE)
    before, rest = (text, "") if heading is None else (text[: heading.start()], text[heading.end() :])
    after = rest.split("\n## ", 1)[1] if "\n## " in rest else ""
    path.write_text(before.rstrip() + "\n\n" + section.rstrip() + "\n" + (f"\n## {after}" if after else ""))
