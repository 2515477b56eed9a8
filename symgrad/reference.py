"""The reference the checks compare with: every node's value computed op by op by PyTorch's own
functions (never the printers), and a call made from torch's seed 0 so that random masks are the same
draws in every forward compared. ``symgrad.check`` verifies generated modules with it, and
``symgrad.roles`` computes the generated test's reference sums with it.
"""

from __future__ import annotations

import warnings

import torch

from .graph import Graph, sized


def reference_forward(graph: Graph, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The spec's loss, computed op by op by PyTorch's own functions."""
    return reference_values(graph, inputs)["loss"]


def reference_values(graph: Graph, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every node's value, computed op by op by PyTorch's own functions (never the printers)."""
    values = dict(inputs)
    for node in graph.nodes.values():
        if node.kind == "input":
            continue
        arguments = {operand: values[source] for operand, source in node.operands.items()}
        arguments.update(
            {
                operand.name: None
                for operand in node.rule.operands  # absent optional tensors
                if operand.optional and operand.name not in arguments
            }
        )
        arguments.update({name: float(value) for name, value in node.constants.items()})
        at_run_time = sized(node.params, lambda name: values[name].shape)  # skip.shape[2] read off skip's value
        params = {
            key: float(value) if hasattr(value, "is_number") else value
            for key, value in node.rule.reference_params(at_run_time).items()
            if value is not None
        }  # unset options (divisor_override) stay implicit
        if node.kind == "loss" and node.rule.op == "outputs":  # a spec ending in outputs: checked as a loss
            from .outputs import weighted_sum

            values[node.name] = weighted_sum([values[source] for source in node.operands.values()])
            continue
        if node.kind == "loss":
            reduction = params.pop("reduction")
            per_element = node.rule.reference(arguments, params)
            if reduction == "per_sample":
                values[node.name] = per_element.flatten(1).sum(1) if per_element.dim() > 1 else per_element
            else:
                values[node.name] = getattr(per_element, reduction)()
            continue
        with warnings.catch_warnings():  # PyTorch's note that asymmetric 'same' copies the input: known, and fine
            warnings.filterwarnings("ignore", message="Using padding='same'")
            values[node.name] = node.rule.reference(arguments, params)
    return values


def seeded(function, *arguments, **keywords):
    """``function(...)`` from torch's seed 0 (the global random state put back after), so that the
    random masks of a spec with dropout are the same draws in every forward compared."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return function(*arguments, **keywords)
