"""The side-by-side benchmark: ``python -m benchmarks`` (see ``benchmarks/__main__.py``)."""
