"""A plain, non-editable install ships the templates and generates without the source tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def built_wheel(tmp_path: Path) -> Path:
    """The wheel of a clean copy of the tree: a build/ folder left in the checkout can hold stale copies
    of package data that setuptools would reuse."""
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".venv", "build", "dist", ".git", "*.egg-info", "__pycache__", "out", ".pytest_cache", ".hypothesis"
        ),
    )
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    return next(wheels.glob("symgrad-*.whl"))


MODEL = """
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(inplace=True))
        self.head = nn.Conv2d(3, 1, 1)

    def forward(self, x):
        return self.head(self.features(x))
"""

SMALL_SPEC = """
name: small_chain
inputs:
  x: {shape: [2, 2, 6, 6]}
  w1: {shape: [3, 2, 3, 3]}
  w2: {shape: [1, 3, 3, 3]}
  y: {shape: [2, 1, 3, 3]}
layers:
  - {op: conv2d, weight: w1, padding: 1, out: conv1}
  - {op: relu, out: relu1}
  - {op: conv2d, weight: w2, stride: 2, padding: 1, out: p}
loss: {op: half_sq_error, in: p, target: y, reduction: per_sample}
wrt: [x, w1, w2]
"""

TRAIN = """
import torch, symgrad
from model import Net

model = Net().double()
step = symgrad.bind("gen/net_gradients.py", model)
loss = step(x=torch.randn(3, 1, 6, 6, dtype=torch.float64), y=torch.randn(3, 1, 6, 6, dtype=torch.float64))
loss.backward()
assert model.head.weight.grad is not None and int(model.features[1].num_batches_tracked) == 1
print(symgrad.__file__)
"""


def test_the_wheel_ships_its_data_and_a_fresh_venv_with_only_it_runs_every_command(tmp_path: Path):
    """The built wheel holds the templates, the spec format and the licence; installed into a new venv outside
    the checkout (its dependencies seen through a path file, so nothing is downloaded), it runs each
    subcommand end to end, trace and bind included. The console script runs in its own process; the other
    subcommands run one after another in one interpreter of that venv (click's ``standalone_mode=False``:
    each must end with exit status 0), then the user's training script in its own."""
    import sysconfig
    import venv

    wheel = built_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    templates = Path(__file__).resolve().parents[2] / "templates"
    sections = [path.relative_to(templates).as_posix() for path in sorted(templates.glob("*/*.jinja"))]
    assert len(sections) > 20  # each top template imports its sections from its folder (module/, test_module/, ...)
    for template in ("module.py.jinja", "test_module.py.jinja", "derivation.md.jinja", *sections):
        assert f"symgrad/templates/{template}" in names
    assert "symgrad/docs/spec.md" in names  # `symgrad spec-help` works from a wheel
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    fresh = tmp_path / "fresh"
    venv.EnvBuilder(with_pip=False).create(fresh)
    python = fresh / "bin" / "python"
    site = fresh / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert site.is_dir(), sorted(path.name for path in (fresh / "lib").iterdir())
    # the dependencies (torch, sympy, ...) from this interpreter; its editable symgrad is not activated this way
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    (fresh / "bin" / "symgrad").write_text(f"#!{python}\nimport sys\nfrom symgrad.cli import main\nsys.exit(main())\n")
    (fresh / "bin" / "symgrad").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    (work / "s.yaml").write_text(SMALL_SPEC)
    (work / "model.py").write_text(MODEL)
    (work / "train.py").write_text(TRAIN)
    commands = [
        ["ops"],
        ["spec-help"],
        ["init", "starter.yaml"],
        ["generate", "s.yaml", "-o", "gen", "--verify"],
        ["check", "gen"],
        ["verify", "s.yaml"],
        ["docs", "s.yaml", "-o", "documents"],
        ["certify", "s.yaml"],
        [
            "trace",
            "model.py:Net",
            "--input",
            "x=2,1,6,6",
            "--loss",
            "mse",
            "--target",
            "y",
            "--train",
            "-o",
            "net.yaml",
        ],
        ["generate", "net.yaml", "-o", "gen"],
    ]
    (work / "commands.py").write_text(
        "import sys\nimport symgrad\nfrom symgrad.cli import main\nprint(symgrad.__file__)\n"
        f"for command in {commands!r}:\n"
        "    print('$ symgrad', *command, flush=True)\n"
        "    try:\n"
        "        code = main.main(command, prog_name='symgrad', standalone_mode=False)\n"
        "    except SystemExit as exit:\n"
        "        code = exit.code\n"
        "    assert code in (0, None), (command, code)\n"
    )
    environment = {"PATH": f"{fresh / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    for command in [
        [str(fresh / "bin" / "symgrad"), "--version"],
        [str(python), "commands.py"],
        [str(python), "train.py"],
    ]:
        result = subprocess.run(command, cwd=work, env=environment, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, (command[1:], result.stdout[-2000:], result.stderr[-2000:])
        assert command[-1] != "commands.py" or result.stdout.startswith(str(site)), result.stdout[:500]
        assert command[-1] != "commands.py" or result.stdout.count("$ symgrad") == len(commands)
    assert str(site) in result.stdout  # train.py imported the installed copy, not the source tree
    assert (work / "gen" / "small_chain.py").exists() and (work / "starter.yaml").exists()
    assert (work / "documents").is_dir() and (work / "gen" / "net_gradients.py").exists()
    for module in ("trace", "binding", "rules"):
        assert (site / "symgrad" / module).exists() or (site / "symgrad" / f"{module}.py").exists()
