"""Test inputs and the error measure: one definition, shared verbatim by ``symgrad verify``,
``symgrad generate --verify`` and every generated ``test_<name>.py`` (``symgrad generate`` writes this
file's text after its imports into ``_symgrad_testdata.py`` beside the tests, which import it by path),
so their verdicts can never disagree. The checks every test file makes alike live here too, taking
the file's own pieces as arguments (its ``WRT``, its ``explicit_backward``, its inputs): the rounding
bound of a comparison (:func:`assert_matches`), and the finite-difference checks with their exact
fallbacks (:func:`gradcheck_or_exact`, :func:`gradgradcheck_or_exact`).

This file imports only ``math`` and ``torch`` (``os`` and ``importlib`` inside the functions that
need them): it must run inside a generated test, with no symgrad (and no pytest).

Inputs make sense for what each tensor is. Its *role* is read off the op that consumes it when the
spec is generated (``symgrad.roles``):

* ``weight``: normal, with standard deviation ``gain / sqrt(fan_in)`` as ``nn.init.kaiming_normal_``
  draws it, ``fan_in`` the product of the listed axes of the actual shape (``C_in/groups x kernel``),
  ``gain`` sqrt(2) before a ReLU-like activation, else 1. Activations then keep their scale through
  any depth, so neither float32 nor gradcheck meets values of 1e18;
* ``variance`` (a running variance): uniform in [0.5, 1.5], positive;
* ``scale`` (a normalisation's weight): 1 + N(0, 0.1);
* ``shift`` (a bias, a running mean, a normalisation's bias): N(0, 0.1);
* ``classes``: class indices below the scored input's class count (int64);
* anything else: N(0, 1).

The error of a gradient is measured in float64, in a norm (``max``: the largest entry; ``2``: the
Euclidean norm), as ``||actual - expected|| / max(||expected||, typical)``, where ``typical`` is the
root-mean-square of all the spec's gradients' norms. Relative to itself for an ordinary gradient;
relative to the others for a gradient that is zero by structure (a bias right before training-mode
batch_norm), whose own norm is rounding noise. NaN or Inf anywhere (forward, reference, result) is
a failure of its own, reported by :func:`first_nonfinite`, never a number that happens to compare
well.
"""

import math

import torch


def make_inputs(shapes, roles, wrt, dtype, seed, classes=None):
    """Random inputs of ``shapes`` ({name: shape}) drawn by role ({name: [role, gain,
    fan_in_axes]})."""
    generator = torch.Generator().manual_seed(seed)
    classes = classes or {}
    inputs = {}
    for name, shape in shapes.items():
        role, gain, fan_in_axes = roles.get(name, ["data", 1.0, []])
        if name in classes:
            inputs[name] = torch.randint(0, classes[name], tuple(shape), generator=generator)
            continue
        value = torch.randn(tuple(shape), dtype=dtype, generator=generator)
        if role == "weight":
            fan_in = math.prod(shape[axis] for axis in fan_in_axes) or 1
            value = value * (gain / math.sqrt(fan_in))
        elif role == "variance":
            value = 0.5 + torch.rand(tuple(shape), dtype=dtype, generator=generator)
        elif role == "scale":
            value = 1 + 0.1 * value
        elif role == "shift":
            value = 0.1 * value
        inputs[name] = value.requires_grad_(name in wrt)
    return inputs


def first_nonfinite(named):
    """A message naming the first tensor ({description: tensor}) that holds NaN or Inf, else
    None."""
    for description, tensor in named.items():
        if tensor is None:
            continue
        tensor = tensor.detach()
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            kind = "NaN" if bool(torch.isnan(tensor).any()) else "Inf"
            return f"{description} holds {kind}"
    return None


def relative_errors(actual, expected, norm="max"):
    """{name: error} for gradients ({name: tensor}), as the module docstring defines it."""
    def measure(tensor):
        if tensor.numel() == 0:
            return 0.0
        if norm == "max":
            return float(tensor.abs().max())
        return float(torch.linalg.vector_norm(tensor))

    expected = {name: value.detach().double() for name, value in expected.items()}
    own = {name: measure(value) for name, value in expected.items()}
    typical = math.sqrt(sum(value * value for value in own.values()) / max(1, len(own)))
    errors = {}
    for name, reference in expected.items():
        difference = measure(actual[name].detach().double() - reference)
        scale = max(own[name], typical, 1e-300)
        errors[name] = difference / scale if math.isfinite(difference) else math.inf
    return errors


def moved_one_ulp(inputs, seed):
    """Copies of ``inputs`` with every floating entry moved to the next float64 (or float32) up or
    down, the direction drawn per entry from ``seed``: the same problem, rounded differently."""
    generator = torch.Generator().manual_seed(seed)
    moved = {}
    for name, value in inputs.items():
        value = value.detach()
        if value.is_floating_point():
            up = (torch.rand(value.shape, generator=generator) < 0.5).to(value.device)
            toward = torch.where(up, math.inf, -math.inf).to(value.dtype)
            value = torch.nextafter(value, toward)
        else:
            value = value.clone()
        moved[name] = value.requires_grad_(inputs[name].requires_grad)
    return moved


def rounding_tolerances(expected, at_moved_inputs, floor=1e-12, factor=4.0, cap=1e-8):
    """{name: bound} for float64 gradients checked against ``expected`` (autograd's, {name:
    tensor}): ``factor`` times as far as autograd's own gradient moves when the inputs move by one
    unit in the last place (``at_moved_inputs``: its gradients at :func:`moved_one_ulp` copies; the
    largest move counts), or ``floor``, whichever is larger. A well-conditioned gradient moves by
    about 1e-16 and keeps the floor. One whose value is rounding noise amplified (GroupNorm over one
    value per group, on a 1x1 map: autograd's gradient there is noise times 1/sqrt(eps), and it
    reaches every parameter upstream) moves by as much as the explicit form differs from it, and
    gets a bound autograd itself would meet; a wrong formula is off by far more than either. The
    bound never exceeds ``cap``, and a spread that is not finite (autograd's gradient at a moved
    input is NaN or Inf) is a failure, not a bound that anything meets."""
    spread = {name: 0.0 for name in expected}
    for gradients in at_moved_inputs:
        for name, error in relative_errors(gradients, expected).items():
            if not math.isfinite(error):  # raised, not asserted: `python -O` keeps this check
                raise AssertionError(f"autograd's gradient of {name} is not finite "
                                     "when the inputs move by one ulp")
            spread[name] = max(spread[name], error)
    return {name: min(cap, max(floor, factor * error)) for name, error in spread.items()}


def value_sums(results):
    """A forward's values in a few numbers, for each result tensor (float64): the sum of its
    magnitudes, its sum divided by that, and the same two for its entries weighted by a fixed draw.
    Any change of the values moves them: a shift of every entry the plain ratio, others the weighted
    one. The ratios lie in [-1, 1], so their digits are not lost to cancellation."""
    sums = []
    for index, result in enumerate(results):
        value = result.detach().double()
        generator = torch.Generator().manual_seed(50 + index)
        weights = torch.randn(value.shape, dtype=torch.float64, generator=generator)
        row = []
        for weighted in (value, weights.to(value.device) * value):
            magnitude = float(weighted.abs().sum())
            row += [magnitude, float(weighted.sum()) / max(magnitude, 1e-300)]
        sums.append(row)
    return sums


def sums_differ(actual, expected, at_moved, floor=1e-9, factor=4.0):
    """Where :func:`value_sums` ``actual`` differ from ``expected`` (None for a result not
    recorded) by more than ``floor`` (relative for a magnitude) or ``factor`` times as far as they
    move when the inputs move by one ulp (``at_moved``: the sums of one forward at the inputs, then
    at :func:`moved_one_ulp` copies), a message saying which; else None."""
    if len(actual) != len(expected):
        return f"{len(actual)} results, not {len(expected)}"
    names = ("sum of magnitudes", "sum ratio", "weighted sum of magnitudes", "weighted sum ratio")
    for index, (ours, theirs) in enumerate(zip(actual, expected)):
        for position, name in enumerate(names if theirs is not None else ()):
            first = at_moved[0][index][position]
            spread = max(abs(moved[index][position] - first) for moved in at_moved[1:])
            scale = abs(theirs[position]) if position % 2 == 0 else 1.0
            if not abs(ours[position] - theirs[position]) <= max(floor * scale, factor * spread):
                return f"result {index}: {name} {ours[position]!r}, expected {theirs[position]!r}"
    return None


def checked_subset(wrt, most=3):
    """The inputs gradcheck and gradgradcheck perturb: first, middle and last of ``wrt``, so their
    cost stays bounded however deep the spec is (the others are held fixed)."""
    picks = sorted({0, len(wrt) // 2, len(wrt) - 1})[:most]
    return [wrt[index] for index in picks]


def in_layout(inputs, channels_last):
    """``inputs`` with the tensors named in ``channels_last`` moved to that memory layout (leaves
    again where they were leaves): the layout the generated gradients run their convolutions in, so
    that autograd's float32 error is measured on the same kernels as theirs. The kernels of the two
    layouts round differently; through a ReLU that can flip a pre-activation within rounding of
    zero, which changes a deep net's float32 gradient in either layout, so like is compared with
    like."""
    moved = dict(inputs)
    for name, value in inputs.items():
        if name in channels_last:
            moved[name] = value.detach().contiguous(memory_format=torch.channels_last)
            moved[name].requires_grad_(value.requires_grad)
    return moved


def float32_acceptable(ours, autograd, floor=1e-5, factor=4.0):
    """The float32 verdict on one gradient, both errors measured against float64 (2-norm): the
    explicit form may round at most ``factor`` times as much as autograd does on the same data, or
    ``floor``. Deep nets round more in both; only rounding beyond autograd's own is a failure."""
    return ours <= max(floor, factor * autograd)


def available_memory():
    """Bytes this process can still allocate: MemAvailable on Linux, else the physical memory."""
    import os

    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_shortfall(name, where, entries, bytes_per_entry):
    """Why checking ``name`` at ``where`` cannot run in this memory, or None if it fits: every
    node's value and gradient, twice over (ours and autograd's reference), ``entries`` numbers in
    all (one per entry of every node), at ``bytes_per_entry`` (8 in float64, 4 in float32)."""
    needed = 4 * entries * bytes_per_entry
    free = available_memory()
    if needed <= free:
        return None
    return (f"checking {name} at {where} needs about {needed / 2**30:.1f} GiB, and "
            f"{free / 2**30:.1f} GiB is available")


def seeded_randn(shape, seed):
    """Standard normal float64 numbers of ``shape``, the same on every run."""
    return torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def seeded_positive(shape, seed):
    """Uniform float64 numbers in [0.5, 1.5) of ``shape``, the same on every run."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(shape, dtype=torch.float64, generator=generator) + 0.5


def seeded(function, *arguments, **keywords):
    """``function(...)`` run from torch's seed 0, the global random state left as it was: each
    forward of a test runs from one seed, so random masks (dropout, drop path) are the same
    draws."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return function(*arguments, **keywords)


def assert_matches(actual, expected, tolerance, wrt):
    """``actual`` against ``expected`` (both by the names in ``wrt``), in float64; ``tolerance``:
    one bound, or one for each name."""
    problem = first_nonfinite({**{f"autograd's gradient of {n}": v for n, v in expected.items()},
                               **{f"the explicit gradient of {n}": v for n, v in actual.items()}})
    assert problem is None, problem
    for name in wrt:
        assert actual[name].shape == expected[name].shape, name
    errors = relative_errors(actual, expected)
    bounds = tolerance if isinstance(tolerance, dict) else dict.fromkeys(wrt, tolerance)
    wrong = {name: error for name, error in errors.items() if not error <= bounds[name]}
    loosened = sum(bound > 1e-12 for bound in bounds.values())
    these = {name: f"{bounds[name]:.2g}" for name in wrong if bounds[name] > 1e-12}
    why = (f"; {loosened} of {len(bounds)} bounds loosened to autograd's own rounding spread, of"
           f" these: {these}") if loosened else ""
    assert not wrong, f"gradients differ from autograd (relative errors): {wrong}{why}"


def finite_difference_mismatch(check, explicit_backward, inputs, wrt):
    """``check`` (gradcheck or gradgradcheck, fast mode) of ``explicit_backward`` as a function of
    the :func:`checked_subset` of ``wrt`` (the other ``inputs`` held fixed): None where it passes,
    else its message."""
    import importlib

    checked = checked_subset(wrt)
    fixed = {name: value.detach() for name, value in inputs.items() if name not in checked}

    def through_explicit_backward(*checked_values):
        return explicit_backward({**fixed, **dict(zip(checked, checked_values))})

    try:
        check(through_explicit_backward, [inputs[name] for name in checked], fast_mode=True)
    except importlib.import_module("torch.autograd.gradcheck").GradcheckError as error:
        return str(error).strip()
    return None


# Where finite differences disagree with the explicit derivatives, the same derivatives are compared
# with autograd's at the same point, in float64. Equal there, the finite differences disagree with
# autograd's derivatives of the same forward alike (see the forward test): the point is at fault (a
# ReLU's or a max's kink within gradcheck's step, rounding amplified by a normalisation over few
# values), not the code.
FINITE_DIFFERENCES_FAIL = "finite differences disagree here; "


def gradcheck_or_exact(draw, explicit_backward, autograd_gradients, cotangent_for, wrt):
    """Finite differences of the forward against the explicit backward's gradients at ``draw()``'s
    inputs; where they disagree, those gradients against autograd's (``autograd_gradients(inputs,
    cotangent)``) at the same point, in float64, within :func:`rounding_tolerances` (see
    FINITE_DIFFERENCES_FAIL). Raises AssertionError where the code is wrong."""
    problem = finite_difference_mismatch(torch.autograd.gradcheck, explicit_backward, draw(), wrt)
    if problem is None:
        return
    inputs = draw()
    moved = [moved_one_ulp(inputs, seed) for seed in (1, 2)]  # before a forward moves any input
    result = explicit_backward(inputs)
    cotangent = cotangent_for(result, 2)
    values = torch.autograd.grad(result, [inputs[name] for name in wrt], grad_outputs=cotangent)
    expected = autograd_gradients(inputs, cotangent)
    at_moved = [autograd_gradients(each, cotangent) for each in moved]
    bounds = rounding_tolerances(expected, at_moved)
    try:
        assert_matches(dict(zip(wrt, values)), expected, bounds, wrt)
    except AssertionError as error:
        message = f"{problem}\n{FINITE_DIFFERENCES_FAIL}the explicit backward's {error}"
        raise AssertionError(message) from None


def second_derivatives(forward, inputs, cotangent, wrt):
    """The derivative of (fixed weights) . (the gradients of the checked inputs of ``wrt``,
    ``cotangent`` times the Jacobian of ``forward``): a Hessian-vector product, by autograd's
    backward through the gradients' own computation (the explicit backward's code, or autograd's
    first backward)."""
    checked = checked_subset(wrt)
    result = forward(inputs)
    first = torch.autograd.grad(result, [inputs[name] for name in checked],
                                grad_outputs=cotangent, create_graph=True)
    weighted = sum((seeded_randn(value.shape, 30 + index) * value).sum()
                   for index, value in enumerate(first))
    second = torch.autograd.grad(weighted, [inputs[name] for name in checked], allow_unused=True)
    return {name: torch.zeros_like(inputs[name]) if value is None else value
            for name, value in zip(checked, second)}


# gradgradcheck's finite differences cost about 15 passes forward and back through the explicit
# backward, and in a deep network with ReLUs one of them likely crosses a kink: past this many
# differentiated inputs the second derivatives are compared with autograd's exactly, by finite
# differences only where autograd's cannot be computed
FINITE_DIFFERENCES_UP_TO = 12


def gradgradcheck_or_exact(draw, explicit_backward, run_forward, cotangent_for, wrt):
    """The explicit gradients are themselves differentiable: finite differences of them (so an op
    whose autograd has no second derivative is still checked) for at most FINITE_DIFFERENCES_UP_TO
    differentiated inputs; past it, or where those disagree, their derivatives against autograd's
    second derivatives of ``run_forward`` at the same point, in float64, within
    :func:`rounding_tolerances`. Raises AssertionError where the code is wrong."""
    def finite_differences():
        check = torch.autograd.gradgradcheck
        return finite_difference_mismatch(check, explicit_backward, draw(), wrt)

    problem = None
    if len(wrt) <= FINITE_DIFFERENCES_UP_TO:
        problem = finite_differences()
        if problem is None:
            return
    inputs = draw()
    moved = [moved_one_ulp(inputs, seed) for seed in (1, 2)]  # before a forward moves any input
    cotangent = cotangent_for(run_forward(inputs), 2)
    try:
        expected = second_derivatives(run_forward, inputs, cotangent, wrt)
        at_moved = [second_derivatives(run_forward, each, cotangent, wrt) for each in moved]
    except RuntimeError as error:  # an op without a double backward in autograd
        if problem is None:
            problem = finite_differences()
            if problem is None:
                return
        why = f"autograd's second derivatives cannot be compared: {error}"
        raise AssertionError(f"{problem}\n({why})") from None
    actual = second_derivatives(explicit_backward, inputs, cotangent, wrt)
    errors = relative_errors(actual, expected)
    bounds = rounding_tolerances(expected, at_moved)
    wrong = {name: error for name, error in errors.items() if not error <= bounds[name]}
    why = f"{problem}\n{FINITE_DIFFERENCES_FAIL}" if problem else ""
    assert not wrong, (f"{why}the explicit second derivatives differ from autograd's (relative "
                       f"errors): {wrong}")
