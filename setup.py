"""Package discovery: every package under symgrad/ is found, so a new subpackage cannot be left out of
the wheel, and the top-level templates/ and docs/ folders ship inside it as symgrad.templates and
symgrad.docs (pyproject.toml's own discovery cannot add packages mapped from other folders). All
other settings are in pyproject.toml."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["symgrad", "symgrad.*"]), "symgrad.templates", "symgrad.docs"])
