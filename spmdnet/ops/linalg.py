"""Matrix products: matmul (2-D and batched) and the fused linear layer."""
from ..backend import xp_of
from ..tensor import Function
from ._util import unbroadcast


def _swap(a):
    return a.swapaxes(-1, -2)


def _matmul(a, b, out, shape):
    """a @ b, written into ``out`` when the product has exactly its shape."""
    if out is not None and a.shape[:-1] + b.shape[-1:] == shape and a.ndim == len(shape):
        return xp_of(a).matmul(a, b, out=out)
    return a @ b


class MatMul(Function):
    """a @ b for a, b with ndim >= 2 (batch dims broadcast); the functional
    wrapper lifts 1-D operands to matrices."""

    def forward(self, a, b):
        if a.shape[-1] != b.shape[-2]:
            raise ValueError(f"matmul: shapes {a.shape} and {b.shape} are not aligned "
                             f"({a.shape[-1]} != {b.shape[-2]})")
        self.a, self.b = a, b
        return a @ b

    def backward(self, g):
        need_a, need_b = self.needs_input_grad
        ga = gb = None
        if need_a:
            ga = unbroadcast(_matmul(g, _swap(self.b), self.dest(0), self.a.shape), self.a.shape)
        if need_b:
            gb = unbroadcast(_matmul(_swap(self.a), g, self.dest(1), self.b.shape), self.b.shape)
        return ga, gb


class Linear(Function):
    """x @ weight.T (+ bias), weight (out, in): one op so backward does three
    products and no broadcasting bookkeeping. x may have leading batch dims."""

    def forward(self, x, weight, *bias):
        if x.shape[-1] != weight.shape[1]:
            raise ValueError(f"linear: input shape {x.shape} does not match weight shape "
                             f"{weight.shape} (in_features {weight.shape[1]})")
        self.x, self.weight = x, weight
        out = x @ weight.T
        if bias:
            out += bias[0]
        return out

    def backward(self, g):
        need = self.needs_input_grad
        gx = g @ self.weight if need[0] else None
        g2 = g.reshape(-1, g.shape[-1])
        x2 = self.x.reshape(-1, self.x.shape[-1])
        gw = _matmul(g2.T, x2, self.dest(1), self.weight.shape) if need[1] else None
        if len(need) == 2:
            return gx, gw
        return gx, gw, (g2.sum(axis=0) if need[2] else None)
