"""The seed-3 backward excerpt the docs show (docs/seed-problem.md, linked from the README) is what
symgrad writes: every line of it stands, in order, in the committed generated/seed3_conv_relu_conv.py
(so the excerpt cannot go stale silently)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_excerpt_of_seed3s_backward_is_in_the_generated_module():
    text = (ROOT / "docs" / "seed-problem.md").read_text(encoding="utf-8")
    start = text.index("```python\ngrad_p = (residual") + len("```python\n")
    excerpt = [line.strip() for line in text[start : text.index("```", start)].splitlines() if line.strip()]
    module = [line.strip() for line in (ROOT / "generated" / "seed3_conv_relu_conv.py").read_text().splitlines()]
    position = module.index(excerpt[0])
    for line in excerpt[1:]:
        assert line in module[position + 1 :], (
            f"docs/seed-problem.md line not in the generated module after the previous one: {line}"
        )
        position = module.index(line, position + 1)
