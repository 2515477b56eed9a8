"""Exact certificates that the emitted adjoints of linear and bilinear ops are transposes.

For a small instance of a convolution, the operator's exact coefficients are counted from the
index definition of convolution, independently of PyTorch and of symgrad's rules:

    out[n, o, i] = sum_{c, a} w[o, c, a] * x_pad[n, g(o) * C_g + c, i * s + a * d]

Convolution is bilinear, so one integer array ``T[m, i, j]`` (the coefficient of ``x_i * w_j`` in
output ``m``) holds it whole: ``A(w)`` (input side, outputs x inputs) is ``sum_j w_j T[:, :, j]``
and ``W(x)`` (weight side, outputs x weights) is ``sum_i x_i T[:, i, :]``. The emitted gradient
module is then probed: for every one-hot weight ``e_j`` and one-hot cotangent ``e_m`` it returns
the column ``B(e_j)[:, m]`` of the input adjoint it implements, and for every one-hot input ``e_i``
the column ``V(e_i)[:, m]`` of its weight adjoint. Those runs use only 0/1 inputs, so float64
computes them exactly (each entry is checked integral) and they convert to int64. By linearity
``B(w) = sum_j w_j B(e_j)``, so the polynomial identity ``B(w) - A(w)^T = 0`` holds for *every*
weight exactly when the integer arrays agree coefficient by coefficient: ``B(e_j)[i, m] ==
T[m, i, j]`` for all ``i, m, j``; likewise ``V(e_i)[j, m] == T[m, i, j]`` for every input. Equal
integer arrays are the same proof as a zero residual after sympy expansion, without the algebra.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass

import sympy
import torch
import yaml

from .check import module_from_source
from .errors import SymgradError
from .rules import CERTIFICATE_CASES
from .rules.conv import CONV_CERTIFICATES


@dataclass(frozen=True)
class ConvCase:
    dims: int
    batch: int
    in_channels: int
    size: tuple[int, ...]
    out_channels: int
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int = 1

    @property
    def label(self) -> str:
        return (
            f"conv{self.dims}d x{[self.batch, self.in_channels, *self.size]} w{[self.out_channels, self.in_channels // self.groups, *self.kernel]} "
            f"stride={list(self.stride)} padding={list(self.padding)} dilation={list(self.dilation)} groups={self.groups}"
        )

    @property
    def out_size(self) -> tuple[int, ...]:
        return tuple(
            (n + 2 * p - d * (k - 1) - 1) // s + 1
            for n, k, s, p, d in zip(self.size, self.kernel, self.stride, self.padding, self.dilation)
        )


CASES = [ConvCase(*case) for case in CONV_CERTIFICATES]
"""The convolution certificates, as ``symgrad/rules/conv.py`` declares them beside the rule."""


def _spec_text(case: ConvCase, wrt: tuple[str, ...] = ("x", "w")) -> str:
    x = [case.batch, case.in_channels, *case.size]
    w = [case.out_channels, case.in_channels // case.groups, *case.kernel]
    y = [case.batch, case.out_channels, *case.out_size]
    return yaml.safe_dump(
        {
            "name": "certified",
            "inputs": {"x": {"shape": x}, "w": {"shape": w}, "y": {"shape": y}},
            "layers": [
                {
                    "op": f"conv{case.dims}d",
                    "weight": "w",
                    "stride": list(case.stride),
                    "padding": list(case.padding),
                    "dilation": list(case.dilation),
                    "groups": case.groups,
                }
            ],
            "loss": {"op": "half_sq_error", "target": "y"},
            "wrt": list(wrt),
        },
        sort_keys=False,
    )


def _definition_coefficients(case: ConvCase) -> torch.Tensor:
    """``T[m, i, j]``: the integer coefficient of ``x_i * w_j`` in output ``m`` (flat row-major
    indices), counted from the index definition above with Python integers."""
    x_shape, w_shape, y_shape = _shapes(case)
    x_index = {index: position for position, index in enumerate(itertools.product(*map(range, x_shape)))}
    w_index = {index: position for position, index in enumerate(itertools.product(*map(range, w_shape)))}
    per_group_in, per_group_out = case.in_channels // case.groups, case.out_channels // case.groups
    coefficients = torch.zeros(_numel(y_shape), len(x_index), len(w_index), dtype=torch.int64)
    for row, (n, o, *i) in enumerate(itertools.product(*map(range, y_shape))):
        group = o // per_group_out
        for c in range(per_group_in):
            for taps in itertools.product(*map(range, case.kernel)):
                position = tuple(
                    i_k * s - p + a * d for i_k, s, p, d, a in zip(i, case.stride, case.padding, case.dilation, taps)
                )
                if all(0 <= q < n_k for q, n_k in zip(position, case.size)):  # outside is zero padding
                    coefficients[row, x_index[(n, group * per_group_in + c, *position)], w_index[(o, c, *taps)]] += 1
    return coefficients


def _shapes(case: ConvCase) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    return (
        (case.batch, case.in_channels, *case.size),
        (case.out_channels, case.in_channels // case.groups, *case.kernel),
        (case.batch, case.out_channels, *case.out_size),
    )


def _exact(tensor: torch.Tensor) -> torch.Tensor:
    """A probe's float64 result as int64, refused unless every entry is an integer (then float64 was exact)."""
    flat = tensor.detach().flatten()
    if not (torch.equal(flat, flat.round()) and bool((flat.abs() < 2**53).all())):
        raise AssertionError("a probe was not integral, so float64 was not exact: enlarge nothing, shrink the case")
    return flat.to(torch.int64)


def certify(case: ConvCase) -> tuple[int, int]:
    """Prove both adjoints of ``case`` as emitted: derived separately (the module for one gradient
    alone: conv_transpose for the input's, and for the weight's both the readable correlation, which
    the documents, ``hvp`` and an unbatched input run, and the one ``convolution_backward`` call asking
    for it alone that ``gradients`` runs) and fused (both gradients from one ``convolution_backward``
    call, what ``gradients`` runs when both are wanted). Returns the number of matrix entries checked on
    each side (each entry a polynomial, proven coefficient by coefficient)."""
    coefficients = _definition_coefficients(case)
    input_entries, weight_entries = 0, 0
    with _one_thread():
        for wrt, fused in ((("x",), True), (("w",), False), (("w",), True), (("x", "w"), True)):
            entries = _certify_module(case, wrt, coefficients, fused)
            input_entries, weight_entries = input_entries + entries[0], weight_entries + entries[1]
    return input_entries, weight_entries


@contextlib.contextmanager
def _one_thread():
    """Run the probes on one thread: they are thousands of calls on tensors of a few dozen entries,
    where a second thread only adds synchronisation (and on a busy machine waits for a core)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _certify_module(
    case: ConvCase, wrt: tuple[str, ...], coefficients: torch.Tensor, fused: bool = True
) -> tuple[int, int]:
    from .pipeline import build_text

    built = build_text(_spec_text(case, wrt), "certify.yaml", fused=fused, documents=False)
    module = module_from_source(built.rendered.files["certified.py"], "certified")
    x_shape, w_shape, y_shape = _shapes(case)
    outputs, inputs, weights = coefficients.shape
    forward = torch.nn.functional.__dict__[f"conv{case.dims}d"]

    def adjoints(x: torch.Tensor, w: torch.Tensor, cotangent: torch.Tensor):
        # with residual = conv(x, w) - y, choosing y = conv(x, w) - cotangent makes the gradient
        # arriving at the conv output exactly the cotangent, so the module returns the adjoints
        y = (
            forward(x, w, stride=case.stride, padding=case.padding, dilation=case.dilation, groups=case.groups)
            - cotangent
        )
        return module.gradients(x=x, w=w, y=y)

    def one_hot(size: int, index: int, shape) -> torch.Tensor:
        basis = torch.zeros(size, dtype=torch.float64)
        basis[index] = 1
        return basis.reshape(shape)

    zeros_x = torch.zeros(x_shape, dtype=torch.float64)
    zeros_w = torch.zeros(w_shape, dtype=torch.float64)
    # B[i, m, j]: entry (i, m) of the emitted input adjoint B(w), coefficient of w_j; V[j, m, i]:
    # entry (j, m) of the emitted weight adjoint V(x), coefficient of x_i
    B = torch.zeros(inputs, outputs, weights, dtype=torch.int64)
    V = torch.zeros(weights, outputs, inputs, dtype=torch.int64)
    for m in range(outputs):
        cotangent = one_hot(outputs, m, y_shape)
        for j in range(weights if "x" in wrt else 0):
            B[:, m, j] = _exact(adjoints(zeros_x, one_hot(weights, j, w_shape), cotangent).x)
        for i in range(inputs if "w" in wrt else 0):
            V[:, m, i] = _exact(adjoints(one_hot(inputs, i, x_shape), zeros_w, cotangent).w)
    form = "fused" if len(wrt) > 1 else "fused, weight alone" if wrt == ("w",) and fused else "alone"
    # A(w)^T[i, m] = sum_j w_j T[m, i, j]  and  W(x)^T[j, m] = sum_i x_i T[m, i, j]
    if "x" in wrt and not torch.equal(B, coefficients.permute(1, 0, 2)):
        raise AssertionError(f"{case.label}: the emitted input adjoint ({form}) is not A(w)^T")
    if "w" in wrt and not torch.equal(V, coefficients.permute(2, 0, 1)):
        raise AssertionError(f"{case.label}: the emitted weight adjoint ({form}) is not W(x)^T")
    return (inputs * outputs if "x" in wrt else 0), (weights * outputs if "w" in wrt else 0)


# --------------------------------------------------------------------------------------------
# Every other linear or bilinear rule, against PyTorch's own forward
# --------------------------------------------------------------------------------------------


LINEAR_CASES = CERTIFICATE_CASES
"""Every linear rule's certificate cases, as its rule file declares them (``CERTIFICATES``)."""


def _rational(values: list[float], label: str) -> list[sympy.Rational]:
    """Exact entries: integers, or rationals like 1/9, recovered from their double and checked."""
    result = []
    for value in values:
        exact = sympy.Rational(value).limit_denominator(10_000)
        if abs(float(exact) - value) > 1e-12:
            raise AssertionError(f"{label}: entry {value!r} is not a small rational, so the probe was not exact")
        result.append(exact)
    return result


@_one_thread()
def certify_linear(label: str, inputs: dict, layer: dict, linear: tuple[str, ...]) -> int:
    """Prove the emitted adjoint of each linear operand is the exact transpose of PyTorch's forward
    operator, for every basis value of the other operand (so for all of its values). Returns the
    number of matrix entries compared."""
    from .graph import build_graph
    from .pipeline import build_text
    from .reference import reference_values
    from .spec import parse_spec

    # an int64 input (gather's index) is a constant, given by its entries: {"int64": [[...], ...]}
    constants = {
        name: torch.tensor(value["int64"], dtype=torch.int64)
        for name, value in inputs.items()
        if isinstance(value, dict)
    }
    inputs = {name: tuple(constants[name].shape) if name in constants else value for name, value in inputs.items()}
    # the case's own output and target take names none of its inputs has (a spec's `y`, `out`)
    out, y = (
        next(
            name for name in itertools.chain([base], (f"{base}_{n}" for n in itertools.count(2))) if name not in inputs
        )
        for base in ("out", "y")
    )
    draft = {
        "name": "certified",
        "inputs": {k: {"shape": list(v), **({"dtype": "int64"} if k in constants else {})} for k, v in inputs.items()},
        "layers": [{**layer, "out": out}],
        "loss": {"op": "half_sq_error", "target": y},
        "wrt": list(linear),
    }
    shapes_only = build_graph(
        parse_spec(
            yaml.safe_dump(
                {
                    **draft,
                    "inputs": {**draft["inputs"], y: {"shape": [1]}},
                    "loss": {"op": "half_sq_error", "in": out, "target": out},
                },
                sort_keys=False,
            ),
            "certify.yaml",
        )
    )
    out_shape = shapes_only.nodes[out].shape
    draft["inputs"][y] = {"shape": list(out_shape)}
    built = build_text(yaml.safe_dump(draft, sort_keys=False), "certify.yaml", documents=False)
    module = module_from_source(built.rendered.files["certified.py"], "certified")
    graph = built.graph
    outputs = 1
    for size in out_shape:
        outputs *= size
    checked = 0

    def forward(values: dict) -> torch.Tensor:
        return reference_values(graph, {**values, y: torch.zeros(out_shape, dtype=torch.float64)})[out]

    zeros = {name: constants.get(name, torch.zeros(shape, dtype=torch.float64)) for name, shape in inputs.items()}
    for operand in linear:
        others = [name for name in linear if name != operand]
        if others and forward({**zeros, others[0]: torch.ones(inputs[others[0]], dtype=torch.float64)}).any():
            # not bilinear (a bilinear op is 0 where one operand is): linear in all of them together, as
            # `cat` or `add` is, so the operand's operator is the op with the others at 0
            others = []
        other_bases = [None] if not others else range(_numel(inputs[others[0]]))
        for j in other_bases:
            base = {
                name: constants.get(name, torch.zeros(shape, dtype=torch.float64)) for name, shape in inputs.items()
            }
            if others:
                flat = base[others[0]].flatten()
                flat[j] = 1
                base[others[0]] = flat.reshape(inputs[others[0]])
            columns = []
            for i in range(_numel(inputs[operand])):  # A: PyTorch's forward on each basis vector
                probe = dict(base)
                flat = torch.zeros(_numel(inputs[operand]), dtype=torch.float64)
                flat[i] = 1
                probe[operand] = flat.reshape(inputs[operand])
                columns.append(_rational(forward(probe).flatten().tolist(), label))
            A = sympy.Matrix(columns).T  # outputs x inputs
            adjoint_columns = []
            for m in range(outputs):  # B: the emitted adjoint on each basis cotangent (y = -e_m at operand 0)
                cotangent = torch.zeros(outputs, dtype=torch.float64)
                cotangent[m] = 1
                result = module.gradients(**base, **{y: -cotangent.reshape(out_shape)})
                adjoint_columns.append(_rational(getattr(result, operand).flatten().tolist(), label))
            B = sympy.Matrix(adjoint_columns).T  # inputs x outputs
            residual = B - A.T
            if residual != sympy.zeros(*residual.shape):
                raise AssertionError(f"{label}: the emitted adjoint of {operand} is not the transpose of the forward")
            checked += B.rows * B.cols
    return checked


def _numel(shape) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


# --------------------------------------------------------------------------------------------
# The linear rules of one spec, at that spec's own arguments
# --------------------------------------------------------------------------------------------

MAX_PROBES = 200_000
"""Module calls one layer's certificate may take; a larger instance is reported, never skipped silently."""


@dataclass(frozen=True)
class LayerCertificate:
    """One linear layer of a spec: certified (``entries`` > 0), failed or too large (``problem``)."""

    label: str
    entries: int = 0
    problem: str = ""
    too_large: bool = False


def spec_certificate_cases(graph) -> list[tuple[str, dict, dict, tuple[str, ...]]]:
    """For every layer of ``graph`` whose rule is linear in some operand: the layer alone, with its
    spec arguments unchanged, at the smallest input shapes the shape solver finds consistent with
    them (batch, spatial and channel sizes shrink; stride, padding, dilation, groups, modes stay)."""
    from .graph import build_graph
    from .shapes import small_shapes
    from .spec import parse_spec

    cases, seen = [], {}
    for layer in graph.spec.layers:
        node = graph.nodes[layer.out]
        linear_operands = [
            operand
            for operand in node.operands
            if any(operand == name or operand.startswith(f"{name}_") for name in node.rule.linear_in)
        ]
        if not linear_operands:
            continue
        # a size read off another node (`size: {like: skip}`) makes that node an input of the case too
        sources = list(
            dict.fromkeys(
                [
                    *node.operands.values(),
                    *(name for argument in layer.arguments for name in _like_nodes(argument.value)),
                ]
            )
        )
        inputs = {name: list(graph.nodes[name].shape) for name in sources}
        entry = {
            "op": layer.op,
            "in": [name for name, _ in layer.sources],
            **{argument.name: _plain(argument.value) for argument in layer.arguments},
            "out": "out",
        }
        linear = tuple(dict.fromkeys(node.operands[operand] for operand in linear_operands))
        draft = {
            "name": "certified",
            "inputs": {name: {"shape": shape} for name, shape in inputs.items()},
            "layers": [entry],
            "loss": {"op": "half_sq_error", "in": "out", "target": "out"},
            "wrt": list(linear),
        }
        single = build_graph(parse_spec(yaml.safe_dump(draft, sort_keys=False), graph.spec.file))
        small = small_shapes(single)[0]
        arguments = ", ".join(
            f"{argument.name}={argument.value}"
            if _like_nodes(argument.value)
            else f"{argument.name}={_plain(argument.value)}"
            for argument in layer.arguments
            if not (isinstance(argument.value, str) and argument.value in inputs)
        )
        label = f"{layer.out} = {layer.op}({', '.join(sources)}{', ' if arguments else ''}{arguments}) at {small}"
        entry = {key: value for key, value in entry.items() if key != "out"}
        # a layer a block repeats (or any layer written twice alike) is one proof: the same op, arguments
        # and small shapes, whatever its tensors are called
        renamed = {name: f"t{index}" for index, name in enumerate(sources)}
        same = repr(
            (
                {
                    key: [renamed.get(item, item) for item in value]
                    if isinstance(value, list)
                    else renamed.get(value, value)
                    if isinstance(value, str)
                    else value
                    for key, value in entry.items()
                },
                [tuple(small[name]) for name in sources],
                [renamed[name] for name in linear],
            )
        )
        if same in seen:
            seen[same][1] += 1
            continue
        seen[same] = [len(cases), 0]
        cases.append((label, {name: tuple(small[name]) for name in sources}, entry, linear))
    for index, repeats in seen.values():
        if repeats:
            label, *rest = cases[index]
            cases[index] = (f"{label} (and {repeats} more layer{'s' if repeats > 1 else ''} alike)", *rest)
    return cases


def _like_nodes(value) -> list[str]:
    """The nodes a spec value reads its sizes off (``{like: skip}``, in a list or alone)."""
    from .spec_values import Like

    if isinstance(value, Like):
        return [value.node]
    if isinstance(value, (list, tuple)):
        return [name for item in value for name in _like_nodes(item)]
    return []


def _plain(value):
    """A spec value as plain lists, dicts and scalars (the parser's located containers do not dump;
    ``{like: NODE}`` is written back as the spec writes it)."""
    from .spec_values import Like

    if isinstance(value, Like):
        return {"like": value.node, **({"dims": list(value.dims)} if value.dims is not None else {})}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    return value


def certify_spec(graph) -> list[LayerCertificate]:
    results = []
    for label, inputs, layer, linear in spec_certificate_cases(graph):
        probes = sum(
            max((_numel(inputs[other]) for other in linear if other != operand), default=1)
            * (_numel(inputs[operand]) + 1)
            for operand in linear
        )
        if probes > MAX_PROBES:
            results.append(
                LayerCertificate(label, problem=f"{probes} probes, over the {MAX_PROBES} limit", too_large=True)
            )
            continue
        try:
            results.append(LayerCertificate(label, entries=certify_linear(label, inputs, layer, linear)))
        except AssertionError as error:
            results.append(LayerCertificate(label, problem=str(error)))
        except SymgradError as error:  # the layer alone at small shapes is no spec symgrad builds
            results.append(
                LayerCertificate(label, problem=f"{label}: not certified, its single-layer case is refused: {error}")
            )
    return results
