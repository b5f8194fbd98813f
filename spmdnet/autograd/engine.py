"""The backward engine: walks the graph recorded by ``Function.apply``
without recursion, with dependency counting, hooks and ``queue_callback``.

Hooks for data parallelism (PyTorch's names):
- ``Tensor.register_hook(fn)``: ``fn(grad)`` (a Tensor) may return a
  replacement gradient; runs once the tensor's whole gradient of this
  backward is known.
- ``Tensor.register_post_accumulate_grad_hook(fn)``: ``fn(tensor)`` runs on a
  leaf right after its ``.grad`` became final for this backward.

Inside the engine gradients are plain arrays; ``.grad`` is a Tensor, made
once per leaf and then accumulated into in place (``grad.array += g``), so a
``.grad`` whose data is a view into a flat buffer stays one. Where a leaf's
first gradient goes is the leaf's placement (``grad_placement``: a home
Tensor some wrapper chose), else a new Tensor.
- ``queue_callback(fn)``: called during a backward, runs ``fn()`` once that
  backward has finished (before ``backward()`` returns).
"""
import threading
import weakref

import numpy as np

from .. import _tensor
from .._tensor import Tensor, _as_array
from ..backend import xp_of
from .grad_placement import grad_home

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
        if root.array.size != 1:
            raise RuntimeError("backward() without a gradient needs a scalar output; "
                               f"got shape {root.shape}: pass grad of that shape")
        if root.array.dtype.kind == "c":
            raise RuntimeError("grad can be implicitly created only for real scalar outputs "
                               f"(got {root.array.dtype}): take .real, .abs() or pass grad")
        return xp_of(root.array).ones_like(root.array)
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
    shared = _Aliased()  # arrays that may be held elsewhere: copy before keeping
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
                if g is not None:  # a hook may have kept g: .grad must not be it
                    _accumulate(t, g, g in shared or bool(t._hooks))
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
        new = hook(Tensor(g))
        g = g if new is None else _as_array(new)
    return g


def _propagate(t, g, grads, shared, pending, ready, nodes):
    """Run t's backward and hand each parent its share of the gradient."""
    ctx = t._ctx
    if g is None or _added_into_parent(ctx, g, grads, shared):
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
                grads[key] = _add(grads[key], pg, shared)
            else:
                # A pass-through, a view, or one array given to two inputs may
                # alias memory that someone else owns: a leaf copies it.
                if pg is g or pg.base is not None or any(pg is h for h in handed):
                    shared.add(pg)
                if pg.base is not None:  # h and h.T to two inputs: h is not ours alone
                    shared.add(pg.base)
                grads[key] = pg
            handed.append(pg)
        pending[key] -= 1
        if pending[key] == 0:
            ready.append(parent)


class _Aliased:
    """The gradient arrays that may be held elsewhere too (a pass-through,
    a view, one array handed to two inputs), by identity. Not by id alone: a
    freed array's id is reused by the next allocation, which would then look
    aliased (a needless copy, no in-place sum). Weak references, so marking
    an array does not keep it alive."""

    def __init__(self):
        self.refs = {}

    def add(self, a):
        try:
            self.refs[id(a)] = weakref.ref(a)
        except TypeError:  # an array type without weak references: keep it
            self.refs[id(a)] = lambda a=a: a

    def __contains__(self, a):
        ref = self.refs.get(id(a))
        return ref is not None and ref() is a


def _owned(acc, shared):
    """True when the engine alone holds ``acc`` (a gradient being summed),
    so adding into it in place is safe: no backward handed it to another
    input, and it is no view (of an output gradient or of a user's array)."""
    return acc not in shared and acc.base is None and getattr(acc.flags, "writeable", True)


def _add(acc, pg, shared):
    """acc + pg, in place into acc where the engine owns it (residual
    connections sum two gradients per layer: no new array for each)."""
    if _owned(acc, shared) and acc.dtype == pg.dtype:
        acc += pg
        return acc
    return acc + pg  # a new array: never mutate a shared one


def _added_into_parent(ctx, g, grads, shared):
    """True when ``ctx.backward_add(acc, g)`` added this op's input gradient
    straight into the gradient its single input has collected already: a
    slice of a tensor (split's pieces, q/k/v of one projection) then costs a
    slice-sized add, not a zero array of the whole input plus a full add."""
    add_into = getattr(ctx, "backward_add", None)
    if add_into is None or len(ctx.parents) != 1:
        return False
    acc = grads.get(id(ctx.parents[0]))
    if acc is None or not _owned(acc, shared) or acc.dtype != g.dtype:
        return False
    add_into(acc, g)
    return True


def _destination(parent, grads, pending):
    """The array of the leaf's gradient placement when this edge delivers
    its only gradient (the op may write it there directly)."""
    if parent._ctx is not None or parent._grad is not None or parent._hooks:
        return None
    key = id(parent)
    if pending.get(key) != 1 or key in grads:
        return None
    home = grad_home(parent)
    return None if home is None else home.array


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
    """Add the array g into t.grad in place (keeping views into flat buffers
    valid); a leaf with a gradient placement gets its home Tensor as .grad."""
    grad = t._grad
    if grad is None:
        home = grad_home(t)
        if home is not None:
            if g is not home.array:
                home.array[...] = g
            t._grad = home
        else:
            t._grad = Tensor(g.copy() if must_copy else g)
    else:
        grad.array += g
    for hook in t._post_hooks or ():
        hook(t)


_tensor.BACKWARD_ENGINE[0] = backward  # Tensor.backward's engine (see _tensor.py)
