"""Specs that end in outputs: the model's own tensors, not a loss (``outputs: [logits, aux]``).

The end of such a graph is one node, :class:`Outputs`, that reads every output. Its value is the
tuple of them, and its pullback is the seed of the reverse walk: output ``i`` receives
``grad_outputs[i]``, the cotangent the caller passes for it (what ``torch.autograd.grad(outputs,
inputs, grad_outputs)`` takes). Where an output also feeds a later layer (a feature map returned and
reused) the walk adds the later layer's gradient to it, as it adds every branch.

The loss stays the user's: ``symgrad.bind`` returns the outputs through one ``autograd.Function``,
and whatever is computed from them afterwards (any loss, a metric) is plain autograd.
"""

from __future__ import annotations

from .algebra import Params, TensorOp, primitive, tensor
from .rules.base import Forward, Operand, Rule

GRAD_OUTPUTS = tensor("grad_outputs")
"""The backward's argument: one cotangent per output, in the spec's order."""


def _tuple_code(operands, params, show):
    return "(" + ", ".join(operands) + ("," if len(operands) == 1 else "") + ")"


primitive("output_cotangent", code=lambda operands, params, show: f"{operands[0]}[{params['index']}]",
          latex=lambda operands, params, show: rf"\overline{{\mathrm{{out}}}}_{{{params['index']}}}")
primitive("outputs", code=_tuple_code,
          latex=lambda operands, params, show: r"\left(" + ", ".join(operands) + r"\right)")


class Outputs(Rule):
    """The end of a spec with ``outputs:``: operands ``output_0``, ``output_1``, ... in order."""

    op = "outputs"
    operands = ()
    params = {}
    summary = "the outputs a spec ends in; the backward takes their cotangents"

    def __init__(self, count: int):
        self.operands = tuple(Operand(f"output_{index}") for index in range(count))

    def infer_shape(self, shapes, params, check):
        return ()

    def forward(self, node):
        return Forward(TensorOp("outputs", Params.of(), *(node.operands[operand.name] for operand in self.operands)))

    def pullback(self, node, grad, wanted):
        return {operand.name: TensorOp("output_cotangent", Params.of(index=index), GRAD_OUTPUTS)
                for index, operand in enumerate(self.operands) if operand.name in wanted}

    def default_cotangent(self, node):
        return GRAD_OUTPUTS


def outputs_node(spec, nodes: dict) -> "object":
    """The graph's end node for ``spec.outputs``, named ``loss`` as every graph's end is."""
    from .graph import Node

    entries = spec.outputs.entries
    return Node("loss", "loss", spec.outputs.location, Outputs(len(entries)),
                operands={f"output_{index}": node for index, (_, node, _) in enumerate(entries)},
                params={"reduction": "none"})
