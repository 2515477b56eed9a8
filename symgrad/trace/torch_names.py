"""Torch names the tracer knows: each rule's calls with PyTorch's own argument order, and the names of
tensor methods and calls that need more than the table (views, pieces, pass-throughs, bookkeeping).

Computed from the rule registry: a rule's ``calls`` are all it takes to be traced by those names.
"""

from __future__ import annotations

import inspect

import torch
from torch.fx.operator_schemas import get_signature_for_torch_op

from ..rules import LAYER_RULES, LOSS_RULES


def torch_signature(op: str) -> tuple[str, ...]:
    """PyTorch's positional argument names of the op ``torch.nn.functional.<op>`` or ``torch.<op>``:
    the Python function's own signature, else the longest positional form among the op's schemas on
    tensors (``torch.squeeze(input, dim)``; not ``math``'s ``log(a, b)``), as ``torch.fx`` reads them."""
    function = getattr(torch.nn.functional, op, None)
    if function is not None:
        try:
            parameters = inspect.signature(function).parameters.values()
        except (TypeError, ValueError):  # a builtin (F.conv2d is torch.conv2d)
            pass
        else:
            return tuple(
                parameter.name for parameter in parameters if parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
            )
    forms = [
        form
        for candidate in (getattr(torch, op, None), function)
        if candidate is not None
        for form in get_signature_for_torch_op(candidate) or []
        if any("Tensor" in str(parameter.annotation) for parameter in form.parameters.values())
    ]
    positional = [
        tuple(
            parameter.name
            for parameter in form.parameters.values()
            if parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        )
        for form in forms
    ]
    if not positional:
        raise LookupError(f"PyTorch has no signature for {op}: give the rule a `signature`")
    return max(positional, key=len)


def _signatures(rules) -> dict[str, tuple[str, tuple[str, ...]]]:
    table = {}
    for rule in rules:
        positional = (rule.signature or torch_signature(rule.op)) if rule.calls else ()
        for name in rule.calls:
            if name in table:
                raise ValueError(f"rules {table[name][0]} and {rule.op} both claim the torch call {name}")
            table[name] = (rule.op, positional)
    return table


SIGNATURES = _signatures(LAYER_RULES.values())
"""Recorded name -> (spec op, PyTorch's positional argument names), from each rule's ``calls``."""

LOSSES = {name: positional for name, (_, positional) in _signatures(LOSS_RULES.values()).items()}
"""Recorded loss call -> PyTorch's positional argument names."""

BY_FUNCTION = {
    torch.batch_norm: (
        "batch_norm",
        ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps", "cudnn_enabled"),
    )
}
"""``torch.*`` functions whose arguments come in another order than their ``torch.nn.functional`` namesakes'."""

NEUTRAL = {"alpha": 1, "scale": 1, "input_scale": 1}
"""Arguments an op does not take, harmless at these values (``torch.add``'s alpha, ``elu``'s scales)."""

IGNORED = {"inplace", "cudnn_enabled", "_stacklevel"}
"""Arguments that do not change the value (an in-place op is traced as its out-of-place op)."""

TRANSPOSES = {"transpose": ("dim0", "dim1"), "swapaxes": ("axis0", "axis1"), "swapdims": ("dim0", "dim1")}
"""Calls that swap two dims, with PyTorch's names for them: a ``permute`` (so are ``x.mT``, ``x.t()``, ``x.T``).
The in-place ones (``transpose_``) change a tensor's shape after the fact, which the walk, reading shapes
once the code has run, cannot see: they stay refused, as ``squeeze_`` and ``unsqueeze_`` do."""

PIECES = {"chunk", "split", "tensor_split", "unbind"}
"""Calls that cut a tensor into a tuple of pieces: one ``narrow`` per piece (``unbind`` adds a ``squeeze``)."""

PASS_THROUGH = {"contiguous", "clone", "to", "float", "double", "type_as", "requires_grad_"}
"""Calls whose result is their input's value (when the dtype and device do not change)."""

DROPOUT = {"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"}

IN_PLACE_BOOKKEEPING = {"add_", "sub_", "mul_", "fill_", "zero_", "copy_", "__iadd__", "lerp_", "addcmul_"}
"""In-place calls on a buffer (BatchNorm's ``num_batches_tracked += 1``): statistics bookkeeping."""

CONSTANT = (
    "reads a tensor made inside the traced code from numbers alone (torch.full, torch.ones_like, "
    "torch.tensor), which a spec holds only as a number broadcast against a tensor, as a map filled "
    "with one value whose sizes are read from a traced tensor, or as a constant layer of at most 4096 "
    "floating-point values, read with a traced tensor and never written into",
    "write the number (x * 0.5, not x * torch.full_like(x, 0.5) broadcast wider than x), or make it a "
    "buffer (self.register_buffer('name', tensor) in __init__) so that it becomes an input",
)
"""The problem and fix when a constant made inside forward is read where no number can stand for it."""

FIXES = {
    "detach": "a stop-gradient is not expressed, and removing it changes the gradients: where the detached value "
    "does not depend on what is trained (a target from the input), compute it before the forward and pass "
    "it in; a straight-through estimator (z + (q - z).detach()) cannot be traced: train that model "
    "with autograd",
    "multi_head_attention_forward": "write the attention as timm's Attention does, with the same weights: "
    "qkv = nn.Linear(dim, 3 * dim) (in_proj_weight, in_proj_bias), q, k, v from "
    "qkv(x).reshape(B, N, 3, heads, dim // heads).permute(2, 0, 3, 1, 4).unbind(0), "
    "F.scaled_dot_product_attention(q, k, v), then out_proj as an nn.Linear",
    "__getitem__": "index with start:stop ranges, ints, None and ... (x[:, :, 2:10], x[:, 0], x[:, None]), or "
    "with one int64 buffer or argument (x[:, self.index]); write other indexing as narrow, cat and reshape",
}
