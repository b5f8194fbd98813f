"""Ops on meta tensors (PyTorch's ``device("meta")``): ``Function.apply``
runs an op whose inputs include a meta tensor here.

Forward: ops whose forward would compute on plain arrays (windows through
``as_strided``, time loops, NumPy functions that strip ``MetaArray``) give
their result's shape and dtype by a rule the ops register by class
(``register_shape_rule``, ``register_elementwise``: ops/_meta_rules.py and the
op modules); any other op's forward runs on the inputs' ``MetaArray``s, whose
NumPy is shape-only (``_meta.py``), and what it returns is kept as shape and
dtype only. Backward never runs the op's own:
each input's gradient is a meta array of that input's shape and dtype, so
``loss.backward()`` on a meta graph gives meta gradients, as PyTorch's.
An op that cannot run shape-only raises NotImplementedError naming it.
"""
import numpy as np

from .. import _precision
from .._meta import MetaArray, meta_array, reading_placeholders


def any_meta(arrays):
    """Whether any array is a ``MetaArray`` (asked of every op: kept cheap)."""
    for a in arrays:
        if type(a) is MetaArray:  # meta arrays are never subclassed further
            return True
    return False


_RULES = {}  # op class -> (ctx, arrays, kwargs) -> (result shape, dtype)


def register_shape_rule(op, rule):
    """Give op class ``op`` (a ``Function`` subclass, exactly: not its
    subclasses) a shape rule for meta inputs: ``rule(*arrays, **kwargs)`` ->
    (result shape, dtype), called in place of the op's forward. For ops whose
    forward would allocate or compute on the placeholders (plain arrays it
    derives, time loops, NumPy functions that strip ``MetaArray``)."""
    if not isinstance(op, type) or not callable(rule):
        raise TypeError(f"register_shape_rule: an op class and a callable, got {op!r}, {rule!r}")
    _RULES[op] = lambda ctx, arrays, kwargs: rule(*arrays, **kwargs)


def register_elementwise(op):
    """Shape rule of an elementwise op: its forward runs on one-element
    meta stand-ins of the inputs (its argument checks and its result dtype,
    no work) and the result has the inputs' broadcast shape."""
    if not isinstance(op, type):
        raise TypeError(f"register_elementwise: an op class, got {op!r}")
    _RULES[op] = _elementwise


def _elementwise(ctx, arrays, kwargs):
    small = [meta_array((1,) * a.ndim, a.dtype) if type(a) is MetaArray else a for a in arrays]
    with reading_placeholders():
        out = _precision.forward(ctx, small, kwargs)
    return np.broadcast_shapes(*[np.shape(a) for a in arrays]), out.dtype


def _forward(ctx, arrays, kwargs):
    rule = _RULES.get(type(ctx))
    if rule is not None:
        return meta_array(*rule(ctx, arrays, kwargs))
    with reading_placeholders():
        out = _precision.forward(ctx, arrays, kwargs)
    return meta_array(out.shape, out.dtype)


def forward(ctx, arrays, kwargs, record):
    """The op's result on meta inputs: a ``MetaArray`` of its shape and dtype;
    when the graph is recorded, its backward gives meta gradients."""
    try:
        out = _forward(ctx, arrays, kwargs)
    except NotImplementedError as e:
        raise NotImplementedError(f"{type(ctx).__name__} on the 'meta' device: {e}") from e
    if record:
        need, inputs = ctx.needs_input_grad, [(a.shape, a.dtype) for a in arrays]
        ctx.__dict__.clear()  # nothing saved: the gradients are shapes too
        ctx.needs_input_grad = need
        ctx.backward = lambda grad: tuple(meta_array(*i) if n else None
                                          for i, n in zip(inputs, need))
    return out
