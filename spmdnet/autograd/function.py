"""The Function base class: one differentiable operation of the graph."""

from .. import _precision
from .._tensor import Tensor
from . import meta
from .grad_mode import is_grad_enabled


class Function:
    """One differentiable operation: ``forward`` on arrays, ``backward`` on
    the output gradient, returning one gradient per tensor input (``None``
    where ``needs_input_grad`` is False).

    ``backward`` returns fresh arrays, or the incoming gradient itself (or a
    view of it); never an array saved from forward, because the engine may
    hand a returned array to a leaf's ``.grad`` (as its ``.array``) without
    copying it.
    """

    needs_input_grad = ()
    grad_dest = ()  # per input: an array backward may write its gradient into

    def dest(self, i):
        """Where backward may write input i's gradient (``out=``), or None."""
        return self.grad_dest[i] if self.grad_dest else None

    @classmethod
    def apply(cls, *inputs, **kwargs):
        """Run forward on the inputs' arrays and record the graph if needed."""
        ctx = cls()
        record = is_grad_enabled() and any(t.requires_grad for t in inputs)
        ctx.needs_input_grad = tuple(t.requires_grad for t in inputs) if record else ()
        arrays = [t.array for t in inputs]
        if meta.any_meta(arrays):  # shape-only inputs: a shape-only result (meta.py)
            result = Tensor(meta.forward(ctx, arrays, kwargs, record))
        else:  # scalars: 0-d; bfloat16 and autocast: in float32, rounded (_precision.py)
            result = Tensor(_precision.forward(ctx, arrays, kwargs))
        if record:
            result._requires_grad = True
            result._ctx = ctx
            ctx.parents = inputs
        return result

    def forward(self, *arrays, **kwargs):
        raise NotImplementedError

    def backward(self, grad):
        raise NotImplementedError

    def release(self):
        """Drop everything saved for backward (the graph is freed)."""
        name = type(self).__name__
        self.__dict__.clear()
        self.freed = name
