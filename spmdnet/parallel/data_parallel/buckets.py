"""Gradient buckets: persistent flat buffers whose slices are the gradients.

Parameters are packed in reverse registration order (the order backward
makes their gradients final), one dtype per bucket; the first bucket is
small (``first_bytes``) so communication starts early, the others hold up to
``cap_bytes``. Every parameter's ``grad_buffer`` is a Tensor whose ``.array``
is a view into its bucket, made once; backward writes gradients straight
into the buffer that MPI reduces and makes that same Tensor the ``.grad``: a
step neither allocates nor copies for communication (DDP's
``gradient_as_bucket_view``).
"""
from ..._tensor import Tensor
from ...backend import xp_of
from .._common.flat import FlatLayout, assign_buckets


class Bucket:
    """A flat buffer and the parameters whose gradients are views into it
    (``views[i]`` the array, ``homes[i]`` the Tensor over it)."""

    def __init__(self, index, params):
        self.index = index
        self.params = params
        first = params[0].array
        self.dtype = first.dtype
        self.layout = FlatLayout([p.array.shape for p in params])
        self.numel = self.layout.numel
        self.buffer = xp_of(first).zeros(self.numel, dtype=self.dtype)
        self.views = self.layout.views(self.buffer)
        self.homes = [Tensor(view) for view in self.views]
        self.ready = 0        # parameters whose gradient is final this backward
        self.launched = False

    @property
    def nbytes(self):
        return self.buffer.nbytes

    def pack_data(self):
        """Copy the parameters' values into the buffer (for broadcasting)."""
        for p, view in zip(self.params, self.views):
            view[...] = p.array

    def unpack_data(self):
        """Copy the buffer back into the parameters' values, in place."""
        for p, view in zip(self.params, self.views):
            p.array[...] = view

    def reset(self):
        self.ready = 0
        self.launched = False


def build_buckets(params, first_bytes, cap_bytes):
    """Buckets for ``params``; each parameter's grad becomes a bucket view."""
    buckets = [Bucket(i, group)
               for i, group in enumerate(assign_buckets(params, first_bytes, cap_bytes))]
    for bucket in buckets:
        for p, home in zip(bucket.params, bucket.homes):
            if p.grad is not None:
                home.array[...] = p.grad.array
                p.grad = home
            p.grad_buffer = home
    return buckets
