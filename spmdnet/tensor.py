"""Tensor, the Function base class, and the backward engine.

A Tensor wraps a NumPy or CuPy array. Every differentiable operation is a
``Function`` subclass (in ``spmdnet.ops``) whose ``apply`` records, when a
gradient is needed, the function as the result's ``_ctx`` with its input
tensors as ``parents``. ``backward()`` walks that graph without recursion.

This module knows no op by name: ``spmdnet.ops`` binds the operators and
methods (``+``, ``@``, ``.sum()`` ...) onto Tensor from one explicit table.

Hooks for data parallelism (PyTorch's names):
- ``Tensor.register_hook(fn)``: ``fn(grad)`` may return a replacement
  gradient; runs once the tensor's whole gradient of this backward is known.
- ``Tensor.register_post_accumulate_grad_hook(fn)``: ``fn(tensor)`` runs on a
  leaf right after its ``.grad`` became final for this backward.
- ``queue_callback(fn)``: called during a backward, runs ``fn()`` once that
  backward has finished (before ``backward()`` returns).
"""
import threading

import numpy as np

from .backend import asnumpy, device_of, is_cupy_array, to_device, xp_of

from .grad_mode import (enable_grad, get_default_dtype, is_grad_enabled,  # noqa: F401
                        no_grad, set_default_dtype)


def _as_array(x, dtype=None):
    """An ndarray for x; arrays keep their dtype, lists/scalars take the default."""
    if isinstance(x, Tensor):
        x = x.data
    if isinstance(x, np.ndarray) or is_cupy_array(x):
        return x if dtype is None else x.astype(dtype, copy=False)
    arr = np.asarray(x)
    if dtype is None and arr.dtype.kind == "f":
        dtype = get_default_dtype()
    return arr if dtype is None else arr.astype(dtype, copy=False)


class Tensor:
    """An array with an optional gradient and the graph that produced it."""

    __slots__ = ("data", "grad", "grad_buffer", "_requires_grad", "_ctx", "_hooks",
                 "_post_hooks", "_retain", "__weakref__")
    __array_priority__ = 1000  # ndarray OP Tensor defers to Tensor's reflected op

    def __init__(self, data, requires_grad=False):
        self.data = _as_array(data)
        self.grad = None
        # Preallocated storage for this leaf's gradient (data parallelism's
        # flat bucket views): when .grad is None, backward writes the
        # gradient here, directly into it where the op supports ``out=``.
        self.grad_buffer = None
        self._ctx = None
        self._hooks = None
        self._post_hooks = None
        self._retain = False
        self._requires_grad = False
        self.requires_grad = requires_grad

    # -- attributes ------------------------------------------------------------
    @property
    def requires_grad(self):
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, flag):
        if flag and self.data.dtype.kind not in "fc":
            raise TypeError("only floating point tensors can require gradients, "
                            f"got dtype {self.data.dtype}")
        self._requires_grad = bool(flag)

    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: self.data.size)
    device = property(lambda self: device_of(self.data))
    is_leaf = property(lambda self: self._ctx is None)

    def __len__(self):
        return len(self.data)

    def __repr__(self):
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"tensor({self.data!r}{grad})"

    def __bool__(self):
        if self.data.size != 1:
            raise ValueError(f"truth value of a tensor of shape {self.shape} is ambiguous")
        return bool(self.data)

    __hash__ = object.__hash__  # identity, so tensors can key dicts and sets

    # -- conversions -------------------------------------------------------------
    def numpy(self):
        """A host NumPy copy of the data (never shares memory with the tensor)."""
        return np.array(asnumpy(self.data), copy=True)

    def item(self):
        """The single element as a Python scalar."""
        if self.data.size != 1:
            raise ValueError(f"item() needs exactly one element, tensor has shape {self.shape}")
        return self.data.reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def detach(self):
        """A tensor sharing this data, outside any graph."""
        return Tensor(self.data)

    def to(self, device):
        """This tensor on ``"cpu"`` or ``"gpu"`` (a new leaf when it moves)."""
        if device_of(self.data) == device:
            return self
        return Tensor(to_device(self.data, device), requires_grad=self.requires_grad)

    def astype(self, dtype):
        """A copy cast to ``dtype``, outside the graph (use for labels, masks)."""
        return Tensor(self.data.astype(dtype))

    # -- hooks -------------------------------------------------------------------
    def register_hook(self, fn):
        """Run ``fn(grad)`` when this tensor's gradient is known; a non-None
        return value replaces the gradient."""
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that does not require grad")
        self._hooks = (self._hooks or []) + [fn]
        return _HookHandle(self, "_hooks", fn)

    def register_post_accumulate_grad_hook(self, fn):
        """Run ``fn(self)`` on a leaf right after its ``.grad`` is final."""
        if self._ctx is not None:
            raise RuntimeError("post-accumulate-grad hooks are for leaf tensors only")
        self._post_hooks = (self._post_hooks or []) + [fn]
        return _HookHandle(self, "_post_hooks", fn)

    def retain_grad(self):
        """Keep ``.grad`` on a non-leaf tensor after backward."""
        self._retain = True

    def backward(self, grad=None, retain_graph=False):
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``."""
        backward(self, grad, retain_graph)


class _HookHandle:
    """Returned by the register_* methods; ``remove()`` unregisters."""

    def __init__(self, tensor, slot, fn):
        self.tensor, self.slot, self.fn = tensor, slot, fn

    def remove(self):
        hooks = getattr(self.tensor, self.slot) or []
        setattr(self.tensor, self.slot, [h for h in hooks if h is not self.fn] or None)


def tensor(data, dtype=None, requires_grad=False):
    """A new leaf tensor holding a copy of ``data`` (list, scalar, NumPy or
    CuPy array, or Tensor). Arrays keep their dtype; floating lists and
    scalars take the default dtype."""
    arr = _as_array(data, dtype)
    arr = arr.copy() if arr is data or (isinstance(data, Tensor) and arr is data.data) else arr
    return Tensor(arr, requires_grad=requires_grad)


def as_tensor(data, dtype=None):
    """A tensor sharing ``data``'s memory when no conversion is needed."""
    return data if isinstance(data, Tensor) and dtype is None else Tensor(_as_array(data, dtype))


class Function:
    """One differentiable operation: ``forward`` on arrays, ``backward`` on
    the output gradient, returning one gradient per tensor input (``None``
    where ``needs_input_grad`` is False).

    ``backward`` returns fresh arrays, or the incoming gradient itself (or a
    view of it); never an array saved from forward, because the engine may
    hand a returned array to a leaf's ``.grad`` without copying it.
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
        out = ctx.forward(*[t.data for t in inputs], **kwargs)
        if isinstance(out, np.generic):
            out = np.asarray(out)
        result = Tensor(out)
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


_callbacks = threading.local()


def queue_callback(fn):
    """Run ``fn()`` when the backward pass now running finishes."""
    queue = getattr(_callbacks, "queue", None)
    if queue is None:
        raise RuntimeError("queue_callback() can only be called during backward()")
    queue.append(fn)


def _graph(root):
    """Tensors reachable from root that need a gradient, and for each the
    number of graph edges that will deliver one to it (iterative DFS)."""
    nodes, pending = {id(root): root}, {id(root): 0}
    stack = [root]
    while stack:
        ctx = stack.pop()._ctx
        if ctx is None:
            continue
        if getattr(ctx, "freed", None):
            raise RuntimeError(
                f"backward through a freed graph (at {ctx.freed}): the graph is freed "
                "after backward; pass retain_graph=True to backward twice")
        for parent in ctx.parents:
            if not parent.requires_grad:
                continue
            key = id(parent)
            if key not in nodes:
                nodes[key], pending[key] = parent, 0
                stack.append(parent)
            pending[key] += 1
    return nodes, pending


def _seed_grad(root, grad):
    if not root.requires_grad:
        raise RuntimeError("backward() on a tensor that does not require grad "
                           "(and has no graph); did you forget requires_grad=True?")
    if grad is None:
        if root.data.size != 1:
            raise RuntimeError("backward() without a gradient needs a scalar output; "
                               f"got shape {root.shape}: pass grad of that shape")
        return xp_of(root.data).ones_like(root.data)
    g = _as_array(grad, root.dtype)
    if g.shape != root.shape:
        raise ValueError(f"backward(): grad shape {g.shape} != tensor shape {root.shape}")
    return g.copy()


def backward(root, grad=None, retain_graph=False):
    """Backpropagate from ``root`` (see ``Tensor.backward``).

    A tensor is processed once every consumer has delivered its gradient
    (dependency counting), so a leaf's gradient is final, and its
    post-accumulate hooks fire, as early as possible: data parallelism starts
    reducing a bucket while backward continues on earlier layers.
    """
    nodes, pending = _graph(root)
    grads = {id(root): _seed_grad(root, grad)}
    shared = set()  # arrays handed to more than one input: copy before keeping
    outer = getattr(_callbacks, "queue", None)
    _callbacks.queue = []
    try:
        ready = [root]
        while ready:
            t = ready.pop()
            g = grads.pop(id(t), None)
            if g is not None:
                g = _run_hooks(t, g)
            if t._ctx is None:
                if g is not None:
                    _accumulate(t, g, id(g) in shared)
                continue
            if t._retain and g is not None:
                _accumulate(t, g, True)
            _propagate(t, g, grads, shared, pending, ready, nodes)
            if not retain_graph:
                t._ctx.release()
        for fn in _callbacks.queue:
            fn()
    finally:
        _callbacks.queue = outer


def _run_hooks(t, g):
    for hook in t._hooks or ():
        new = hook(g)
        g = g if new is None else _as_array(new)
    return g


def _propagate(t, g, grads, shared, pending, ready, nodes):
    """Run t's backward and hand each parent its share of the gradient."""
    ctx = t._ctx
    if g is None:
        parent_grads = (None,) * len(ctx.parents)
    else:
        ctx.grad_dest = tuple(_destination(p, grads, pending) for p in ctx.parents)
        parent_grads = ctx.backward(g)
    if not isinstance(parent_grads, tuple):
        parent_grads = (parent_grads,)
    assert len(parent_grads) == len(ctx.parents), (
        f"{type(ctx).__name__}.backward returned {len(parent_grads)} gradients "
        f"for {len(ctx.parents)} inputs")
    handed = []
    for parent, pg in zip(ctx.parents, parent_grads):
        key = id(parent)
        if key not in nodes:
            continue
        if pg is not None:
            pg = _check_grad(ctx, parent, pg)
            if key in grads:
                grads[key] = grads[key] + pg  # a new array: never mutate a shared one
            else:
                # A pass-through, a view, or one array given to two inputs may
                # alias memory that someone else owns: a leaf copies it.
                if pg is g or pg.base is not None or any(pg is h for h in handed):
                    shared.add(id(pg))
                grads[key] = pg
            handed.append(pg)
        pending[key] -= 1
        if pending[key] == 0:
            ready.append(parent)


def _destination(parent, grads, pending):
    """The leaf's grad_buffer when this edge delivers its only gradient."""
    buf = parent.grad_buffer
    if buf is None or parent._ctx is not None or parent.grad is not None or parent._hooks:
        return None
    key = id(parent)
    return buf if pending.get(key) == 1 and key not in grads else None


def _check_grad(ctx, parent, pg):
    if isinstance(pg, np.generic):
        pg = np.asarray(pg)
    if pg.shape != parent.shape:
        raise RuntimeError(f"{type(ctx).__name__}.backward returned a gradient of shape "
                           f"{pg.shape} for an input of shape {parent.shape}")
    if pg.dtype != parent.dtype:
        pg = pg.astype(parent.dtype)
    return pg


def _accumulate(t, g, must_copy):
    """Add g into t.grad in place (keeping views into flat buffers valid)."""
    if t.grad is None:
        buf = t.grad_buffer
        if buf is not None:
            if g is not buf:
                buf[...] = g
            t.grad = buf
        else:
            t.grad = g.copy() if must_copy else g
    else:
        t.grad += g
    for hook in t._post_hooks or ():
        hook(t)
