"""The names a generated module defines for itself are never taken by a spec's table, and a module that
binds a module-level name twice is refused before anything is written.

A submodule named ``blocks`` made a chain table named ``BLOCKS``, which replaced the module's own
``BLOCKS`` dictionary: the module imported, ``symgrad generate`` exited 0, and the first call failed
(``tuple indices must be integers or slices, not str``)."""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import symgrad
from symgrad.body_graphs import MODULE_NAMES
from symgrad.errors import GeneratorError
from symgrad.names import check_module_source
from symgrad.spec import parse_spec
from symgrad.trace import trace
from tests.helpers import build_text, module_from_source, parameter_gradients

GENERATED = Path(__file__).resolve().parents[2] / "generated"


class Residual(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return x + torch.relu(self.conv(x))


class Trunk(nn.Module):
    """timm's and DINO's ViT name their stage ``self.blocks``."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.blocks = nn.Sequential(*[Residual(4) for _ in range(4)])
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def _module_constants(source: str) -> set[str]:
    tree = ast.parse(source)
    return {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name) and target.id.isupper()
    }


def test_a_submodule_named_blocks_gets_a_table_of_another_name_and_trains_as_autograd_does():
    torch.manual_seed(0)
    model = Trunk().double()
    text = trace(model, {"x": (2, 3, 8, 8)}, wrt="parameters", name="trunk", mode="train", blocks=True)
    source = build_text(text, "trunk.yaml").rendered.files["trunk.py"]
    tables = set(re.findall(r"_run_forward\(([A-Z][A-Z0-9_]*)", source))
    assert tables and "BLOCKS" not in tables, tables
    bound_model = copy.deepcopy(model)
    bound = symgrad.bind(module_from_source(source, "trunk"), bound_model)
    x = torch.randn(3, 3, 10, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    cotangent = torch.randn(3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    (bound(x) * cotangent).sum().backward()
    (model(x) * cotangent).sum().backward()
    for (name, ours), theirs in zip(bound_model.named_parameters(), model.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-12, atol=1e-14, msg=name)


class Lowercase(nn.Module):
    """A stage named ``f``: its table would be ``F``, the name of ``torch.nn.functional`` in the module."""

    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(*[Residual(3) for _ in range(4)])

    def forward(self, x):
        return self.f(x)


def test_a_submodule_whose_table_would_be_f_leaves_torch_nn_functional_alone():
    torch.manual_seed(0)
    model = Lowercase().double()
    source = build_text(
        trace(model, {"x": (2, 3, 6, 6)}, wrt="parameters", name="lower", mode="train", blocks=True), "lower.yaml"
    ).rendered.files["lower.py"]
    tables = set(re.findall(r"_run_forward\(([A-Z][A-Z0-9_]*)", source))
    assert tables and "F" not in tables, tables
    x = torch.randn(2, 3, 7, 5, dtype=torch.float64)
    ours = symgrad.bind(module_from_source(source, "lower"), copy.deepcopy(model))(x)
    torch.testing.assert_close(ours, model(x), rtol=0, atol=0)


def test_module_names_lists_every_constant_the_templates_write():
    """A constant added to a template (or to the header symgrad writes) and not to MODULE_NAMES fails here."""
    from symgrad.roles import THRESHOLD_NAME

    root = GENERATED.parent
    texts = [path.read_text() for path in (root / "templates").rglob("*.jinja")]  # module.py.jinja's sections too
    written = {name for text in texts for name in re.findall(r'(?m)^(?:\{\{ \(")?([A-Z][A-Z0-9_]+) = ', text)}
    written |= {
        name
        for path in (root / "symgrad").glob("*.py")
        for name in re.findall(r'f?"([A-Z][A-Z0-9_]+) = ', path.read_text())
    }
    assert {"BLOCKS", "FINGERPRINT", "OUTPUTS", "CLASSES"} <= written  # the scan reads what it should
    assert written | {THRESHOLD_NAME} <= MODULE_NAMES


@pytest.mark.parametrize("path", sorted(GENERATED.glob("*.py")), ids=lambda path: path.name)
def test_every_constant_a_generated_file_defines_is_a_module_name_or_a_chain_table(path):
    source = path.read_text()
    tables = set(re.findall(r"_run_forward\(([A-Z][A-Z0-9_]*)", source))
    assert _module_constants(source) - tables <= MODULE_NAMES


def test_a_module_that_binds_a_name_twice_is_refused_as_symgrads_own_bug():
    spec_path = GENERATED.parent / "examples" / "seed3_conv_relu_conv.yaml"
    spec = parse_spec(spec_path.read_text(), str(spec_path))
    source = (GENERATED / "seed3_conv_relu_conv.py").read_text()
    check_module_source(spec, source)  # as written: each name once
    with pytest.raises(GeneratorError, match="module-level name 'gradients' twice"):
        check_module_source(spec, source + "\n\ndef gradients():\n    pass\n")
    with pytest.raises(GeneratorError, match="module-level name 'F' twice"):  # an import binds its name too
        check_module_source(spec, source + "\n\nF = ()\n")
    check_module_source(spec, source + "\n\nFINGERPRINT[''] = None\n")  # binds no name


class MaskHead(nn.Module):  # its module traces as mask_head_gradients: a file's name, not a variable of the code
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)

    def forward(self, x):
        return torch.tanh(self.conv(x))


def test_a_module_name_may_start_with_a_prefix_the_code_reserves_for_its_variables():
    """A class ``MaskHead``, ``LocalNet`` or ``SharedEncoder`` traced under its own name: the module name is a
    file's name (``mask_head_gradients.py``), never a variable, so the prefixes the generated code keeps for
    its variables (``mask_``, ``local_``, ``shared_``) do not apply to it; a node's name still may not take one."""
    model = MaskHead().double()
    text = trace(model, {"x": (2, 2, 5, 5)}, wrt="parameters", name="mask_head_gradients")
    files = build_text(text, "mask_head_gradients.yaml").rendered.files
    module = module_from_source(files["mask_head_gradients.py"], "mask_head_gradients")
    x = torch.randn(3, 2, 4, 6, dtype=torch.float64)
    for key, got, reference in parameter_gradients(model, module, x):
        assert (got - reference).abs().max() <= 1e-12 * reference.abs().max(), key
    renamed = text.replace("out: conv}", "out: mask_conv}").replace("in: conv,", "in: mask_conv,")
    with pytest.raises(Exception, match="starts with a prefix the generated code reserves"):
        parse_spec(renamed.replace("in: conv}", "in: mask_conv}"), "renamed.yaml")
