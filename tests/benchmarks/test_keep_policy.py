"""``benchmarks.keep_policy``'s verdicts (issue 65 item 2): ``--keep lean`` in its faster layout against the
fastest and the leanest eager autograd layout, and ResNet-50's and the U-Net's against ``torch.compile``'s
peak too."""

from __future__ import annotations

from benchmarks.keep_policy import render

MIB = 2**20


def _row(network, precision, layout, variant, median, peak):
    return {
        "network": network,
        "batch": 4,
        "size": 112,
        "width": 64,
        "precision": precision,
        "layout": layout,
        "variant": variant,
        "median": median,
        "peak_bytes": peak * MIB,
        "kept_bytes": 10 * MIB if variant.startswith("symgrad") else None,
    }


def _verdicts(text: str) -> dict:
    found = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 10 and cells[-1] in ("met", "missed"):
            found[cells[0], cells[2], cells[3]] = (cells[4], cells[5], cells[6], cells[7], cells[9])
    return found


def test_lean_is_judged_in_its_faster_layout_against_autograds_best_and_torch_compiles_peak():
    rows = []
    for network, compiled in (("resnet50", 60), ("unet", 70), ("vit", None)):
        for layout, eager_ms, lean_ms in (("default", 1.0, 1.2), ("channels_last", 0.9, 0.93)):
            rows += [
                _row(network, "float32", layout, "autograd", eager_ms, 100 if layout == "default" else 95),
                _row(network, "float32", layout, "symgrad.bind, keep all", eager_ms, 90),
                _row(network, "float32", layout, "symgrad.bind, keep lean", lean_ms, 65),
            ]
        if compiled:
            rows.append(_row(network, "float32", "default", "autograd, torch.compile", None, compiled))
    saved = {"machine": "a test", "date": "today", "command": "python -m benchmarks.keep_policy", "repeats": 1}
    text = render({**saved, "rows": rows})
    verdicts = _verdicts(text)
    # lean's faster layout is channels_last (0.93 ms): 0.9 / 0.93 = 0.97x the fastest eager, 65 / 95 = 0.68x
    assert verdicts["resnet50", "float32", "lean"] == ("channels_last", "0.97×", "0.68×", "1.08×", "missed")
    assert verdicts["unet", "float32", "lean"] == ("channels_last", "0.97×", "0.68×", "0.93×", "met")
    assert verdicts["vit", "float32", "lean"][-1] == "met"  # 0.8x and 0.95x, no torch.compile bound
    assert verdicts["vit", "float32", "all"][-1] == "missed"  # 90 / 95 = 0.95x memory
    # the compiled model's row has a peak and no time
    assert "| resnet50 | 4 × 112² | float32 | default | autograd, torch.compile |  |  | 60.0 | 0.60× |  |" in text


def test_each_variants_page_faults_per_step_are_rendered_where_measured():
    rows = [
        {**_row("resnet18", "float32", "default", "autograd", 1.0, 100), "page_faults": 0},
        {**_row("resnet18", "float32", "default", "symgrad.bind, keep all", 1.02, 90), "page_faults": 4576},
        _row("resnet18", "float32", "default", "symgrad.bind, keep lean", 1.01, 80),  # a run saved before
    ]
    saved = {"machine": "a test", "date": "today", "command": "python -m benchmarks.keep_policy", "repeats": 1}
    text = render({**saved, "run": 3, "rows": rows})
    assert "each variant's steps 3 in a row, the first left out" in text
    assert "| resnet18 | 4 × 112² | float32 | default | autograd | 1000.0 | 1.00× | 100.0 | 1.00× |  | 0 |" in text
    assert "| symgrad.bind, keep all | 1020.0 | 0.98× | 90.0 | 0.90× | 10.0 | 4576 |" in text
    assert "| symgrad.bind, keep lean | 1010.0 | 0.99× | 80.0 | 0.80× | 10.0 |  |" in text
