"""Shared pytest hooks: the OpInfo coverage report, and how many slow tests a ``-m "not slow"`` run
left out, are printed at the end of the run."""

OPINFO_REPORT: dict[str, dict] = {}
DESELECTED_SLOW: list[str] = []


def pytest_deselected(items):
    DESELECTED_SLOW.extend(item.nodeid for item in items if item.get_closest_marker("slow") is not None)


def pytest_terminal_summary(terminalreporter):
    if DESELECTED_SLOW:
        terminalreporter.write_line(f"{len(DESELECTED_SLOW)} slow tests deselected, not run: this is the local fast loop; "
                                    "CI (.ci/run, plain `pytest -q`) runs them")
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
