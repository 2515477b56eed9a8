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


primitive(
    "output_cotangent",
    code=lambda operands, params, show: f"{operands[0]}[{params['index']}]",
    latex=lambda operands, params, show: rf"\overline{{\mathrm{{out}}}}_{{{params['index']}}}",
)
primitive(
    "outputs", code=_tuple_code, latex=lambda operands, params, show: r"\left(" + ", ".join(operands) + r"\right)"
)


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
        return {
            operand.name: TensorOp("output_cotangent", Params.of(index=index), GRAD_OUTPUTS)
            for index, operand in enumerate(self.operands)
            if operand.name in wanted
        }

    def default_cotangent(self, node):
        return GRAD_OUTPUTS


# ----- the checks: an outputs-form module seen as a loss-ending one ------------------------------------


def output_weights(outputs) -> list:
    """Fixed random weights, one tensor per output, of its shape and dtype (float64 draws, the same at
    every call): the checks compare ``sum((w * o).sum())``, a scalar whose gradient is the backward
    from the cotangents ``w``."""
    import torch

    return [
        torch.randn(output.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1000 + index)).to(
            output.dtype
        )
        for index, output in enumerate(outputs)
    ]


def weighted_sum(outputs):
    """``sum((w * o).sum())`` over the outputs, ``w`` their :func:`output_weights`."""
    return sum((weight * output).sum() for weight, output in zip(output_weights(outputs), outputs))


class LossView:
    """A module generated from a spec with ``outputs:`` seen as one that ends in the loss
    :func:`weighted_sum` (what ``symgrad verify`` and ``generate --verify`` check): ``forward``,
    ``gradients(..., grad_loss)`` and ``loss_with_explicit_backward`` of that loss."""

    def __init__(self, module):
        self.module = module

    def __getattr__(self, name):
        return getattr(self.module, name)

    def forward(self, **inputs):
        return weighted_sum(self.module.forward(**inputs))

    def gradients(self, grad_loss=None, **inputs):
        import torch

        with torch.random.fork_rng():  # the outputs' shapes only: the random state stays where it is
            shapes = [output.detach() for output in self.module.forward(**inputs)]
        weights = output_weights(shapes)
        return self.module.gradients(
            **inputs, grad_outputs=[weight if grad_loss is None else weight * grad_loss for weight in weights]
        )

    def loss_with_explicit_backward(self, recompute=False, **inputs):
        return weighted_sum(self.module.outputs_with_explicit_backward(**inputs, recompute=recompute))


def loss_view(module):
    """``module`` itself, or its :class:`LossView` where it was generated from a spec with ``outputs:``."""
    generated = getattr(module, "module", module)  # a module with `params` is checked through check.ByName
    return LossView(module) if hasattr(generated, "OUTPUTS") and not isinstance(module, LossView) else module
