"""The functions the normalisations' fused derivations emit into a generated module (``Primitive.helper``
in :mod:`symgrad.rules.norm`): each calls autograd's own kernel as autograd calls it, in the dtype and
layout autograd gives it."""

from .variant_helpers import HelperDeclaration

BATCH_NORM_BACKWARD = HelperDeclaration(
    '''{% if masked %}
def _batch_norm_backward(grad_output, input, weight, mean, invstd, eps=1e-05,
                         output_mask=(True, True, True)):
{% else %}
def _batch_norm_backward(grad_output, input, weight, mean, invstd, eps=1e-05):
{% endif %}
{% if unweighted %}
    """Training-mode batch_norm's gradients by autograd's own kernel (a missing weight: ones)."""
{% else %}
    """Training-mode batch_norm's gradients by autograd's own kernel."""
{% endif %}
    return torch.ops.aten.native_batch_norm_backward(
        grad_output if grad_output.dtype == input.dtype else grad_output.to(input.dtype), input,
{% if unweighted %}
        input.new_ones(input.shape[1]) if weight is None and torch.is_grad_enabled() else weight,
        None, None, mean, invstd, True, eps, {{ "output_mask" if masked else "(True, True, True)" }})
{% else %}
        weight, None, None, mean, invstd, True, eps, {{ "output_mask" if masked else "(True, True, True)" }})
{% endif %}
''',
    parts=("unweighted", "masked"),
    callers={
        "batch_norm_backward": lambda expression: frozenset(
            (["unweighted"] if not expression.params["weighted"] else [])
            + (["masked"] if not all(expression.params["output_mask"]) else [])
        ),
        # _instance_norm_backward (below) calls it on no weight, with its own mask
        "instance_norm_backward": lambda expression: frozenset({"unweighted", "masked"}),
    },
)
"""Emitted once into each module whose fused derivation calls it (``Primitive.helper``): ``unweighted``
where a batch norm has no weight, ``masked`` where a call asks for fewer than its three gradients
(``norm._batch_norm_backward_code``)."""


SUGGESTED_MEMORY_FORMAT = '''def _suggested_memory_format(x):
    """``x.suggest_memory_format()``, the layout ``F.group_norm`` and autograd's backward give the
    group_norm kernels on a CPU: channels_last where the strides are, dense or not (``empty_like``
    follows it where they are not), else dense; dense on other devices."""
    layout = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
    if x.device.type != "cpu" or layout is None or x.is_contiguous():
        return torch.contiguous_format
    probe = x if x.is_contiguous(memory_format=layout) else torch.empty_like(x)
    return layout if probe.is_contiguous(memory_format=layout) else torch.contiguous_format
'''
"""Emitted once into each module with a fused group_norm or instance_norm (both helpers hold it)."""


GROUP_NORM = (
    SUGGESTED_MEMORY_FORMAT
    + "\n\n"
    + '''def _group_norm(input, weight, bias, groups, eps=1e-05):
    """``F.group_norm(input, groups, weight, bias, eps)``, with the mean and 1 / std of each group
    its backward reads, from ``torch.native_group_norm``, the kernel F.group_norm runs (on ``input``
    in the layout it gives it). Under autocast, which runs F.group_norm in float32 on a GPU and not
    the native kernel, F.group_norm itself and no statistics (the backward computes them again)."""
    device = input.device.type  # "meta" where bind checks a call's sizes: no autocast there
    if device != "meta" and torch.is_autocast_enabled(device):
        return F.group_norm(input, groups, weight, bias, eps), None, None
    x = input.contiguous(memory_format=_suggested_memory_format(input))
    n, c, hxw = x.shape[0], x.shape[1], x.shape[2:].numel()
    return torch.native_group_norm(x, weight, bias, n, c, hxw, groups, eps)
'''
)
"""Emitted once into each module whose fused derivation calls it (``Primitive.helper``)."""


GROUP_NORM_BACKWARD = (
    SUGGESTED_MEMORY_FORMAT
    + "\n\n"
    + '''def _group_norm_backward(grad_output, input, weight, groups, mean, rstd, eps=1e-05,
                         output_mask=(True, True, True)):
    """group_norm's input, weight and bias gradients in one call of
    ``torch.ops.aten.native_group_norm_backward``, autograd's own kernel, from each group's mean
    and 1 / std as the forward's ``_group_norm`` returned them, as autograd saves them (None, under
    autocast: ``torch.native_group_norm`` computes them again, one pass over ``input``; constants
    here, as autograd's saved ones are). It runs in the dtype the forward computed in, its
    output's and so the gradient's (autocast runs group_norm in float32 on a GPU), and returns
    each gradient in the dtype of the tensor it belongs to. A float32 weight with a
    bfloat16 input (an instance norm under autocast) takes x and the gradient to float32: CUDA's
    kernels read the weight, mean and 1 / std in the input's dtype and refuse any other (the CPU's
    take the mix), and float32 is the precision autograd's batch_norm kernel computes it in. The
    kernel has no derivative of its own: where autograd records this gradient it is the formula
    instead, ``rstd * (ghat - mean(ghat) - xhat * mean(ghat * xhat))`` in each group, as
    autograd does.
    """
    dtype = torch.promote_types(input.dtype, grad_output.dtype)
    dtype = dtype if weight is None else torch.promote_types(dtype, weight.dtype)
    # each gradient goes back in its tensor's dtype (a bias without a weight: the dtype computed in)
    owners = (input.dtype, *[dtype if weight is None else weight.dtype] * 2)
    x, grad = input.to(dtype), grad_output.to(dtype)
    weight = None if weight is None else weight.to(dtype)
    n, c, hxw = x.shape[0], x.shape[1], x.shape[2:].numel()
    tracked = [value for value in (x, grad, weight) if value is not None and value.requires_grad]
    if torch.is_grad_enabled() and tracked:
        centered = x.reshape(n, groups, -1) - x.reshape(n, groups, -1).mean(2, keepdim=True)
        group_rstd = (centered.pow(2).mean(2, keepdim=True) + eps).rsqrt()
        xhat = centered * group_rstd
        channel = (1, c) + (1,) * (x.dim() - 2)
        ghat = (grad if weight is None else grad * weight.reshape(channel)).reshape(n, groups, -1)
        dims = [0] + list(range(2, x.dim()))
        grads = ((group_rstd * (ghat - ghat.mean(2, keepdim=True)
                          - xhat * (ghat * xhat).mean(2, keepdim=True))).reshape(x.shape),
                 (grad * xhat.reshape(x.shape)).sum(dims), grad.sum(dims))
        grads = [value if wanted else None for value, wanted in zip(grads, output_mask)]
    else:  # the kernels read raw memory: input and gradient in one layout, dense in it,
        # as autograd gives them (derivatives.yaml: grad.contiguous(...), input.contiguous(...));
        # a permuted gradient (a layer scale done in [N, H, W, C]) otherwise gives wrong values
        layout = _suggested_memory_format(x)
        x, grad = x.contiguous(memory_format=layout), grad.contiguous(memory_format=layout)
        # the forward's statistics, or computed again where there are none or they are narrower;
        # constants here (the forward's are differentiable outputs of native_group_norm, through
        # x, not tracked here, or the bias, which they do not depend on)
        again = mean is None or mean.dtype != torch.promote_types(mean.dtype, dtype)
        with torch.no_grad():
            statistics = (torch.native_group_norm(x, weight, None, n, c, hxw, groups, eps)[1:]
                          if again else (mean.detach(), rstd.detach()))
        grads = torch.ops.aten.native_group_norm_backward(
            grad, x, *statistics, weight, n, c, hxw, groups, list(output_mask))
    return tuple(None if grad is None else grad.to(owner) for grad, owner in zip(grads, owners))
'''
)
"""Emitted once into each module whose fused derivation calls it (``Primitive.helper``)."""


LAYER_NORM_BACKWARD = '''# the devices whose layer_norm kernels take a float32 weight and bias with a narrower input (a
# CPU's: its autocast runs layer_norm so); CUDA's read them in the input's dtype and refuse the mix
LAYER_NORM_MIXED_DEVICES = ("cpu",)

def _layer_norm_backward(grad_output, input, normalized_shape, weight, bias, mean, rstd,
                         eps=1e-05, output_mask=(True, True, True)):
    """layer_norm's input, weight and bias gradients in one call of
    ``torch.ops.aten.native_layer_norm_backward``, autograd's own (twice differentiable) kernel,
    from the mean and 1 / std the forward's ``torch.native_layer_norm`` returned, as autograd saves
    them (no derivative of their own: the kernel's accounts for their dependence on ``input``).
    Where autograd's call takes the operands as they are, that call alone: the gradient in the
    input's dtype and the weight and bias in it too, or, on a device of
    ``LAYER_NORM_MIXED_DEVICES``, float32 with float32 statistics (the mix the forward ran, a
    bfloat16 input under a CPU's autocast). Elsewhere it runs in the dtype of its operands
    together, a float32 weight's with a bfloat16 input (CUDA's kernels read the weight and bias in
    the input's dtype; the forward computed the statistics in float32 there too), computing the
    statistics again where they are narrower than that, and returns each gradient in its
    tensor's dtype.
    """
    dtypes = {param.dtype for param in (weight, bias) if param is not None}
    if grad_output.dtype == input.dtype and (dtypes <= {input.dtype} or (
            dtypes == {mean.dtype} == {torch.float32}
            and input.device.type in LAYER_NORM_MIXED_DEVICES)):
        return torch.ops.aten.native_layer_norm_backward(
            grad_output, input, normalized_shape, mean, rstd, weight, bias, list(output_mask))
    dtype = torch.promote_types(input.dtype, grad_output.dtype)
    for param in (weight, bias):
        dtype = dtype if param is None else torch.promote_types(dtype, param.dtype)
    owners = (input, weight, bias)  # each gradient goes back in its tensor's dtype
    grad, x, weight, bias = (value if value is None or value.dtype == dtype else value.to(dtype)
                             for value in (grad_output, input, weight, bias))
    # the forward's statistics, or computed again where they are narrower than that (a wider
    # gradient: a float32 layer scale after it under autocast)
    again = mean.dtype != torch.promote_types(mean.dtype, dtype)
    with torch.no_grad():
        statistics = (torch.native_layer_norm(x, normalized_shape, weight, None, eps)[1:]
                      if again else (mean, rstd))
    grads = torch.ops.aten.native_layer_norm_backward(
        grad, x, normalized_shape, *statistics, weight, bias, list(output_mask))
    return tuple(grad if grad is None or grad.dtype == owner.dtype else grad.to(owner.dtype)
                 for grad, owner in zip(grads, owners))
'''
"""Emitted once into each module whose fused derivation calls it (``Primitive.helper``)."""


INSTANCE_NORM = '''def _instance_norm(input, weight, bias, eps=1e-05):
    """``F.instance_norm(input, weight=weight, bias=bias, eps=eps)`` as it runs, with the mean and
    1 / std of each sample's channel that its backward reads: ``torch.native_batch_norm`` of
    ``input`` seen as one sample of N x C channels, weight and bias repeated N times (bit for bit
    F.instance_norm's output on a CPU; on a GPU F.instance_norm may run cuDNN's kernel). Under
    autocast, F.instance_norm itself and no statistics (the backward computes them again)."""
    device = input.device.type  # "meta" where bind checks a call's sizes: no autocast there
    if device != "meta" and torch.is_autocast_enabled(device):
        return F.instance_norm(input, weight=weight, bias=bias, eps=eps), None, None
    if input.shape[2:].numel() <= 1:  # F.instance_norm's own refusal: its statistics are 0 and 0
        raise ValueError("Expected more than 1 spatial element when training, got input size "
                         f"{list(input.shape)}")
    n = input.shape[0]
    repeated = [None if value is None else value.repeat(n) for value in (weight, bias)]
    channels = input.contiguous().reshape(1, -1, *input.shape[2:])  # dense: a view, no copy
    out, mean, invstd = torch.native_batch_norm(channels, *repeated, None, None, True, 0.1, eps)
    return out.reshape(input.shape), mean, invstd
'''
"""Emitted once into each module whose fused derivation calls it (``Primitive.helper``)."""


INSTANCE_NORM_BACKWARD = (
    GROUP_NORM_BACKWARD
    + "\n\n"
    + '''def _instance_norm_backward(grad_output, input, weight, mean, invstd, eps=1e-05,
                            output_mask=(True, True, True)):
    """instance_norm's input, weight and bias gradients as autograd takes them through
    F.instance_norm: one ``native_batch_norm_backward`` call on the N x C channels the forward's
    ``_instance_norm`` normalised, from the mean and 1 / std it returned, the weight's and bias's
    summed over their N copies. Without statistics (under autocast), group_norm's kernels with
    one group per channel, which compute them again; where the gradients are differentiated
    again, group_norm's formula (the derivatives of ``native_batch_norm_backward``'s own
    derivative are wrong: a third-order gradgradcheck through it fails)."""
    tracked = [value for value in (grad_output, input, weight)
               if value is not None and value.requires_grad]
    if mean is None or (torch.is_grad_enabled() and tracked):
        return _group_norm_backward(grad_output, input, weight, input.shape[1], None, None, eps,
                                    output_mask)
    n, c = input.shape[0], input.shape[1]
    channels = (1, n * c, *input.shape[2:])
    grad_input, grad_weight, grad_bias = _batch_norm_backward(
        grad_output.reshape(channels), input.contiguous().reshape(channels),
        None if weight is None else weight.repeat(n), mean, invstd, eps, output_mask)
    summed = (None if grad is None else grad.reshape(n, c).sum(0)
              for grad in (grad_weight, grad_bias))
    return (None if grad_input is None else grad_input.reshape(input.shape), *summed)
'''
)
"""Emitted once into each module whose fused derivation calls it (``Primitive.helper``)."""


BATCH_NORM_AGAIN = '''def _batch_norm_again(input, weight, bias, mean, invstd, eps=1e-05):
    """Training-mode batch_norm's output made again, bit for bit, from its input and the batch mean
    and 1 / std its forward returned (``--keep lean``). On a CPU the training kernel computes
    ``input * alpha + beta`` with alpha = invstd * weight and beta = bias - mean * alpha; the same
    kernel in eval mode, given the batch mean, a variance of ones, eps 0 and alpha as its weight,
    computes 1 / sqrt(1) = 1, that alpha and that beta, in one pass in the input's dtype (no float32
    copy of a bfloat16 input); ``torch.addcmul`` computes them too (the same fused multiply-adds),
    faster for a float32 channels_last input. Elsewhere, and where a graph is recorded (a
    derivative of the gradient also reads the statistics' dependence on ``input``), the forward's
    kernel again. Without a weight or bias (affine=False) the kernel's are 1 and 0: the same
    call given ones and zeros (the forward's own kernel without them, which ran with the running
    statistics, would take another path for a bfloat16 input, its output up to 1.6e-2 apart)."""
    graph = torch.is_grad_enabled() and any(
        value is not None and value.requires_grad for value in (input, weight, bias))
    if (graph or input.device.type != "cpu" or torch.compiler.is_compiling()
            or mean.dtype not in (torch.float32, torch.float64)
            or any(value is not None and value.dtype != mean.dtype for value in (weight, bias))):
        return torch.native_batch_norm(input, weight, bias, None, None, True, 0.0, eps)[0]
    weight = torch.ones_like(mean) if weight is None else weight  # affine=False: the kernel's 1
    bias = torch.zeros_like(mean) if bias is None else bias  # and 0
    alpha = invstd * weight
    if (input.dtype == mean.dtype and input.dim() == 4 and not input.is_contiguous()
            and input.is_contiguous(memory_format=torch.channels_last)):
        beta = torch.addcmul(bias, mean, alpha, value=-1).reshape(1, -1, 1, 1)
        return torch.addcmul(beta, input, alpha.reshape(1, -1, 1, 1))
    ones = torch.ones_like(mean)
    return torch.native_batch_norm(input, alpha, bias, mean, ones, False, 0.0, 0.0)[0]
'''
"""Emitted into a module whose backward makes a batch norm's output again
(``symgrad.rematerialize``). tests/pipeline/test_rematerialization.py checks it bitwise against
``torch.native_batch_norm`` (float32 and float64, contiguous and channels_last, a bfloat16 input)."""
