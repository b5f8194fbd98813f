"""Activation ops beyond ``unary.py``'s: silu, leaky_relu, elu, softplus,
hardtanh (and relu6, hardtanh on [0, 6]), with PyTorch's formulas and its
derivatives at the kinks."""
from ..autograd import Function
from ..backend import xp_of


def _sigmoid(x):
    return 0.5 * (1 + xp_of(x).tanh(0.5 * x))  # never overflows, unlike 1 / (1 + exp(-x))


class SiLU(Function):
    """x·σ(x); derivative σ(x)·(1 + x·(1 - σ(x)))."""

    def forward(self, x):
        self.x, self.sig = x, _sigmoid(x)
        return x * self.sig

    def backward(self, g):
        return g * (self.sig * (1 + self.x * (1 - self.sig)))


class LeakyReLU(Function):
    """x where x > 0, else negative_slope·x (the slope's side at 0)."""

    def forward(self, x, negative_slope=0.01):
        self.positive, self.slope = x > 0, negative_slope
        return xp_of(x).where(self.positive, x, x * negative_slope)

    def backward(self, g):
        return xp_of(g).where(self.positive, g, g * self.slope)


class ELU(Function):
    """x where x > 0, else alpha·(exp(x) - 1); derivative out + alpha there."""

    def forward(self, x, alpha=1.0):
        xp = xp_of(x)
        self.positive, self.alpha = x > 0, alpha
        self.out = xp.where(self.positive, x, alpha * xp.expm1(xp.minimum(x, 0)))
        return self.out

    def backward(self, g):
        return xp_of(g).where(self.positive, g, g * (self.out + self.alpha))


class Softplus(Function):
    """log(1 + exp(beta·x))/beta, and x itself where beta·x > threshold."""

    def forward(self, x, beta=1.0, threshold=20.0):
        xp = xp_of(x)
        self.bx, self.threshold = x * beta, threshold
        return xp.where(self.bx > threshold, x, xp.logaddexp(0, self.bx) / beta)

    def backward(self, g):
        return xp_of(g).where(self.bx > self.threshold, g, g * _sigmoid(self.bx))


class Hardtanh(Function):
    """x clipped to [min_val, max_val]; the derivative passes only strictly
    inside (0 at either end, unlike clamp's), and passes NaN's."""

    def forward(self, x, min_val=-1.0, max_val=1.0):
        self.outside = (x <= min_val) | (x >= max_val)
        return xp_of(x).clip(x, min_val, max_val)

    def backward(self, g):
        return xp_of(g).where(self.outside, 0, g)


def silu(input, inplace=False):
    return SiLU.apply(input)


def leaky_relu(input, negative_slope=0.01, inplace=False):
    return LeakyReLU.apply(input, negative_slope=negative_slope)


def elu(input, alpha=1.0, inplace=False):
    return ELU.apply(input, alpha=alpha)


def softplus(input, beta=1.0, threshold=20.0):
    return Softplus.apply(input, beta=beta, threshold=threshold)


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    """input clipped to [min_val, max_val]. ``inplace=True`` computes out of
    place, as ``relu``'s (use the result; docs/PYTORCH.md)."""
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val ({min_val}) cannot be greater than max_val "
                         f"({max_val})")
    return Hardtanh.apply(input, min_val=min_val, max_val=max_val)


def relu6(input, inplace=False):
    """hardtanh on [0, 6]; ``inplace=True`` as hardtanh's."""
    return Hardtanh.apply(input, min_val=0.0, max_val=6.0)
