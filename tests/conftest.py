"""Shared pytest hooks: the OpInfo coverage report, and how many slow tests a ``-m "not slow"`` run
left out, are printed at the end of the run.

The suite runs in parallel (pytest-xdist, ``-n auto`` in pyproject.toml's addopts; ``-n 0`` runs it in one
process). Each worker fills its own ``OPINFO_REPORT`` and ``DESELECTED_SLOW``; a worker hands them to the
controller when it finishes (``workeroutput``), and the controller merges them before its summary, so
the report is the same in one process or many."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest

# sympy's cache holds 1,000 results by default (least recently used go): one spec's derivation fits, but a
# worker derives hundreds of specs whose ops repeat, and evicts what the next one asks again. 100,000 made
# tests/rules/test_rules.py with test_block_calling_code.py 8 % and the segmentation zoo's module checks 4 %
# cheaper in CPU. Read by sympy when it is imported: set here, before any test module imports it (and in the
# environment the xdist workers start with). A value set by hand is kept.
os.environ.setdefault("SYMPY_CACHE_SIZE", "100000")

OPINFO_REPORT: dict[str, dict] = {}
DESELECTED_SLOW: list[str] = []
DESELECTED: list[str] = []  # every deselected test (-k, -m), for the controller's "N deselected" under xdist


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config):
    if not _is_worker(config) and config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None):
        # one torch (OpenMP) thread per worker, set before the workers start and import torch: the workers
        # already fill the cores, and each worker's own pool on top of them only spins and contends (the
        # bind zoo's float64 steps: 2.5x the CPU time and wall time with two threads per worker on two
        # cores). Set in the environment, not by torch.set_num_threads(1) after torch started: that made
        # tests/benchmarks/test_benchmarks.py::test_the_training_step_variants_compute_the_same_step segfault
        # in autograd's backward (torch 2.13 CPU); the whole file passes with OMP_NUM_THREADS=1. The
        # subprocesses tests start (generated test files, examples) inherit it. A value set by hand is kept.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    if not _is_worker(config) and config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_MergeWorkerReports(config), "symgrad-merge-worker-reports")


def pytest_collection_finish(session):
    """Everything collection made (torch, sympy, the zoo's models, OpInfo's op_db: about 470,000 objects) moved out
    of the garbage collector's way (``gc.freeze``): each full collection the process runs later walks only what
    the tests made since. The objects stay as they are; those of collection are module-level and live to the
    end anyway. The hybrid and modern zoos' 36 autograd checks, collected with the whole suite, in one process:
    the full collections took 2.7 s of CPU where they took 4.9 (65 s in all)."""
    import gc

    gc.collect()
    gc.freeze()


def pytest_deselected(items):
    DESELECTED.extend(item.nodeid for item in items)
    DESELECTED_SLOW.extend(item.nodeid for item in items if item.get_closest_marker("slow") is not None)


def pytest_sessionfinish(session):
    if _is_worker(session.config):
        session.config.workeroutput["symgrad_opinfo"] = OPINFO_REPORT
        session.config.workeroutput["symgrad_deselected_slow"] = DESELECTED_SLOW
        session.config.workeroutput["symgrad_deselected"] = DESELECTED


class _MergeWorkerReports:
    """On the xdist controller: each worker's report, merged as it shuts down."""

    def __init__(self, config):
        self.config = config

    @pytest.hookimpl
    def pytest_testnodedown(self, node, error):
        output = getattr(node, "workeroutput", {})
        for op, counts in output.get("symgrad_opinfo", {}).items():
            merged = OPINFO_REPORT.setdefault(op, {"run": 0, "skipped": []})
            merged["run"] += counts["run"]
            merged["skipped"].extend(counts["skipped"])
        # every worker collects (and deselects) the whole suite: the same list from each
        known = set(DESELECTED_SLOW)
        DESELECTED_SLOW.extend(nodeid for nodeid in output.get("symgrad_deselected_slow", []) if nodeid not in known)
        # the controller collects nothing, so its last line would leave out "N deselected": add them, once
        known = set(DESELECTED)
        new = [nodeid for nodeid in output.get("symgrad_deselected", []) if nodeid not in known]
        DESELECTED.extend(new)
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and new:
            reporter.stats.setdefault("deselected", []).extend(SimpleNamespace(nodeid=nodeid) for nodeid in new)


def pytest_terminal_summary(terminalreporter):
    if DESELECTED_SLOW:
        terminalreporter.write_line(
            f"{len(DESELECTED_SLOW)} slow tests deselected, not run: this is the local fast loop; "
            "CI (.ci/run, plain `pytest -q`) runs them"
        )
    if not OPINFO_REPORT:
        return
    terminalreporter.section("OpInfo samples (torch.testing._internal.common_methods_invocations.op_db)")
    for op, counts in sorted(OPINFO_REPORT.items()):
        terminalreporter.write_line(f"{op}: {counts['run']} run, {len(counts['skipped'])} skipped")
        reasons: dict[str, int] = {}
        for reason in counts["skipped"]:
            reasons[reason] = reasons.get(reason, 0) + 1
        for reason, number in sorted(reasons.items()):
            terminalreporter.write_line(f"    skipped {number}: {reason}")


@pytest.fixture(scope="session", autouse=True)
def _built_once_folder(tmp_path_factory):
    """``tests/models/built_once.py``'s folder: one for the run, inside pytest's, which every xdist worker's is in."""
    from tests.models import built_once

    base = tmp_path_factory.getbasetemp()
    built_once.FOLDER = (base.parent if base.name.startswith("popen-") else base) / "built-once"


@pytest.fixture(autouse=True)
def _fresh_dynamo_caches():
    """Each test compiles from Dynamo's empty caches: its recompile limit (8 a code object) counts
    every bound model a worker process compiled before (they share ``BoundModel.forward``), so with
    fullgraph=True a test's outcome would depend on which tests ran before it in its process."""
    yield
    if "torch._dynamo" in sys.modules:
        sys.modules["torch._dynamo"].reset()
