"""Every architecture the suite traces, end to end as a user runs it: trace (train mode), generate, and
run the generated test file in a fresh process; a Markdown table of the times and results.

    python -m benchmarks.architectures [--only LABEL ...] [--output FILE [--append]] [--timeout S]

The models are the suite's (``tests/models/classic.py``, ``tests/models/zoo.py``, ``tests/models/zoo_nets.py``,
``tests/models/zoo_modern.py``, ``tests/models/zoo_attention.py``: ViT, MobileViT, an einops Restormer block;
``tests/models/zoo_segmentation.py``, ``zoo_monai.py``, ``zoo_monai_unet.py``, ``zoo_unetr.py``, ``zoo_swinunetr.py``,
``zoo_swinunetr_2d.py``: smp decoders, MONAI in 2D and 3D; ``tests/models/zoo_timm_cnn.py``: ResNeSt, GhostNet, HGNetV2;
and ``tests/models/zoo_hybrid.py``'s timm transformers and hybrids where present), traced at
their cases' sizes; the gradients' agreement with autograd through the original modules is the suite's
job (``tests/models/test_classic_cnns.py`` and the zoo tests), this only times the user's path and runs each
module's own tests.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def cases() -> dict:
    sys.path.insert(0, str(ROOT))
    from tests.models.test_classic_cnns import CASES as MODELS
    from tests.models.test_zoo_attention import CASES as ATTENTION
    from tests.models.test_zoo_blocks import CASES as ZOO
    from tests.models.test_zoo_modern import CASES as MODERN
    from tests.models.test_zoo_nets import CASES as NETS
    from tests.models.test_zoo_segmentation import CASES as SEGMENTATION
    from tests.models.test_zoo_timm_cnn import CASES as TIMM_CNN

    try:  # timm's transformers and hybrids, where that zoo is present; EdgeNeXt with its encoding as a buffer
        from tests.models.test_classic_cnns import Case
        from tests.models.test_zoo_hybrid import CASES, CLASSIFIER, EdgeNeXtCached

        HYBRID = {
            **CASES,
            "edgenext_cached": Case(EdgeNeXtCached, {"x": (2, 3, 8, 8)}, {"x": (3, 3, 8, 8)}, CLASSIFIER),
        }
    except ImportError:
        HYBRID = {}
    return {
        **MODELS,
        **{f"zoo_{label}": case for label, case in ZOO.items()},
        **NETS,
        **{f"modern_{label}": case for label, case in MODERN.items()},
        **ATTENTION,
        **SEGMENTATION,
        **TIMM_CNN,
        **HYBRID,
    }


def run(label: str, case, folder: Path, blocks: bool = False, timeout: float | None = None) -> dict:
    """Trace, generate and test one architecture; ``blocks``: as ``symgrad trace`` writes it by
    default, each repeated submodule one block (else every layer inline); ``timeout``: seconds the
    generated test file may run before it is stopped and its row says so."""
    from symgrad.pipeline import build_text
    from symgrad.trace import LossChoice, trace

    loss = {"half_sq_error_function": "mse_loss", "nll_loss": "cross_entropy"}.get(case.losses[0], case.losses[0])
    torch.manual_seed(0)
    model = case.model(**case.init).double().train()
    row = {"label": label, "traced": ", ".join(f"{key}={list(shape)}" for key, shape in case.traced.items())}
    start = time.perf_counter()
    text = trace(model, case.traced, name=label, loss=LossChoice(loss), mode="train", blocks=blocks)
    row["trace"] = time.perf_counter() - start
    start = time.perf_counter()
    rendered = build_text(text, f"{label}.yaml").rendered
    row["generate"] = time.perf_counter() - start
    for name, content in rendered.files.items():
        (folder / name).write_text(content)
    row["layers"] = text.count("\n  - {op:") + text.count("\n      - {op:")
    row["blocks"] = text.count("\n  - {block:")
    module = rendered.files[f"{label}.py"]
    row["module lines"] = module.count("\n")
    row["widest"] = max(len(line) for line in module.splitlines())
    start = time.perf_counter()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(folder / f"test_{label}.py")],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        row["test"] = time.perf_counter() - start
        row["result"] = f"STOPPED: still running after {timeout:.0f} s"
        return row
    row["test"] = time.perf_counter() - start
    last = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr.strip()[-200:]
    row["result"] = last.split(" in ")[0] if result.returncode == 0 and "skipped" not in last else f"FAILED: {last}"
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="labels to run, in this order (default: all)")
    parser.add_argument("--output", type=Path, help="write the Markdown table here too")
    parser.add_argument("--flat", action="store_true", help="every layer inline (symgrad trace --flat), no blocks")
    parser.add_argument("--append", action="store_true", help="add the rows to the table already in --output")
    parser.add_argument("--timeout", type=float, help="stop a generated test file after this many seconds")
    arguments = parser.parse_args()
    known = cases()
    unknown = [label for label in arguments.only or [] if label not in known]
    if unknown:
        parser.error(f"no such label: {', '.join(unknown)} (labels: {', '.join(known)})")
    header = [
        "| architecture | traced at | spec layers | block instances | module lines | widest line | trace s | "
        "generate s | generated tests s | result |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    before = arguments.output.read_text() if arguments.append and arguments.output and arguments.output.exists() else ""
    rows, lines = [], [] if "| architecture |" in before else list(header)
    with tempfile.TemporaryDirectory() as temporary:
        for label in arguments.only or known:  # in the order asked for
            case = known[label]
            folder = Path(temporary) / label
            folder.mkdir()
            row = run(label, case, folder, blocks=not arguments.flat, timeout=arguments.timeout)
            rows.append(row)
            print(row, file=sys.stderr, flush=True)
            lines.append(
                f"| {row['label']} | {row['traced']} | {row['layers']} | {row['blocks']} | "
                f"{row['module lines']} | {row['widest']} | {row['trace']:.1f} | {row['generate']:.1f} | "
                f"{row['test']:.1f} | {row['result']} |"
            )
            if arguments.output:  # each row as it comes: a run stopped midway keeps the rows it finished
                arguments.output.write_text(before + "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if any(row["result"].startswith(("FAILED", "STOPPED")) for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
