"""What the bound step would gain with its backward body run by TorchScript's interpreter: a measurement.

The around-the-kernels gap (``python -m benchmarks.step_pieces``) is the generated backward's per-call
Python: it makes the same kernel calls as autograd's engine, from Python. This command binds each network
of :data:`benchmarks.training.QUICK_ROWS` twice, and in the second binding's module replaces
``_backward_from_saved`` by :func:`captured`: at the first backward of a set of shapes, strides and dtypes
the body is recorded as the aten calls it makes (``torch.fx``'s ``make_fx``) and that graph compiled by
``torch.jit.script``; every later backward of the same set runs the compiled graph. Then it times the plain
bound step, the captured one and autograd's, alternating, in runs of :data:`RUN` steps (the first of each
left out), and checks first that one step of each bound binding gives bit-identical gradients.

This is **not a feature of symgrad**: ``torch.jit.script`` is deprecated (PyTorch says "switch to
torch.compile or torch.export"), and a captured body is right only where nothing the body decides in
Python (sizes, layouts, autocast, grad mode) changes within a key, which :func:`captured` keys on and
falls back from, but which the generated code does not promise. It measures how much of the gap an
interpreter in C++ closes, for deciding what to build.

Writes a Markdown table (``--output``: that file's section of this name) and the medians as JSON
(``--json``); ``--rows FILE`` renders a saved run again.
"""

from __future__ import annotations

import copy
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from .training import quick_rows_command, step_variants

SECTION = "## Around the kernels: the backward body in TorchScript's interpreter (a measurement)"
RUN = 6
"""Steps in a row per variant and round; the first of each run is left out (it follows another variant's)."""
CAPTURED = "symgrad.bind, backward in TorchScript"


def captured(body, gradients_type):
    """``body`` (a generated ``_backward_from_saved``), run as a TorchScript graph of its aten calls per
    key: the layouts (sizes, strides, dtype, device) of the inputs, the parameters and the cotangent, from
    which the forward that made ``saved`` made every kept value and size; the body itself where grad mode
    or autocast is on (a create_graph backward, AMP). ``replay.graphs``: the graphs made;
    ``replay.replays``: the backwards a graph ran."""
    graphs = {}

    def replay(*arguments):
        *inputs, params, saved, grad_loss = arguments
        if grad_loss is None or torch.is_grad_enabled() or torch.is_autocast_enabled(grad_loss.device.type):
            return body(*arguments)
        tensors = [*inputs, *params.values(), grad_loss]
        key = tuple(params), tuple((value.shape, value.stride(), value.dtype, value.device) for value in tensors)
        if key not in graphs:
            at = [
                index
                for index, value in enumerate(saved)
                if isinstance(value, torch.Tensor) and value.device.type != "meta"
            ]
            graphs[key] = (
                *_compiled(
                    body,
                    len(inputs),
                    list(params),
                    list(saved),
                    at,
                    [*tensors[:-1], *(saved[index] for index in at), grad_loss],
                ),
                at,
            )
        graph, keys, at = graphs[key]
        kept = [saved[index] for index in at]
        saved.clear()
        replay.replays += 1
        return gradients_type(params=dict(zip(keys, graph(*tensors[:-1], *kept, grad_loss))))

    replay.graphs, replay.replays = graphs, 0
    return replay


def _compiled(body, inputs: int, keys: list, kept: list, at: list, tensors: list):
    """The TorchScript graph of ``body``'s aten calls on ``tensors`` (the arguments, flat), and the
    parameter keys of its outputs, in order."""
    from torch.fx.experimental.proxy_tensor import make_fx

    names = []

    def flat(*values):
        params = dict(zip(keys, values[inputs : inputs + len(keys)]))
        saved = list(kept)
        for index, value in zip(at, values[inputs + len(keys) : -1]):
            saved[index] = value
        grads = body(*values[:inputs], params, saved, values[-1]).params
        names[:] = list(grads)
        return tuple(grads.values())

    graph = make_fx(flat)(*tensors)
    for node in graph.graph.nodes:  # TorchScript resolves an op's overload itself, from its arguments
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            node.target = node.target.overloadpacket
    graph.recompile()
    return torch.jit.script(graph), list(names)


def _module_copy(module):
    """The generated ``module`` imported again from its file, under a name of its own."""
    spec = importlib.util.spec_from_file_location(f"{module.__name__}_captured", module.__file__)
    copied = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copied)
    return copied


def _steps(network: str, batch: int, size: int, width: int, layout: str, folder: Path) -> list:
    """(name, step, samples, bound) of the plain bound step, the captured one and autograd's, in ``layout``;
    ``step()`` runs zero_grad, the forward and the backward, and appends its duration to ``samples``."""
    import symgrad

    suffix = ", channels_last" if layout == "channels_last" else ""
    variants = step_variants(network, batch, size, width, folder, ("symgrad.bind" + suffix, "autograd" + suffix))
    plain, autograd = variants["symgrad.bind" + suffix], variants["autograd" + suffix]
    module = _module_copy(plain.bound.generated)
    module._backward_from_saved = captured(module._backward_from_saved, module.Gradients)
    model = copy.deepcopy(plain.bound.model)
    bound = symgrad.bind(module, model)
    captured_optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    made = []
    for name, compute, optimizer, bound_of in [
        ("symgrad.bind", plain.compute, plain.optimizer, plain.bound),
        (CAPTURED, lambda: bound(**plain.arguments), captured_optimizer, bound),
        ("autograd", autograd.compute, autograd.optimizer, None),
    ]:
        samples = []

        def step(compute=compute, optimizer=optimizer, samples=samples):
            optimizer.zero_grad(set_to_none=True)
            start = time.perf_counter()
            compute().backward()
            samples.append(time.perf_counter() - start)

        made.append((name, step, samples, bound_of))
    return made


def _gradients(bound) -> list:
    return [parameter.grad.clone() for parameter in bound.model.parameters()]


def measure(network: str, batch: int, size: int, width: int, layout: str, rounds: int) -> dict:
    """The medians (seconds) of the three steps, and whether the two bound ones agreed bit for bit."""
    with tempfile.TemporaryDirectory() as folder:
        steps = _steps(network, batch, size, width, layout, Path(folder))
        (_, plain_step, _, plain), (_, captured_step, _, bound), _ = steps
        plain_step(), captured_step()  # from the same weights, buffers and data
        identical = all(
            torch.equal(a, b) and a.stride() == b.stride() for a, b in zip(_gradients(plain), _gradients(bound))
        )
        for _, step, samples, _ in steps:  # warm-up (the capture included), then forget it
            for _ in range(3):
                step()
            samples.clear()
        for index in range(rounds):
            for _, step, samples, _ in steps if index % 2 else steps[::-1]:
                mark = len(samples)
                for _ in range(RUN):
                    step()
                del samples[mark]
        graphs = len(bound.generated._backward_from_saved.graphs)
    medians = {name: statistics.median(samples) for name, _, samples, _ in steps}
    return {
        "network": network,
        "batch": batch,
        "size": size,
        "width": width,
        "layout": layout,
        "identical": identical,
        "graphs": graphs,
        "medians": medians,
    }


def render(saved: dict) -> str:
    lines = [
        SECTION,
        "",
        f"Machine: {saved['machine']}. Run on {saved['date']}; `python -m benchmarks.captured_backward` "
        f"({saved['rounds']} rounds of {RUN} steps per variant, the first of each run left out; a step is "
        "zero_grad, the forward and `.backward()`; medians, one process). Not a feature: the module's docstring "
        "says why (`torch.jit.script` is deprecated).",
        "",
        "| network | layout | variant | median ms | speed vs autograd | gradients as the plain bound step's |",
        "|---|---|---|---:|---:|---|",
    ]
    for row in saved["rows"]:
        head = f"| {row['network']} of width {row['width']} at {row['batch']} × {row['size']}² | {row['layout']} |"
        autograd = row["medians"]["autograd"]
        for name, median in row["medians"].items():
            same = ("bit for bit" if row["identical"] else "**differ**") if name == CAPTURED else ""
            lines.append(f"{head} {name} | {median * 1e3:.2f} | {autograd / median:.2f}× | {same} |")
    saving = [1 - row["medians"][CAPTURED] / row["medians"]["symgrad.bind"] for row in saved["rows"]]
    plain = [row["medians"]["autograd"] / row["medians"]["symgrad.bind"] for row in saved["rows"]]
    ahead = [row["medians"]["autograd"] / row["medians"][CAPTURED] for row in saved["rows"]]
    lines += [
        "",
        f"The same kernel calls run from TorchScript's interpreter took {min(saving):.0%}–{max(saving):.0%} "
        f"off the bound step (its speed against autograd's {min(plain):.2f}–{max(plain):.2f}× plain, "
        f"{min(ahead):.2f}–{max(ahead):.2f}× captured), so running the backward body outside Python closes "
        "that much of the around-the-kernels gap (one run: rows move by several per cent between runs on "
        "this machine; `python -m benchmarks.step_pieces` times the pieces around the body).",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    return quick_rows_command(
        argv,
        __doc__,
        "captured-backward",
        SECTION,
        measure,
        render,
        lambda result: "  ".join(f"{name} {median * 1e3:.2f} ms" for name, median in result["medians"].items()),
    )


if __name__ == "__main__":
    sys.exit(main())
