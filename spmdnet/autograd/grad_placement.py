"""Where backward puts a leaf's gradient: a per-leaf placement, kept outside
``Tensor`` and outside the engine's knowledge of who asked for it.

``place_grad(leaf, home)`` names a Tensor (``home``) whose array is to hold
the leaf's gradient: when backward delivers a gradient to the leaf while its
``.grad`` is None, the gradient is written into ``home.array`` (ops with an
``out=`` path write there directly, see ``Function.dest``) and ``home``
becomes the ``.grad`` — no copy, no new array. ``home`` may also be a
callable ``home(leaf)`` returning such a Tensor (or None: the default
placement), asked once per backward at the moment the gradient arrives;
storage can then be made on demand. ``place_grad(leaf, None)`` removes the
placement. A leaf with hooks from ``register_hook`` keeps the default
placement for a first gradient a hook may have kept (see ``engine``).

Data parallelism uses this for gradient-as-bucket-view (PyTorch DDP's
``gradient_as_bucket_view``); the engine sees only a destination array.
The registry holds weak references to the leaves: a placement ends with
its leaf.
"""
import weakref

_homes = {}  # id(leaf) -> (weak reference to the leaf, home Tensor or callable)


def place_grad(leaf, home):
    """Put ``leaf``'s next gradient into ``home`` (a Tensor of the leaf's
    shape and dtype, or a callable ``home(leaf)``); None removes it."""
    key = id(leaf)
    if home is None:
        _homes.pop(key, None)
        return
    if leaf._ctx is not None:
        raise RuntimeError("place_grad: a gradient placement is for leaf tensors only")
    if not callable(home):
        if tuple(home.shape) != tuple(leaf.shape) or home.dtype != leaf.dtype:
            raise ValueError(f"place_grad: home of shape {tuple(home.shape)} and dtype "
                             f"{home.dtype} for a leaf of shape {tuple(leaf.shape)} and "
                             f"dtype {leaf.dtype}")
    _homes[key] = (weakref.ref(leaf, lambda _, key=key: _homes.pop(key, None)), home)


def grad_home(leaf, resolve=True):
    """The Tensor ``leaf``'s gradient goes into (a callable placement is
    called unless ``resolve`` is False), or None."""
    entry = _homes.get(id(leaf))
    if entry is None or entry[0]() is not leaf:
        return None
    home = entry[1]
    return home(leaf) if resolve and callable(home) else home


def has_placement(leaf):
    """Whether ``leaf``'s gradient has a placement (a wrapper holds its home)."""
    return grad_home(leaf, resolve=False) is not None
