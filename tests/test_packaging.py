"""A plain, non-editable install ships the templates and generates without the source tree."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_ships_templates_and_generates(tmp_path: Path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                    str(ROOT)], check=True, capture_output=True)
    wheel = next(wheels.glob("symgrad-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for template in ("module.py.jinja", "test_module.py.jinja", "derivation.md.jinja"):
        assert f"symgrad/templates/{template}" in names
    assert "symgrad/docs/spec.md" in names  # `symgrad spec-help` works from a wheel
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    work = tmp_path / "work"
    work.mkdir()
    (work / "s.yaml").write_text((ROOT / "examples" / "seed1_strided_conv.yaml").read_text())
    result = subprocess.run([sys.executable, "-c", "import symgrad, sys; print(symgrad.__file__); "
                             "from symgrad.cli import main; sys.argv=['symgrad','generate','s.yaml','-o','gen']; main()"],
                            cwd=work, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert str(site) in result.stdout.splitlines()[0]  # the installed copy, not the source tree
    assert (work / "gen" / "seed1_strided_conv.py").exists()
    help_text = subprocess.run([sys.executable, "-c", "import sys; from symgrad.cli import main; "
                                "sys.argv=['symgrad','spec-help']; main()"],
                               cwd=work, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert help_text.stdout.startswith("# The spec format"), help_text.stderr
