"""One gradient bucket of a ``ParamAndGradBuffer``: a contiguous range of
one layout, its storage, and each parameter's view of it.

A bucket holds whole parameters of one layout group (one dtype for
DataParallel and ZeRO, one flat shard for FSDP) and covers
``[start, stop)`` of that group's ``FlatLayout`` (``whole``: the entire
padded layout, so rank r's part is exactly shard r). Its storage is one
array over that range (``attach``): persistent (a view of the buffer's flat
gradient array) or transient (made when the first gradient arrives, from
the buffer's allocator, and handed back once its collective has landed).
``views``/``homes``: each parameter's part of it, as an array and as the
Tensor that becomes its ``.grad`` (gradient-as-bucket-view).

``collect`` moves the parameters' ``.grad`` into the storage when the
caller says they are final (FSDP, at a unit's backward end): a gradient
that backward wrote into its home is there already; any other is copied, or
added when the storage carries gradients of earlier backward passes
(``no_sync``: the storage is kept, and later gradients take the default
placement and are added here).

A layout without views (``flat.ChunkLayout``: each parameter cut into
pieces, one per shard) has no ``views``/``homes``: ``collect`` copies (or
adds) each gradient into its pieces, and gradients never land in place.
"""
from ..._tensor import Tensor


class Bucket:
    """Parameters ``params`` of layout group ``key`` (laid out by ``layout``;
    ``slots``: each parameter's index in it). See the module docstring."""

    def __init__(self, index, key, params, layout, slots, whole=False):
        self.index, self.key, self.params, self.layout = index, key, params, layout
        self.slots = list(slots)
        self.dtype = params[0].array.dtype if layout.dtype is None else layout.dtype
        self.shapes = [layout.shapes[i] for i in slots]
        offsets = [layout.offsets[i] for i in slots]
        if whole:
            self.start, self.stop = 0, layout.padded_numel
        else:
            self.start = min(offsets)
            self.stop = max(o + layout.numels[i] for o, i in zip(offsets, slots))
        self._at = [(o - self.start, layout.numels[i]) for o, i in zip(offsets, slots)]
        self.buffer = self.views = self.homes = None
        self.work = None            # the collective in flight (None once waited for)
        self.ready = 0              # parameters whose gradient is final this backward
        self.started = self.landed = False
        self.carried = False        # the storage holds gradients of earlier backward passes

    @property
    def nbytes(self):
        return (self.stop - self.start) * self.dtype.itemsize

    def attach(self, buffer):
        """Make ``buffer`` (its flat range) this bucket's storage."""
        self.buffer = buffer
        if not self.layout.viewable:
            return
        self.views = [buffer[a:a + n].reshape(shape)
                      for (a, n), shape in zip(self._at, self.shapes)]
        self.homes = [Tensor(v) for v in self.views]

    def detach(self):
        """Drop the storage (returned, for the allocator to take back)."""
        buffer, self.buffer, self.views, self.homes = self.buffer, None, None, None
        self.carried = False
        return buffer

    def collect(self, make_storage):
        """Every parameter's ``.grad`` into the storage (made by
        ``make_storage()`` if there is none yet), then dropped: the gradients
        of this backward are final (see the module docstring)."""
        for i, p in enumerate(self.params):
            g = p.grad
            if g is None:
                continue
            if self.buffer is None:
                self.attach(make_storage())
            if self.views is None:
                self.layout.put(self.buffer, self.slots[i], g.array, add=self.carried)
                p.grad = None
                continue
            home, view = self.homes[i], self.views[i]
            if g is not home or home.array is not view:
                if self.carried:
                    view += g.array
                else:
                    view[...] = g.array
                home.array = view
            p.grad = None
        self.carried = self.buffer is not None

    def reset(self):
        self.ready, self.work = 0, None
        self.started = self.landed = False
