"""Shape ops: reshape, transpose, indexing, concatenate, stack."""
from ..backend import scatter_add, xp_of
from ..autograd import Function


class Reshape(Function):
    def forward(self, a, shape):
        self.shape = a.shape
        return a.reshape(shape)

    def backward(self, g):
        return g.reshape(self.shape)


class Transpose(Function):
    def forward(self, a, axes=None):
        self.axes = axes
        return a.transpose(axes)

    def backward(self, g):
        if self.axes is None:
            return g.transpose()
        return g.transpose(tuple(sorted(range(len(self.axes)), key=self.axes.__getitem__)))


def _is_advanced(index):
    parts = index if isinstance(index, tuple) else (index,)
    return any(hasattr(p, "shape") and getattr(p, "ndim", 0) > 0 or isinstance(p, list)
               for p in parts)


class Index(Function):
    """a[index]: basic (slices, ints, None, ...) or integer-array indexing.

    Integer arrays may repeat an element, so backward scatter-adds."""

    def forward(self, a, index):
        self.shape, self.dtype, self.index = a.shape, a.dtype, index
        return a[index]

    def backward(self, g):
        out = xp_of(g).zeros(self.shape, dtype=self.dtype)
        if _is_advanced(self.index):
            scatter_add(out, self.index, g)
        else:
            out[self.index] = g
        return out


class Concatenate(Function):
    def forward(self, *arrays, axis=0):
        self.axis = axis
        self.sizes = [a.shape[axis] for a in arrays]
        return xp_of(*arrays).concatenate(arrays, axis=axis)

    def backward(self, g):
        xp, splits, acc = xp_of(g), [], 0
        for n in self.sizes[:-1]:
            acc += n
            splits.append(acc)
        parts = xp.split(g, splits, axis=self.axis)
        return tuple(p if need else None for p, need in zip(parts, self.needs_input_grad))


class Stack(Function):
    def forward(self, *arrays, axis=0):
        self.axis = axis
        return xp_of(*arrays).stack(arrays, axis=axis)

    def backward(self, g):
        xp = xp_of(g)
        parts = [xp.take(g, i, axis=self.axis) for i in range(g.shape[self.axis])]
        return tuple(p if need else None for p, need in zip(parts, self.needs_input_grad))
