"""symgrad's benchmarks: ``python -m benchmarks`` (``__main__.py`` parses its command line; ``side_by_side.py``
measures the seed cases and renders their report) and ``python -m benchmarks.NAME`` for the others; the report
helpers they share are in ``report.py``."""
