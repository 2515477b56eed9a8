"""One measurement in a fresh process: ``python -m benchmarks.measure CASE VARIANT`` prints JSON.

Two modes:

- ``CASE VARIANT``: peak memory of one call of that variant, in this fresh process: the growth of
  the peak resident set size over the inputs (reset first through /proc/self/clear_refs) on CPU,
  ``torch.cuda.max_memory_allocated`` on CUDA.
- ``CASE --timing``: every variant of the case timed in this one process, round-robin with the
  order rotated each round, so that the machine's drift falls on all variants alike.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import torch


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_growth_bytes(function, device: str) -> int:
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        result = function()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        del result
        return peak - before
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # reset the peak RSS (VmHWM) to the current RSS
    before = _rss_kib("VmRSS:")
    result = function()
    peak = _rss_kib("VmHWM:")
    del result
    return (peak - before) * 1024


def timings(function, device: str, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        function()
    values = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        function()
        if device == "cuda":
            torch.cuda.synchronize()
        values.append(time.perf_counter() - start)
    return values


def round_robin(
    functions: dict, repeats: int, warmup: int = 2, device: str = "cpu", run: int = 1
) -> dict[str, list[float]]:
    """{name: seconds of each call}: ``warmup`` calls of each, then ``repeats`` rounds of ``run`` calls
    of each in a row on ``device`` (each call waited for), the order rotated every round so that none
    always follows the same one. With ``run`` > 1 the first call of each run is left out: the others
    follow a call of their own, as the steps of a training loop follow each other (the first follows
    another variant's, whose objects and memory it finds in the caches)."""
    for function in functions.values():
        timings(function, device, warmup, 0)
    names = list(functions)
    samples = {name: [] for name in names}
    for index in range(repeats):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            samples[name] += timings(functions[name], device, 0, run)[1 if run > 1 else 0 :]
    return samples


GEMM_SIZE = {"cpu": 2048, "cuda": 8192}
"""The square matmul that measures each device's ceiling: large enough to keep it busy."""


def gemm_ceiling(device: str, repeats: int = 10) -> float:
    """Achieved float32 GEMM GFLOP/s: the practical ceiling the convolutions are compared with. On a
    GPU the product is large enough to fill it, and runs with TF32 exactly when cuDNN's convolutions
    do (PyTorch's defaults differ: on for convolutions, off for matmul), so both count alike."""
    size = GEMM_SIZE[device]
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    values = timings(lambda: a @ b, device, 2, repeats)
    return 2 * size**3 / statistics.median(values) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case")
    parser.add_argument("variant", nargs="?")
    parser.add_argument("--timing", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()
    if args.case == "gemm":
        print(json.dumps({"gflops": gemm_ceiling(args.device)}))
        return
    from .cases import case

    variants, flops = case(args.case, args.device)
    if not args.timing:
        function = variants[args.variant]
        function()  # first call: lazy initialisation is not what we measure
        print(
            json.dumps(
                {"case": args.case, "variant": args.variant, "peak_bytes": peak_growth_bytes(function, args.device)}
            )
        )
        return
    names = list(variants)
    for name in names:
        timings(variants[name], args.device, args.warmup, 0)
    samples = {name: [] for name in names}
    for round_index in range(args.repeats):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for name in order:
            samples[name] += timings(variants[name], args.device, 0, 1)
    print(
        json.dumps(
            {
                name: {
                    "case": args.case,
                    "variant": name,
                    "median": statistics.median(values),
                    "min": min(values),
                    "max": max(values),
                    "flops": flops,
                }
                for name, values in samples.items()
            }
        )
    )


if __name__ == "__main__":
    main()
