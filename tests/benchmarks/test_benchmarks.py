"""The benchmark's machinery (not its numbers: speed claims live in BENCHMARKS.md, never in tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.cases import SEEDS, case, conv_flops, load_generated, seed_shapes, unfold_einsum_per_sample  # noqa: E402


def test_flop_count_of_seed1_by_hand():
    # one stride-32 conv, forward plus the input gradient: 2 passes of N*Cout*Ho*Wo*Cin*kh*kw multiply-adds
    assert conv_flops("seed1", seed_shapes("seed1", "full")) == 2 * (2 * 8 * 512 * 4 * 4 * 1 * 32 * 32)


def test_every_variant_computes_the_same_gradients():
    variants, _ = case("seed3-small", "cpu")
    results = {name: function() for name, function in variants.items()}
    reference = results["torch.autograd.grad"]
    for name, result in results.items():
        for actual, expected in zip(result, reference):
            assert torch.allclose(actual, expected, rtol=1e-4, atol=1e-5), name


def test_the_opacus_peer_computes_the_per_sample_gradients():
    module = load_generated(SEEDS["seed3"])
    generator = torch.Generator().manual_seed(3)
    inputs = {
        name: torch.randn(shape, generator=generator, dtype=torch.float64)
        for name, shape in seed_shapes("seed3", "small").items()
    }
    inputs["x"], inputs["y"] = (
        inputs["x"].repeat(3, 1, 1, 1),
        inputs["y"].repeat(3, 1, 1, 1) * torch.arange(3.0).reshape(3, 1, 1, 1),
    )
    expected = module.per_sample_gradients(**inputs)
    for actual, reference in zip(unfold_einsum_per_sample(**inputs), expected):
        assert torch.allclose(actual, reference, rtol=1e-10, atol=1e-12)


def test_peak_memory_sees_a_known_allocation():
    """Measured as the benchmark measures: in a fresh process with glibc's mmap threshold fixed (in
    a long-lived process freed heap can be reused, and a new tensor then adds no resident memory)."""
    environment = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": str(ROOT)}
    script = (
        "import torch; from benchmarks.measure import peak_growth_bytes; "
        "print(peak_growth_bytes(lambda: torch.randn(4 * 2**20), 'cpu'))"
    )  # 16 MiB of float32
    output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment, check=True)
    growth = int(output.stdout.strip().splitlines()[-1])
    assert 12 * 2**20 <= growth <= 40 * 2**20


def test_measure_command_prints_json():
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    output = subprocess.run(
        [sys.executable, "-m", "benchmarks.measure", "seed1-small", "--timing", "--repeats", "2"],
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        check=True,
    )
    result = json.loads(output.stdout.strip().splitlines()[-1])
    assert set(result) == {
        "symgrad gradients",
        "torch.autograd.grad",
        "torch.func.grad",
        "autograd.grad, channels_last inputs",
        "symgrad gradients, channels_last inputs",
        "symgrad loss_with_explicit_backward().backward()",
        "autograd loss.backward()",
    }
    assert all(row["median"] > 0 for row in result.values())


_ABSENT = object()


def test_benchmark_writes_to_its_own_output_not_the_committed_report(tmp_path: Path):
    """`python -m benchmarks` writes out/ by default; BENCHMARKS.md changes only when asked for."""
    import benchmarks.__main__ as runner
    from benchmarks import side_by_side

    committed = ROOT / "BENCHMARKS.md"
    before = committed.stat().st_mtime_ns
    calls = []
    runner_measure, runner_generation = side_by_side.run_measurement, side_by_side.generation_table
    try:
        side_by_side.run_measurement = lambda case_name, *arguments: (
            calls.append(case_name) or ({"gflops": 100.0} if case_name == "gemm" else {})
        )
        side_by_side.generation_table = lambda quick: ""
        os.chdir(tmp_path)
        assert runner.main(["--cases", "--plot", ""]) == 0
        previous = sys.modules.get("matplotlib", _ABSENT)
        sys.modules["matplotlib"] = None  # as after command (a): no [plot] extra; the default still runs
        try:
            assert runner.main(["--cases"]) == 0
            assert runner.main(["--cases", "--plot", "p.png"]) == 2  # asked for a plot it cannot draw
        finally:
            if previous is _ABSENT:
                del sys.modules["matplotlib"]
            else:
                sys.modules["matplotlib"] = previous
    finally:
        os.chdir(ROOT)
        side_by_side.run_measurement, side_by_side.generation_table = runner_measure, runner_generation
    assert (tmp_path / "out" / "BENCHMARKS.md").exists() and committed.stat().st_mtime_ns == before


def test_a_saved_run_renders_again_with_its_verdicts(tmp_path: Path):
    """`--rows` re-renders from the measurements a run saved: each verdict is computed from them."""
    import benchmarks.__main__ as runner

    def row(variant, median, peak):
        return {
            "case": "seed1-small",
            "variant": variant,
            "median": median,
            "min": median,
            "max": median,
            "flops": None,
            "peak_bytes": peak,
        }

    saved = tmp_path / "run.json"
    saved.write_text(
        json.dumps(
            {
                "ceiling": 100.0,
                "generation": "",
                "rows": [row("symgrad gradients", 0.002, 10), row("torch.autograd.grad", 0.001, 10)],
            }
        )
    )
    output = tmp_path / "report.md"
    assert runner.main(["--rows", str(saved), "--output", str(output), "--plot", ""]) == 0
    report = output.read_text()
    assert "| seed1-small | ≥1.0× (never slower) | symgrad gradients: 0.50×, memory 1.00× | missed |" in report
    assert "*Why small targets are missed" in report


def test_saved_runs_of_one_device_join_and_of_two_devices_refuse(tmp_path: Path):
    """A device's cases measured in two calls render as one report, under that device's header and
    the machine the run recorded; runs of two devices never mix."""
    import benchmarks.__main__ as runner

    def run(device, case_name):
        return {
            "ceiling": 100.0,
            "generation": "",
            "device": device,
            "machine": f"the {device} machine",
            "date": "2026-01-02",
            "rows": [
                {
                    "case": case_name,
                    "variant": variant,
                    "median": median,
                    "min": median,
                    "max": median,
                    "flops": None,
                    "peak_bytes": 10,
                }
                for variant, median in (("symgrad gradients", 0.001), ("torch.autograd.grad", 0.002))
            ],
        }

    paths = []
    for index, (device, case_name) in enumerate(
        (("cuda", "seed1-small"), ("cuda", "seed2-small"), ("cpu", "seed3-small"))
    ):
        paths.append(tmp_path / f"{index}.json")
        paths[-1].write_text(json.dumps(run(device, case_name)))
    output = tmp_path / "report.md"
    assert runner.main(["--rows", str(paths[0]), str(paths[1]), "--output", str(output), "--plot", ""]) == 0
    report = output.read_text()
    assert "## On cuda" in report and "Machine: the cuda machine. Run on 2026-01-02." in report
    assert "| seed1-small | ≥1.0× (never slower) | symgrad gradients: 2.00×" in report
    assert "| seed2-small | ≥1.0× (never slower) | symgrad gradients: 2.00×" in report
    with pytest.raises(SystemExit, match="one device"):
        runner.main(["--rows", str(paths[0]), str(paths[2]), "--output", str(output), "--plot", ""])


def test_training_runs_of_one_lease_merge_their_tags_apart_and_a_graph_pool_uncounted_is_no_peer(tmp_path: Path):
    """`benchmarks.training --rows A B`: the runs' rows render as one table, a tagged run's rows judged
    among themselves; a peak that leaves out a CUDA graph pool (†) is shown but never the leanest."""
    from benchmarks import training

    def row(variant, median, peak, **extra):
        return {
            "network": "resnet18",
            "batch": 32,
            "size": 224,
            "width": 64,
            "variant": variant,
            "median": median,
            "min": median,
            "max": median,
            "peak_bytes": peak * 2**20,
            **extra,
        }

    def run(rows, failures=(), overhead=()):
        return {
            "machine": "the GPU",
            "device": "cuda",
            "date": "2026-01-02",
            "repeats": 7,
            "rows": rows,
            "failures": list(failures),
            "overhead": list(overhead),
        }

    eager = run(
        [row("symgrad.bind, channels_last, CUDA graph", 0.006, 700), row("autograd, channels_last", 0.010, 600)]
    )
    compiled = run(
        [
            row("symgrad.bind, channels_last, CUDA graph", 0.0066, 700, tag="compiled run"),
            row("autograd, torch.compile reduce-overhead", 0.0065, 0, tag="compiled run", pool_uncounted=True),
            row("autograd", 0.012, 650, tag="compiled run"),
        ],
        failures=["resnet18: it raised"],
    )
    paths = []
    for index, saved in enumerate((eager, compiled, {**eager, "device": "cpu"})):
        paths.append(tmp_path / f"{index}.json")
        paths[-1].write_text(json.dumps(saved))
    output = tmp_path / "B.md"
    assert training.main(["--rows", str(paths[0]), str(paths[1]), "--output", str(output)]) == 0
    report = output.read_text()
    assert (
        "| resnet18 32 × 224², float32 | symgrad.bind, channels_last, CUDA graph | 1.67× | 1.17× | missed |" in report
    )
    assert (
        "| resnet18 32 × 224² (compiled run), float32 | symgrad.bind, channels_last, CUDA graph | 0.98× | 1.08× "
        "| missed |"
    ) in report  # against reduce-overhead's speed, the default layout's memory (650 MiB)
    assert "| 0.0 MiB † |" in report and "- resnet18: it raised" in report
    with pytest.raises(SystemExit, match="more than one device"):
        training.main(["--rows", str(paths[0]), str(paths[2]), "--output", str(output)])


def test_the_device_check_passes_on_the_cpu_and_fails_a_wrong_gradient(monkeypatch, capsys):
    """`python -m benchmarks.device_check` (run on a GPU when one is lent) works here on the CPU, and
    a gradient off by a little is reported as a failure. ``--quick``: float32 at the small shapes and
    gradcheck over the generated tests' subset of inputs (every input of the unrolled example took 68 s
    of CPU; each generated test file runs its own gradcheck and float32 checks in the suite)."""
    from benchmarks import device_check

    assert device_check.main(["cpu", "--quick"]) == 0
    count = len(list((ROOT / "generated").glob("test_*.py")))  # the blocks example's structured module too
    assert f"{count} of {count} modules pass on cpu" in capsys.readouterr().out and count == 5
    original = device_check.load_module

    def with_a_wrong_gradient(path, name=None):
        tests = original(path, name)
        right = tests.module.gradients
        tests.module.gradients = lambda *a, **k: type(right(*a, **k))(*(g * (1 + 1e-6) for g in right(*a, **k)))
        return tests

    monkeypatch.setattr(device_check, "load_module", with_a_wrong_gradient)
    assert not device_check.check_module(sorted((ROOT / "generated").glob("test_*.py"))[0], "cpu", quick=True)


def test_the_trials_compare_forms_that_agree_and_modules_that_differ_only_in_layout():
    """`python -m benchmarks.trials`: its three per-sample forms give one answer (checked in float64
    against a loop over samples), and its default-layout module is the committed one less the move."""
    from benchmarks import trials
    from symgrad.check import module_from_source, relative_error

    trials.check_forms("cpu")
    code = trials.default_layout_code("seed3")
    assert "channels_last" not in code
    assert "channels_last" in (ROOT / "generated" / f"{SEEDS['seed3']}.py").read_text()
    default, committed = module_from_source(code, "seed3_default_layout"), load_generated(SEEDS["seed3"])
    generator = torch.Generator().manual_seed(4)
    inputs = {
        name: torch.randn(shape, dtype=torch.float64, generator=generator)
        for name, shape in {
            "x": (2, 3, 32, 32),
            "w1": (3, 3, 3, 3),
            "w2": (1, 3, 3, 3),
            "k": (2, 1, 32, 32),
            "y": (2, 2, 1, 1),
        }.items()
    }
    for ours, theirs in zip(default.gradients(**inputs), committed.gradients(**inputs)):
        assert relative_error(ours, theirs) <= 1e-12  # the layouts sum in different orders


def test_only_the_memory_processes_change_the_allocator(monkeypatch):
    """Timing runs under glibc's defaults, as users run; the fixed mmap threshold, which makes every
    large allocation fault its pages in afresh, is for the peak-memory processes alone."""
    from benchmarks import side_by_side

    seen = {}

    def fake_run(command, env, **keywords):
        seen[tuple(command[3:])] = env.get("MALLOC_MMAP_THRESHOLD_")
        return subprocess.CompletedProcess(command, 0, stdout="{}\n", stderr="")

    monkeypatch.setattr(side_by_side.subprocess, "run", fake_run)
    side_by_side.run_measurement("gemm", "-", "--device", "cpu")
    side_by_side.run_measurement("seed1-small", "--timing", "--device", "cpu")
    side_by_side.run_measurement("seed1-small", "symgrad gradients", "--device", "cpu")
    assert seen == {
        ("gemm", "-", "--device", "cpu"): None,
        ("seed1-small", "--timing", "--device", "cpu"): None,
        ("seed1-small", "symgrad gradients", "--device", "cpu"): "65536",
    }


def test_the_training_step_variants_compute_the_same_step(tmp_path: Path):
    """The training steps the real-network benchmark times start from one model and data: their first
    losses agree (the other layout rounds apart, bfloat16 autocast further), and a second step, taken
    after each variant's own first, agrees too: every variant moved its parameters alike."""
    from benchmarks import training

    names = [name for name in training.VARIANTS if "torch.compile" not in name]  # compiled: tests below
    if torch.backends.cpu.get_cpu_capability() != "AVX512":  # torch 2.13's channels_last convolution backward
        # corrupts the heap on an AVX2 CPU at one thread, autograd's alone ("double free or corruption" after an
        # `autograd` then an `autograd, channels_last` step): the channels_last variants not run there
        names = [name for name in names if "channels_last" not in name]  # said as a skip at the end
    variants = training.step_variants("resnet18", 2, 32, 4, tmp_path, names)
    assert set(variants) == set(names)
    for step in range(2):
        losses = {name: function().item() for name, function in variants.items()}
        reference = losses["autograd"]
        # the bound step runs autograd's kernels: alike to rounding at every step
        assert abs(losses["symgrad.bind"] - reference) <= 1e-5 * abs(reference), (step, losses)
        assert abs(losses["symgrad.bind, AMP"] - losses["autograd, AMP"]) <= 2e-2 * abs(reference), (step, losses)
        # the other layout rounds apart, and a batch of 2 through BatchNorm magnifies it after a step
        loose = 1e-4 if step == 0 else 5e-2
        if "autograd, channels_last" in losses:
            assert abs(losses["autograd, channels_last"] - reference) <= loose * abs(reference), (step, losses)
            assert abs(losses["symgrad.bind, channels_last"] - losses["autograd, channels_last"]) <= loose * abs(
                reference
            )
        for name in {"symgrad.bind, AMP", "autograd, AMP", "autograd, channels_last, AMP"} & set(names):  # bfloat16
            assert step or abs(losses[name] - reference) <= 5e-2 * abs(reference), (name, losses)
    if "autograd, channels_last" not in names:
        pytest.skip("the channels_last variants need an AVX-512 CPU (torch 2.13 corrupts the heap on AVX2)")


def test_the_compiled_training_step_computes_the_same_step(tmp_path: Path, monkeypatch):
    """The torch.compile peer: the benchmark compiles the model and runs autograd's step through it. On
    the aot_eager backend here (dynamo's graph, AOTAutograd's joint graph, eager kernels): Inductor's
    C++ for a whole ResNet-18 would be PyTorch's correctness, not the harness's, and costs 50 s of CPU
    from a cold cache. The bound model's Inductor step, ours to check, is the test below."""
    import functools

    from benchmarks import training

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    names = ["autograd", "autograd, torch.compile"]
    variants = training.step_variants("resnet18", 2, 32, 4, tmp_path, names)
    for step in range(2):
        losses = {name: function().item() for name, function in variants.items()}
        loose = 1e-4 if step == 0 else 5e-2  # its kernels round apart, magnified by a step (above)
        assert abs(losses["autograd, torch.compile"] - losses["autograd"]) <= loose * abs(losses["autograd"]), losses


@pytest.mark.slow
def test_the_compiled_bound_model_computes_the_same_step(tmp_path: Path, monkeypatch):
    """The benchmark's ``torch.compile(fast, fullgraph=True)`` row of the outputs form: its steps as autograd's.
    On aot_eager, as the peer above: Inductor's kernels for this ResNet-18 took 64 s of a cold CI run; the
    bound model on Inductor's own kernels is tests/bind/test_model.py's
    test_inductor_compiles_the_bound_model_and_its_steps_are_autograds."""
    import functools

    from benchmarks import training

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))

    variants = training.step_variants("resnet18", 2, 32, 4, tmp_path, ["autograd", "symgrad.bind, torch.compile"])
    for step in range(2):
        losses = {name: function().item() for name, function in variants.items()}
        loose = 1e-4 if step == 0 else 5e-2  # rounding apart, magnified by a step (above)
        assert abs(losses["symgrad.bind, torch.compile"] - losses["autograd"]) <= loose * abs(losses["autograd"])


@pytest.mark.parametrize("network", [pytest.param("convnext", marks=pytest.mark.slow), "efficientnet", "mobilenetv3"])
def test_the_zoo_networks_training_steps_agree(tmp_path: Path, network: str):
    """The ConvNeXt-, EfficientNet- and MobileNetV3-style rows: the bound step is autograd's, step after step."""
    from benchmarks import training

    variants = training.step_variants(
        network, 2, 32, 8, tmp_path, ["symgrad.bind", "autograd", "symgrad.bind, AMP", "autograd, AMP"]
    )
    for step in range(2):
        losses = {name: function().item() for name, function in variants.items()}
        assert abs(losses["symgrad.bind"] - losses["autograd"]) <= 1e-5 * abs(losses["autograd"]), (step, losses)
        assert abs(losses["symgrad.bind, AMP"] - losses["autograd, AMP"]) <= 2e-2 * abs(losses["autograd"]), losses


def test_the_training_report_judges_against_autograds_best_layout(tmp_path: Path):
    from benchmarks import training
    from benchmarks.report import write_section

    def row(variant, median, peak):
        return {
            "network": "resnet18",
            "batch": 8,
            "size": 112,
            "width": 64,
            "variant": variant,
            "median": median,
            "min": median,
            "max": median,
            "peak_bytes": peak,
        }

    saved = {
        "machine": "test",
        "date": "2026-11-23",
        "repeats": 3,
        "rows": [row("symgrad.bind", 1.1, 90), row("autograd", 1.2, 100), row("autograd, channels_last", 1.0, 120)],
    }
    text = training.render(saved)
    assert "| resnet18 8 × 112², float32 | symgrad.bind | 0.91× | 0.90× | missed |" in text  # slower than channels_last
    saved["rows"] += [
        row("autograd, torch.compile", 0.9, 130),
        row("symgrad.bind, AMP", 0.5, 60),
        row("autograd, AMP", 0.6, 70),
    ]
    text = training.render(saved)
    assert "| resnet18 8 × 112², float32 | symgrad.bind | 0.82× | 0.90× | missed |" in text  # compiled: faster still
    assert "| resnet18 8 × 112², AMP | symgrad.bind, AMP | 1.20× | 0.86× | met |" in text  # against autocast only
    saved["rows"].append(row("symgrad.bind, channels_last", 0.85, 95))  # the faster bound layout is judged
    assert "| resnet18 8 × 112², float32 | symgrad.bind, channels_last | 1.06× | 0.95× | met |" in training.render(
        saved
    )
    small = [
        dict(row(name, median, 0), batch=2, size=32, width=8)
        for name, median in (
            ("symgrad.bind", 0.010),
            ("autograd", 0.009),
            ("symgrad.bind, AMP", 0.008),
            ("autograd, AMP", 0.010),
        )
    ]
    saved["overhead"] = small
    around = training.render(saved)  # each bound step against autograd of its own layout and precision
    assert "| resnet18 | symgrad.bind | 10.00 | 10.00 | 9.00 | 0.90× |" in around
    assert "| resnet18 | symgrad.bind, AMP | 8.00 | 8.00 | 10.00 | 1.25× |" in around
    saved["overhead"] = [
        dict(entry, median_in_run=entry["median"] * 0.5 * (1.1 if "symgrad" in entry["variant"] else 1))
        for entry in small
    ]  # a run of steps: each follows its own
    in_runs = training.render(saved)
    assert "| resnet18 | symgrad.bind | 10.00 | 10.00 | 9.00 | 0.90× | 5.50 | 4.50 | 0.82× |" in in_runs
    report = tmp_path / "B.md"
    report.write_text("# Benchmarks\n\n## On cpu\n\nseed rows\n\n## On cuda\n\ngpu rows\n")
    write_section(report, text, training.SECTION)
    write_section(report, text, training.SECTION)  # replaced, not added twice
    written = report.read_text()
    assert written.count(training.SECTION) == 1 and "seed rows" in written and "gpu rows" in written


def test_round_robin_times_runs_of_steps_leaving_out_each_runs_first():
    """``run=3``: three calls of each variant in a row per round, the first of each run not counted
    (it follows another variant's call); every call is made, in the rotated order."""
    from benchmarks.measure import round_robin

    calls = []
    functions = {name: (lambda name=name: calls.append(name)) for name in "ab"}
    samples = round_robin(functions, repeats=2, warmup=1, run=3)
    assert calls == ["a", "b"] + ["a"] * 3 + ["b"] * 3 + ["b"] * 3 + ["a"] * 3
    assert {name: len(values) for name, values in samples.items()} == {"a": 4, "b": 4}
    assert len(round_robin(functions, repeats=2, warmup=0)["a"]) == 2  # one call per round: each counted


def test_the_step_pieces_clock_the_bound_steps_own_functions_and_leave_its_gradients_alone(tmp_path: Path):
    """``benchmarks.step_pieces``: each piece is clocked once at every step, the pieces fit inside the
    forward and the backward they are part of, the clocked step fills autograd's gradients, a step's
    kernel calls are counted from gradients set to None (no AccumulateGrad add), and the table renders."""
    from benchmarks import step_pieces

    (_, bound_step, samples, bound_optimizer, _), (_, autograd_step, _, autograd_optimizer, _) = step_pieces._steps(
        "resnet18", 2, 16, 4, "default", tmp_path
    )
    bound_step()
    autograd_step()
    for values in samples.values():
        assert len(values) == 1  # every clock ran once: the pieces are the functions the step calls
    assert samples["checks"][0] + samples["saving forward"][0] + samples["batch counts"][0] < samples["forward"][0]
    assert samples["backward body"][0] < samples["backward"][0]
    for mine, theirs in zip(
        *(optimizer.param_groups[0]["params"] for optimizer in (bound_optimizer, autograd_optimizer))
    ):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-5)
    calls = step_pieces.kernel_calls(lambda: autograd_optimizer.param_groups[0]["params"][0].sum(), autograd_optimizer)
    # sum; its backward's ones_like and expand, and AccumulateGrad's copy into a new .grad (an add_ into the
    # .grad the step above left would be 3 calls)
    assert calls == {"forward": 1, "backward": 4}
    row = step_pieces.measure("resnet18", 2, 16, 4, "default", rounds=1)
    assert row["bound saving forward"] < row["bound forward"] and row["bound backward body"] < row["bound backward"]
    text = step_pieces.render({"machine": "test", "date": "today", "rounds": 1, "rows": [row]})
    assert "| resnet18 of width 4 at 2 × 16² | default | … body |" in text


def test_the_captured_backward_replays_the_bodys_own_kernels_bit_for_bit_and_captures_per_layout(tmp_path: Path):
    """``benchmarks.captured_backward`` (a measurement): a bound step whose backward body runs as a TorchScript
    graph gives the plain bound step's gradients bit for bit (strides too), one graph per set of layouts (a
    second batch size makes a second), and its table renders."""
    from benchmarks import captured_backward

    (_, plain_step, _, plain), (_, captured_step, samples, bound), (_, autograd_step, _, _) = captured_backward._steps(
        "resnet18", 2, 16, 4, "default", tmp_path
    )
    replay = bound.generated._backward_from_saved
    for _ in range(2):
        plain_step(), captured_step(), autograd_step()
        assert all(
            torch.equal(a, b) and a.stride() == b.stride()
            for a, b in zip(captured_backward._gradients(plain), captured_backward._gradients(bound))
        )
    assert len(replay.graphs) == 1 and replay.replays == 2 and len(samples) == 2  # the graph ran, not the body
    x = torch.randn(3, 3, 16, 16)
    labels = torch.randint(0, 10, (3,))
    bound(x=x, labels=labels).backward()
    assert len(replay.graphs) == 2  # another batch size: another graph
    row = captured_backward.measure("resnet18", 2, 16, 4, "default", rounds=1)
    assert row["identical"] and row["graphs"] == 1
    text = captured_backward.render({"machine": "test", "date": "today", "rounds": 1, "rows": [row]})
    assert "| resnet18 of width 4 at 2 × 16² | default | symgrad.bind, backward in TorchScript |" in text
    assert "bit for bit" in text


def test_the_gradients_benchmark_checks_float64_agreement_and_keeps_both_sections(tmp_path: Path):
    """`python -m benchmarks.gradients`: its variants give one set of gradients (float64, small size), and
    its section goes beside the training section of a report, each replaced in place on a second run."""
    from benchmarks import gradients, training
    from benchmarks.report import write_section

    assert gradients.float64_agreement(tmp_path, width=4, batch=2, size=32) <= gradients.TOLERANCE
    model, generated = gradients.traced_module(tmp_path, 4, torch.float64)
    results = {
        name: function() for name, function in gradients.variants(model, generated, 2, 32, torch.float64).items()
    }
    for ours, theirs in (("gradients", "autograd"), ("gradients, channels_last", "autograd, channels_last")):
        assert len(results[ours]) == len(results[theirs]) == len(list(model.parameters()))
        for mine, reference in zip(results[ours], results[theirs]):  # like with like: the layouts round apart
            assert float((mine - reference).norm() / reference.norm()) <= gradients.TOLERANCE, ours
    samples = {name: [1.0, 2.0, 3.0] for name in gradients.VARIANTS}
    samples["gradients"] = [2.0, 4.0, 6.0]  # slower than autograd in the default layout only
    overhead = dict(gradients.OVERHEAD, samples={name: [0.5] for name in gradients.VARIANTS})
    section = gradients.render("test", 8, 112, 64, 3, samples, 0.0, (1.0, 1.0, 1.0), "2026-11-23", overhead=overhead)
    assert (
        "(gradients, channels_last) ≥1.0× the best autograd, as the training step's verdict judges: 1.00×, met"
        in section
        and "`torch.autograd.grad` on the default-layout model: 0.50×" in section
    )
    assert "| gradients | 500.00 | 500.00 | 1.00× |" in section
    report = tmp_path / "B.md"
    report.write_text(f"# Benchmarks\n\n{training.SECTION}\n\ntraining rows\n")
    for _ in range(2):
        write_section(report, section, gradients.SECTION)
    text = report.read_text()
    assert text.count(gradients.SECTION) == 1 and text.count(training.SECTION) == 1 and "training rows" in text


def test_the_ops_benchmark_checks_every_family_in_float64_and_renders_a_row_each(tmp_path: Path):
    """`python -m benchmarks.ops`: each family's generated gradients agree with autograd's (float64, its
    check size) before it is timed, and the section has one row a family and names the slower ones."""
    from benchmarks import ops

    for family in ops.FAMILIES:
        assert ops.float64_agreement(family) <= ops.TOLERANCE, family.label
    rows = [
        {
            "family": family.label,
            "shape": list(family.shape),
            "agreement": 1e-16,
            "gradients": [0.002],
            "autograd": [0.001 if index == 0 else 0.003],
        }
        for index, family in enumerate(ops.FAMILIES)
    ]
    text = ops.render({"machine": "test", "date": "2026-11-26", "repeats": 1, "rows": rows})
    assert text.count("\n| ") == len(ops.FAMILIES) + 1  # the header and a row a family
    assert "| conv 3×3, 64 → 64 | 8 × 64 × 56 × 56 | 2.00 | 1.00 | 0.50× | 1.0e-16 |" in text
    assert f"Slower than autograd by median: {ops.FAMILIES[0].label}." in text
    report = tmp_path / "B.md"
    report.write_text("# Benchmarks\n\n## On cpu\n\nseed rows\n")
    for _ in range(2):
        ops.write_report(report, text, ops.SECTION)
    assert report.read_text().count(ops.SECTION) == 1 and "seed rows" in report.read_text()


def test_a_device_run_rendered_again_replaces_its_section_and_keeps_the_others(tmp_path: Path):
    """`python -m benchmarks --rows cuda.json --output B.md` replaces `## On cuda` in place: the CPU
    section before it and the real-network sections after it stay; the GPU training section has its
    own title, so that the CPU's and the GPU's are each replaced alone."""
    from benchmarks import training
    from benchmarks.__main__ import main

    saved = json.loads((ROOT / "benchmarks" / "results" / "cuda-seeds.json").read_text())
    rows = tmp_path / "cuda.json"
    rows.write_text(json.dumps(saved))
    report = tmp_path / "B.md"
    report.write_text(
        f"# Benchmarks\n\nThe GPU runs (`## On cuda`) are older.\n\n## Summary\n\nsummary rows\n\n"
        f"## On cpu\n\ncpu rows\n\n## On cuda\n\nold gpu rows\n\n{training.SECTION}\n\n"
        f"training rows\n\n{training.SECTIONS['cuda']}\n\ngpu training rows\n"
    )
    for _ in range(2):
        assert main(["--rows", str(rows), "--output", str(report), "--plot", ""]) == 0
    text = report.read_text()
    assert (
        "old gpu rows" not in text and text.count("## On cuda") == 2 and "NVIDIA H200" in text
    )  # the title quoted stays
    assert all(
        part in text
        for part in (
            "The GPU runs (`## On cuda`) are older.",
            "summary rows",
            "cpu rows",
            "training rows",
            "gpu training rows",
        )
    )
    cpu = tmp_path / "cpu.json"  # a CPU run rendered again replaces its own section alone too
    cpu.write_text((ROOT / "benchmarks" / "results" / "cpu.json").read_text())
    assert main(["--rows", str(cpu), "--output", str(report), "--plot", ""]) == 0
    text = report.read_text()
    assert "cpu rows" not in text and text.count("## On cpu") == 1 and "NVIDIA H200" in text
    assert all(part in text for part in ("summary rows", "training rows", "gpu training rows"))
    gpu = json.loads((ROOT / "benchmarks" / "results" / "training-cuda.json").read_text())
    training.write_section(report, training.render(gpu), training.SECTIONS["cuda"])
    text = report.read_text()
    assert "gpu training rows" not in text and "training rows" in text and text.count(training.SECTIONS["cuda"]) == 1
    assert 'torch.autocast("cuda", dtype=torch.bfloat16)' in text and "Why the targets are missed on this GPU" in text


def test_the_autocast_policy_behind_the_unets_gpu_memory_is_what_benchmarks_md_says():
    """BENCHMARKS.md's reason for the U-Net's AMP memory on the GPU: CUDA's autocast upsamples in
    float32 and the concatenation promotes, where the CPU's keeps bfloat16 (read on fake CUDA
    tensors, so on any machine). If PyTorch changes that policy, the reason is stale."""
    from benchmarks.autocast_policy import dtypes

    cpu, cuda = dtypes("cpu"), dtypes("cuda")
    assert set(cpu.values()) == {torch.bfloat16}, cpu
    assert cuda["interpolate (bilinear ×2)"] == cuda["cat (bfloat16 skip, upsampled)"] == torch.float32, cuda
    assert cuda["conv2d"] == cuda["max_pool2d"] == torch.bfloat16, cuda
    assert not torch.is_autocast_enabled("cuda")  # the switches are put back


def test_the_saved_values_account_counts_each_storage_once_under_every_node_that_keeps_it():
    from benchmarks.saved_values import networks, saved_by_reader

    torch.manual_seed(0)
    model = networks()["resnet50"](4)
    x, target = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    by_readers, total = saved_by_reader(model, x, target)
    assert sum(by_readers.values()) == total
    # an in-place ReLU's result is the next convolution's input: one storage, kept by both
    shared = ("ConvolutionBackward0", "input"), ("ReluBackward0", "result")
    assert by_readers[shared] > 0
    # every batch norm keeps its input: 2 × C × 16² floats for the stem's alone
    assert by_readers[(("NativeBatchNormBackward0", "input"),)] >= 2 * 4 * 16 * 16 * 4
    # the same total as counting what autograd packs as the forward runs, each storage once
    packed = {}

    def pack(tensor):
        packed[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        _, again = saved_by_reader(model, x, target)
    for tensor in (*model.parameters(), *model.buffers()):
        packed.pop(tensor.untyped_storage().data_ptr(), None)
    assert again == total == sum(packed.values())
