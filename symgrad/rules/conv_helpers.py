"""The helper source that the convolution rules emit into a generated module (as ``norm_helpers.py``
holds the normalisations'): one ``def`` per helper, as a string."""

CONVOLUTION_BACKWARD = '''def _convolution_backward(grad_output, input, weight, output_mask, stride=1, padding=0, dilation=1,
                          transposed=False, output_padding=0, groups=1, bias_sizes=None,
                          weight_dtype=None, defer_weight_cast=False):
    """Autograd's ``convolution_backward`` as autograd runs it under autocast: each gradient in
    its tensor's dtype (``input`` or its ``(copy, dtype)``; ``weight_dtype``: a weight copy's), the
    weight's left in autocast's where ``defer_weight_cast`` (the caller casts it; not compiling)."""
    input, input_dtype = input if isinstance(input, tuple) else (input, input.dtype)
    weight_dtype = weight.dtype if weight_dtype is None else weight_dtype
    dims = weight.dim() - 2
    stride, padding, dilation, output_padding = [
        [value] * dims if isinstance(value, int) else list(value)
        for value in (stride, padding, dilation, output_padding)]
    others = bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask
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
                 in enumerate(zip(grads, (input_dtype, weight_dtype, weight_dtype))))
'''
"""Emitted once into each module that calls it (``Primitive.helper``)."""
