"""Every fused backward kernel called as autograd calls it (issue 38, item 8).

The fused derivation (what ``gradients`` runs) calls autograd's own kernels: ``convolution_backward``,
``native_group_norm_backward``, ``native_layer_norm_backward``, ``native_batch_norm_backward``,
``threshold_backward``, ``max_pool2d_with_indices_backward``, ``upsample_*_backward``,
``_adaptive_avg_pool*_backward``, ... Those read raw memory and some assume a layout that autograd
establishes before calling them (``derivatives.yaml`` calls ``native_group_norm_backward`` with
``grad.contiguous()``): given a permuted gradient, ``native_group_norm_backward`` returns wrong values,
silently. A gradient of any layout reaches them in real networks: a layer scale or an MLP done on
``[N, H, W, C]`` tokens (``x.permute(0, 2, 3, 1)``) hands the op before it a channels_last-strided
gradient.

The cases are found, not listed: every rule's sample (``SAMPLES`` in its rule file; every rule has one)
whose fused derivation calls a primitive its readable one does not is a fused case (derived in the test,
once per case and process, not at collection), and
every ``*_backward`` primitive the rules register must be reached by one. Each fused case is run with its
output permuted and flattened before the loss, so that its gradient arrives as a transposed view or
channels_last-strided, and compared, in float64, with autograd and with the readable derivation.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

from symgrad.algebra import PRIMITIVES, TensorOp
from symgrad.check import graph_inputs, reference_forward, relative_error, verify
from symgrad.graph import build_graph
from symgrad.late_weights import CHUNKED
from symgrad.printing import to_code
from symgrad.reverse import derive
from symgrad.spec import parse_spec
from tests.helpers import build_text, generated_module
from tests.rules.samples import CASES, TEXTS

OWN_PRIMITIVES = {"block_backward", "chain_backward", CHUNKED}
"""``*_backward`` primitives that are symgrad's own calls of a generated block, not autograd kernels, and the
planner's split of ``conv_backward`` (``late_weights.CHUNKED``: the same kernel in calls of fewer channels,
which the schedule makes, not a rule's derivation; tests/pipeline/test_late_weights.py checks it)."""


def _primitives(statements) -> set[str]:
    found = set()
    for statement in statements:
        for expression in [statement.value, *statement.value.atoms(TensorOp)]:
            if isinstance(expression, TensorOp):
                found.add(expression.primitive.name)
    return found


@functools.cache
def fused_only(case_id: str) -> frozenset[str]:
    """The primitives that the sample's fused derivation calls and its readable one does not (empty: the
    two are the same), derived once per sample in each test process."""
    graph = build_graph(parse_spec(TEXTS[case_id], case_id))
    readable, fused = derive(graph), derive(graph, fused=True)
    return frozenset(_primitives(fused.forward + fused.backward) - _primitives(readable.forward + readable.backward))


def fused_cases() -> dict[str, tuple[str, frozenset[str]]]:
    """id -> (spec text, the primitives only its fused derivation calls), for every rule sample whose
    fused derivation differs from its readable one."""
    return {case.id: (case.values[0], fused_only(case.id)) for case in CASES if fused_only(case.id)}


def test_every_fused_kernel_of_the_registry_is_reached_by_a_case():
    kernels = {name for name in PRIMITIVES if name.endswith("_backward")} - OWN_PRIMITIVES
    reached = set().union(*(kernels for _, kernels in fused_cases().values()))
    assert kernels <= reached, (
        f"no rule case reaches the fused kernel(s) {sorted(kernels - reached)}: add a sample that reaches it to its rule file's SAMPLES"
    )


LAYOUTS = {
    # the output's last two dims swapped: the gradient comes back as a transposed view
    "transposed": lambda rank: [*range(rank - 2), rank - 1, rank - 2],
    # channels moved last ([N, C, H, W] -> [N, H, W, C]): the gradient comes back channels_last-strided
    "channels_last": lambda rank: [0, *range(2, rank), 1],
}


def with_layout(text: str, layout: str) -> str | None:
    """The case with its output permuted to ``layout`` and flattened before the loss: the backward of
    the flatten is a view of the (contiguous) loss gradient, and the permute's a non-contiguous view
    of that, which reaches the op's fused kernel as it is. None where the output is too small for it."""
    spec = yaml.safe_load(text)
    if spec["loss"]["op"] != "half_sq_error":  # the fused op is the loss: its gradient is the loss's own
        return None
    graph = build_graph(parse_spec(text, "<case>"))
    output = graph.loss.operands["input"]
    shape = graph.nodes[output].shape
    if len(shape) < 3 or sorted(shape[1:]).count(1) >= len(shape) - 2:  # too few sizes above 1 to permute
        return None
    dims = LAYOUTS[layout](len(shape))
    permuted = [shape[d] for d in dims]
    spec["layers"] += [
        {"op": "permute", "in": output, "dims": dims, "out": "moved"},
        {"op": "flatten", "in": "moved", "start_dim": 1, "out": "tokens"},
    ]
    target = spec["loss"]["target"]
    spec["inputs"][target] = {"shape": [permuted[0], int(torch.Size(permuted[1:]).numel())]}
    spec["loss"] = {**spec["loss"], "in": "tokens"}
    return yaml.safe_dump(spec, sort_keys=False)


def run_readable(graph, inputs: dict, grad_loss: torch.Tensor) -> dict[str, torch.Tensor]:
    """The readable derivation (the one the docs show), run statement by statement."""
    program = derive(graph)
    names = {"torch": torch, "F": F, **{name: value.detach() for name, value in inputs.items()}, "grad_loss": grad_loss}
    statements = program.forward + program.backward
    for name in sorted(_primitives(statements)):
        if PRIMITIVES[name].helper:
            exec(PRIMITIVES[name].helper, names)  # noqa: S102 - symgrad's own helper source
    for statement in statements:
        exec(f"{statement.target.name} = {to_code(statement.value)}", names)  # noqa: S102 - symgrad's printed code
    return {name: names[symbol.name] for name, symbol in program.gradients.items()}


CASE_IDS = sorted(TEXTS)
"""Every sample: one whose fused derivation is its readable one is skipped in the test, which derives it
(collection stays cheap: deriving all of them took ~16 s per xdist worker)."""


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("case_id", CASE_IDS)
def test_fused_kernel_takes_a_gradient_of_any_layout(case_id, layout):
    if not fused_only(case_id):
        pytest.skip("its fused derivation calls no kernel its readable one does not")
    text = with_layout(TEXTS[case_id], layout)
    if text is None:
        pytest.skip("the op is the loss, or its output has too few sizes above 1 for a layout of its own")
    built = build_text(text, f"{case_id}.yaml")
    module = generated_module(built)
    shapes = {node.name: tuple(node.shape) for node in built.graph.inputs}  # the case's own, not the smallest
    inputs = graph_inputs(built.graph, shapes, seed=5)
    loss = reference_forward(built.graph, inputs)
    cotangent = torch.randn(loss.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    wrt = list(built.graph.wrt)
    expected = dict(zip(wrt, torch.autograd.grad(loss, [inputs[name] for name in wrt], cotangent)))
    fused = module.gradients(**{name: value.detach() for name, value in inputs.items()}, grad_loss=cotangent)
    readable = run_readable(built.graph, inputs, cotangent)
    for name in wrt:
        assert relative_error(getattr(fused, name), expected[name]) <= 1e-10, (name, "fused vs autograd")
        assert relative_error(getattr(fused, name), readable[name]) <= 1e-10, (name, "fused vs readable")


# PoolFormer (MetaFormer) as timm writes it: GroupNorm(1, C), pooling minus its input as the token
# mixer, layer scales; its channel MLP on [N, H, W, C] tokens (nn.Linear), so the gradient reaching
# the second GroupNorm is the permute back of a contiguous [N, H, W, C] one: channels_last-strided.
class GroupNorm1(nn.GroupNorm):
    def __init__(self, num_channels, **kwargs):
        super().__init__(1, num_channels, **kwargs)


class Pooling(nn.Module):
    def __init__(self, pool_size=3):
        super().__init__()
        self.pool = nn.AvgPool2d(pool_size, stride=1, padding=pool_size // 2, count_include_pad=False)

    def forward(self, x):
        return self.pool(x) - x


class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, in_features)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class PoolFormerBlock(nn.Module):
    def __init__(self, dim, mlp_ratio=4.0, layer_scale_init_value=1e-5):
        super().__init__()
        self.norm1 = GroupNorm1(dim)
        self.token_mixer = Pooling(pool_size=3)
        self.norm2 = GroupNorm1(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.layer_scale_1 = nn.Parameter(layer_scale_init_value * torch.ones(dim))
        self.layer_scale_2 = nn.Parameter(layer_scale_init_value * torch.ones(dim))

    def forward(self, x):
        x = x + self.layer_scale_1.unsqueeze(-1).unsqueeze(-1) * self.token_mixer(self.norm1(x))
        y = self.mlp(self.norm2(x).permute(0, 2, 3, 1)) * self.layer_scale_2
        return x + y.permute(0, 3, 1, 2)


def test_poolformer_block_matches_autograd_through_the_module_and_verify_checks_the_fused_path():
    from symgrad.trace import LossChoice, trace
    from symgrad.trace.run_once import source_name

    torch.manual_seed(0)
    model = PoolFormerBlock(8, layer_scale_init_value=0.5).double()
    text = trace(model, {"x": (2, 8, 5, 5)}, loss=LossChoice("mse_loss"))
    built = build_text(text, "poolformer.yaml")
    module = generated_module(built)
    spec = yaml.safe_load(text)
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(3, 8, 9, 7, generator=generator, dtype=torch.float64, requires_grad=True)
    target = torch.randn(3, 8, 9, 7, generator=generator, dtype=torch.float64)
    named = {source_name("", key, model): value for key, value in model.named_parameters()}
    arguments = {key: {"x": x, "target": target}.get(key, named.get(key)) for key in spec["inputs"]}
    wrt = spec["wrt"]
    expected = torch.autograd.grad(F.mse_loss(model(x), target), [arguments[key] for key in wrt])
    actual = module.gradients(**{key: value.detach() for key, value in arguments.items()})
    scale = max(value.abs().max().item() for value in expected)
    for key, reference in zip(wrt, expected):
        error = (getattr(actual, key) - reference).abs().max().item()
        assert error <= 1e-12 * scale, (key, error / scale)  # norm1's bias: zero exactly (pool(c) - c = 0)
    assert verify(built.graph, module, built.shapes).worst() <= 1e-12


def test_verify_also_checks_at_a_non_degenerate_size():
    from symgrad.shapes import non_degenerate_shapes

    text = TEXTS["group_norm"]
    built = build_text(text, "group_norm.yaml")
    larger = non_degenerate_shapes(built.graph)
    spec = {node.name: node.shape for node in built.graph.inputs}
    assert larger is not None and all(
        size >= min(7, spec["x"][axis]) for axis, size in enumerate(larger["x"]) if axis >= 2
    )
    assert max(built.shapes[0]["x"][2:]) < 7  # the smallest shapes alone are degenerate
    steps = []
    verify(built.graph, generated_module(built), built.shapes, progress=steps.append)
    assert steps[-1] == f"float64 against autograd at test shapes {len(built.shapes) + 1} of {len(built.shapes) + 1}"


def test_kernels_that_need_the_gradient_in_the_inputs_dtype_are_given_it():
    """Under autocast a gradient may arrive in float32 (from an op autocast runs in float32) at a kernel
    whose input is bfloat16; autograd gives the kernel the gradient in its input's dtype, which
    ``max_pool*_with_indices_backward`` and ``_adaptive_avg_pool*_backward`` require."""
    from symgrad.algebra import Params

    x = torch.randn(2, 3, 6, 6).bfloat16()
    grad = torch.randn(2, 3, 2, 2)
    _, indices = torch.ops.aten.max_pool2d_with_indices(x, [3, 3], [3, 3], [0, 0], [1, 1], False)
    calls = {
        "adaptive_avg_pool_backward": Params.of(dims=2),
        "max_pool_backward": Params.of(dims=2, kernel_size=(3, 3), stride=(3, 3), padding=(0, 0), dilation=(1, 1)),
    }
    for name, params in calls.items():
        code = PRIMITIVES[name].code(["grad", "x", "indices"], params, str)
        result = eval(code, {"torch": torch, "grad": grad, "x": x, "indices": indices})  # noqa: S307 - symgrad's own code
        assert result.dtype == x.dtype and result.shape == x.shape, name


@pytest.mark.parametrize("name", ["group_norm", "layer_norm"])
def test_norm_kernels_take_a_float32_weight_with_a_bfloat16_input_as_cuda_does(name):
    """Under autocast an affine instance norm (or a layer norm after a convolution) reaches its fused
    backward with x and the gradient in bfloat16 and the weight in float32. The CPU's kernels take the
    mix; CUDA's read the weight (and group_norm's statistics) in x's dtype and refuse it, which failed
    the bound U-Net 3D, MONAI blocks, MaxViT and MobileViT steps under CUDA autocast. The helpers
    compute in float32 there, as autograd's kernels do, and return each gradient in its tensor's dtype."""
    from symgrad.rules.norm import GROUP_NORM_BACKWARD, LAYER_NORM_BACKWARD
    from tests.helpers import CudaNormKernels

    namespace = {"torch": torch}
    exec(GROUP_NORM_BACKWARD + LAYER_NORM_BACKWARD, namespace)  # noqa: S102 - symgrad's own helpers
    namespace["LAYER_NORM_MIXED_DEVICES"] = ()  # as on a GPU: no device's layer_norm kernels take the mix
    generator = torch.Generator().manual_seed(3)
    x, grad = (torch.randn(2, 4, 3, 5, 6, generator=generator, dtype=torch.float64) for _ in range(2))
    weight, bias = (
        torch.randn(4 if name == "group_norm" else 6, generator=generator, dtype=torch.float64) for _ in range(2)
    )

    def helper(x, grad, weight, bias):
        if name == "group_norm":  # an instance norm: one channel per group; under autocast the forward
            return namespace["_group_norm_backward"](grad, x, weight, 4, None, None)  # keeps no statistics
        # the statistics as the forward computed them: in float32 under CUDA's autocast (its layer_norm
        # casts every operand), from x and a weight of one dtype elsewhere
        promoted = torch.promote_types(x.dtype, weight.dtype)
        _, mean, rstd = torch.native_layer_norm(x.to(promoted), [6], weight.to(promoted), bias.to(promoted), 1e-5)
        return namespace["_layer_norm_backward"](grad, x, [6], weight, bias, mean, rstd)

    exact = helper(x, grad, weight, bias)
    with CudaNormKernels():
        mixed = helper(x.bfloat16(), grad.bfloat16(), weight.float(), bias.float())
    assert [value.dtype for value in mixed] == [torch.bfloat16, torch.float32, torch.float32]
    # from the bfloat16-rounded x and gradient, in float32: the input's gradient within bfloat16's rounding
    rounded = helper(x.bfloat16().double(), grad.bfloat16().double(), weight, bias)
    for value, expected in zip(mixed, rounded):
        assert (value.double() - expected).norm() <= 1e-2 * expected.norm()
    assert (mixed[1].double() - rounded[1]).norm() <= 1e-5 * rounded[1].norm()
    assert all(value.shape == expected.shape for value, expected in zip(mixed, exact))
