"""``python -m benchmarks``: symgrad's generated gradients beside autograd, in one run.

Every (case, variant) pair is measured in a fresh subprocess (``benchmarks/measure.py``), so that
peak-memory numbers do not leak between variants. Results go to BENCHMARKS.md and a PNG plot.

    python -m benchmarks                    # CPU, writes out/BENCHMARKS.md and out/benchmarks.png
    python -m benchmarks --device cuda      # the same on a GPU (appends a CUDA section)
    python -m benchmarks --quick            # fewer repeats, for a smoke run
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

from . import side_by_side
from .cases import CASES
from .report import has_matplotlib, machine_description, write_section


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="symgrad vs autograd, side by side")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="few repeats, for a smoke run")
    parser.add_argument(
        "--output",
        default="out/BENCHMARKS.md",
        help="report to write (default out/BENCHMARKS.md; pass BENCHMARKS.md to refresh the committed one)",
    )
    parser.add_argument(
        "--plot",
        default=None,
        help="plot to write, needs `pip install 'symgrad[plot]'` (default out/benchmarks.png when "
        "matplotlib is installed, else no plot); '' for none",
    )
    parser.add_argument("--cases", nargs="*", default=CASES)
    parser.add_argument(
        "--rows",
        nargs="+",
        default=None,
        help="re-render the report and plot from the measurements earlier runs saved (their "
        "output paths with .json; several runs of one device, e.g. its cases split in two "
        "calls, are joined), without measuring again",
    )
    args = parser.parse_args(argv)
    if args.plot is None:  # the default: a plot if the [plot] extra is there, the tables either way
        args.plot = "out/benchmarks.png" if has_matplotlib() else ""
        if not args.plot:
            print("note: no plot (pip install 'symgrad[plot]' for one); writing the tables", file=sys.stderr)
    elif args.plot and not has_matplotlib():
        print("error: --plot needs matplotlib (fix: pip install 'symgrad[plot]', or pass --plot '')", file=sys.stderr)
        return 2

    output = Path(args.output)
    if args.rows:  # the saved measurements of earlier runs, rendered again (the prose may have changed)
        saved = side_by_side.join_saved([json.loads(Path(path).read_text()) for path in args.rows])
    else:
        ceiling, rows = side_by_side.measure_all(args)
        # generation is CPU work whatever the device: its table belongs to the CPU section alone
        saved = {
            "ceiling": ceiling,
            "rows": rows,
            "device": args.device,
            "machine": machine_description(args.device),
            "date": datetime.date.today().isoformat(),
            "generation": side_by_side.generation_table(args.quick) if args.device == "cpu" else "",
        }
        output.parent.mkdir(parents=True, exist_ok=True)
        output.with_suffix(".json").write_text(json.dumps(saved, indent=1))
    device = saved.get("device", args.device)
    report = side_by_side.render_report(saved)
    output.parent.mkdir(parents=True, exist_ok=True)
    if output.exists():  # keep the other sections (the summary, the real networks'), add or replace this device's
        write_section(output, f"## On {device}\n\n" + report, f"## On {device}")
    else:
        output.write_text(
            "# Benchmarks\n\nProduced by `python -m benchmarks`; medians over repeats after warm-up, "
            f"every variant in a fresh process.\n\n## On {device}\n\n" + report
        )
    if args.plot:
        side_by_side.plot(saved["rows"], args.plot, device)
    print(f"wrote {output}" + (f" and {args.plot}" if args.plot else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
