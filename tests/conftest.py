"""Shared pytest hooks: the OpInfo coverage report is printed at the end of the run."""

OPINFO_REPORT: dict[str, dict] = {}


def pytest_terminal_summary(terminalreporter):
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
