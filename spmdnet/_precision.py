"""bfloat16 ops and CPU autocast, as PyTorch's CPU runs them, at the one
point every op passes: ``autograd.Function.apply`` hands each op's forward
to ``forward`` here.

bfloat16 (``dtypes.bfloat16``): an op with a bfloat16 input computes on its
inputs widened to float32 (exact) and rounds its floating result to
bfloat16 (nearest even) when every floating input was bfloat16; a wider
floating input (float32, float64) makes the result that wider dtype, as
PyTorch's type promotion. That is PyTorch's CPU bfloat16: each op computes
in float32 (its reductions and matrix products accumulate in float32) and
rounds its output once. The backward does the same: the output gradient
widened, the op's backward in float32, each input's gradient rounded to
bfloat16 where that input was bfloat16.

CPU autocast to bfloat16 (``amp.autocast("cpu")``): PyTorch's op lists by
spmdnet's op classes. ``LOWER`` (matrix products, linear, convolutions,
attention) round their float32 inputs to bfloat16 first and so return
bfloat16; ``FLOAT32`` (the losses) widen bfloat16 inputs and return
float32; every other op runs on its inputs' dtypes (a bfloat16 input stays
bfloat16, float32 + bfloat16 is float32). float64 inputs are left alone,
as PyTorch's CPU autocast leaves them. Gradients flow back through the
casts: a float32 parameter gets a float32 gradient, rounded to bfloat16 on
its way through a ``LOWER`` op, as PyTorch's cast's backward gives it.
"""
import numpy as np

from .dtypes import bfloat16

# PyTorch's CPU autocast lists (torch.amp autocast_mode, "lower_precision_fp"
# and "fp32"), by the spmdnet Function classes that implement those ops
LOWER = frozenset({"MatMul", "Linear", "LinearAct", "Conv2d", "ConvTranspose2d", "Einsum",
                   "ScaledDotProductAttention", "Bmm", "Addmm"})
FLOAT32 = frozenset({"_ClassIndexLoss", "CrossEntropy", "NLLLoss", "CrossEntropyProbs",
                     "_Pointwise", "MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "KLDiv",
                     "BCE", "BCEWithLogits", "Prod"})

# ops that only move, select or copy values: they run on bfloat16 as it is
# (a view stays a view)
MOVES = frozenset({"Reshape", "Permute", "Expand", "Repeat", "Contiguous", "Index",
                   "Concatenate", "Stack", "Triangle", "Gather", "Diag", "Flip", "Roll",
                   "Clone", "ToDevice", "MaskedFill", "Where", "Cast"})

# the autocast blocks running, innermost last: (device_type, dtype), dtype
# None for a disabled block (it turns its device's autocast off inside it)
autocast_state = []


def autocast_dtype(device_type):
    """The dtype of the innermost autocast block for ``device_type``, or
    None (no block, or a disabled one)."""
    for device, dtype in reversed(autocast_state):
        if device == device_type:
            return dtype
    return None


def _names(ctx):
    return [cls.__name__ for cls in type(ctx).__mro__]


def _autocast_rule(ctx):
    """"lower", "float32" or None for this op under the current autocast."""
    if autocast_state == [] or autocast_dtype("cpu") is None:
        return None
    names = _names(ctx)
    if any(n in LOWER for n in names):
        return "lower"
    if any(n in FLOAT32 for n in names):
        return "float32"
    return None


def _widen(a):
    return a.astype(np.float32) if getattr(a, "dtype", None) == bfloat16 else a


def forward(ctx, arrays, kwargs):
    """``ctx.forward(*arrays, **kwargs)``, in PyTorch's bfloat16 and autocast
    semantics (module docstring); the common case (no bfloat16 input, no
    autocast) is the plain call."""
    if not autocast_state:  # the common case first: no autocast, no bfloat16
        for a in arrays:
            if a.dtype == bfloat16:
                break
        else:
            return ctx.forward(*arrays, **kwargs)
    rule = _autocast_rule(ctx)
    if rule is None and (not any(a.dtype == bfloat16 for a in arrays)
                         or type(ctx).__name__ in MOVES):
        return ctx.forward(*arrays, **kwargs)
    given = [a.dtype for a in arrays]
    if rule == "lower":
        arrays = [a.astype(bfloat16) if a.dtype == np.float32 else a for a in arrays]
    # PyTorch's promotion: dimensioned tensors decide over 0-d ones (a Python
    # number beside bfloat16 comes as a 0-d float32: ops/arith.promote)
    floating = [a for a in arrays if a.dtype.kind in "fc" or a.dtype == bfloat16]
    floating = [a.dtype for a in floating if a.ndim] or [a.dtype for a in floating]
    low = [a.dtype == bfloat16 for a in arrays]
    if rule == "float32" or not any(low):
        rounds = False
    else:
        rounds = all(d == bfloat16 for d in floating)
    out = ctx.forward(*[_widen(a) for a in arrays], **kwargs)
    if any(low):
        backward = ctx.backward
        ctx.backward = lambda g: _backward(backward, g, low, given)
    return _round(out) if rounds else out


def _round(out):
    if isinstance(out, tuple):
        return tuple(_round(o) for o in out)
    if getattr(out, "dtype", None) is not None and out.dtype.kind == "f":
        return out.astype(bfloat16)
    return out


def _backward(backward, g, low, given):
    """The op's backward in float32; input i's gradient rounded to bfloat16
    where the op took it as bfloat16, then in the dtype input i came in
    (autocast's cast back to a float32 parameter)."""
    grads = backward(_widen(g))
    single = not isinstance(grads, tuple)
    grads = list((grads,) if single else grads)
    for i, grad in enumerate(grads):
        if grad is not None and i < len(low) and low[i] and grad.dtype.kind == "f":
            grads[i] = grad.astype(bfloat16).astype(given[i], copy=False)
    return grads[0] if single else tuple(grads)
