"""The helper source that the convolution rules emit into a generated module (as ``norm_helpers.py``
holds the normalisations'): one declaration per helper (:mod:`symgrad.rules.variant_helpers`)."""

from .variant_helpers import HelperDeclaration

CONVOLUTION_BACKWARD = HelperDeclaration(
    '''def _convolution_backward(grad_output, input, weight, output_mask, stride=1, padding=0, dilation=1,
{% if general %}
                          transposed=False, output_padding=0, groups=1, bias_sizes=None,
{% endif %}
{% if unowned %}
                          weight_dtype=None, defer_weight_cast=False):
{% else %}
                          *, weight_dtype, defer_weight_cast=False):
{% endif %}
{% if copies %}
    """Autograd's ``convolution_backward`` as autograd runs it under autocast: each gradient in
    its tensor's dtype (``input`` or its ``(copy, dtype)``; ``weight_dtype``: a weight copy's), the
    weight's left in autocast's where ``defer_weight_cast`` (the caller casts it; not compiling)."""
    input, input_dtype = input if isinstance(input, tuple) else (input, input.dtype)
{% else %}
    """Autograd's ``convolution_backward`` as autograd runs it under autocast: each gradient in
    its tensor's dtype (``weight_dtype``: a weight copy's), the weight's left in autocast's where
    ``defer_weight_cast`` (the caller casts it; not compiling)."""
{% endif %}
{% if unowned %}
    weight_dtype = weight.dtype if weight_dtype is None else weight_dtype
{% endif %}
    dims = weight.dim() - 2
{% if general %}
    stride, padding, dilation, output_padding = [
        [value] * dims if isinstance(value, int) else list(value)
        for value in (stride, padding, dilation, output_padding)]
    others = bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask
{% else %}
    stride, padding, dilation = [[value] * dims if isinstance(value, int) else list(value)
                                 for value in (stride, padding, dilation)]
    others = None, stride, padding, dilation, False, [0] * dims, 1, output_mask
{% endif %}
    device = grad_output.device.type
    if not torch.is_autocast_enabled(device) or weight.dtype == torch.float64:  # as autocast ran it
        return torch.ops.aten.convolution_backward(grad_output, input, weight, *others)
    dtype = torch.get_autocast_dtype(device)
    grads = torch.ops.aten.convolution_backward(
        *(value if value.dtype == dtype else value.to(dtype)
          for value in (grad_output, input, weight)), *others)
    defer = defer_weight_cast and not torch.compiler.is_compiling()
    return tuple(grad if grad is None or grad.dtype == owner_dtype or (defer and index == 1)
                 else grad.to(owner_dtype) for index, (grad, owner_dtype)
                 in enumerate(zip(grads, ({{ "input_dtype" if copies else "input.dtype" }}, weight_dtype, weight_dtype))))
''',
    parts=("general", "unowned", "copies"),
    callers={
        "conv_backward": lambda expression: _convolution_parts(expression),
        # late_weights.CHUNKED_HELPER passes on groups, bias sizes, a (copy, dtype) and any keyword
        "grouped_weight_backward": lambda expression: frozenset({"general", "unowned", "copies"}),
        # kept_casts.py's ``(x_autocast, x_dtype)``: a kept copy passed as the input
        "copy_and_dtype": lambda expression: frozenset({"copies"}),
    },
    kept_casts=frozenset({"copies"}),
)
"""Emitted once into each module that calls it (``Primitive.helper``): ``general``, the keywords of a
transposed, grouped or biased convolution, where a call passes one; ``unowned``, ``weight_dtype`` optional
(the weight's own dtype), where a call reads the weight itself, not its autocast copy (``kept_casts.py``);
``copies``, an input given as ``(copy, dtype)``, where the module keeps one so (``_saved_as_autocast_casts``)."""


def _convolution_parts(expression) -> frozenset[str]:
    """What one call needs (``conv_primitives._backward_code`` writes it): ``general`` where it passes
    ``transposed``, ``output_padding``, ``groups`` or ``bias_sizes``; ``unowned`` where it passes no
    ``weight_dtype`` (no fourth operand, the weight its copy was made of)."""
    params = expression.params
    general = (
        bool(params.get("transposed"))
        or any(value != 0 for value in params.get("output_padding", ()))
        or params["groups"] != 1
        or bool(params["output_mask"][2])
    )
    return frozenset(["general"] * general + ["unowned"] * (len(expression.operands) < 4))
