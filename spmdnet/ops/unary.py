"""Elementwise functions: exp, log, sqrt, tanh, sigmoid, relu, gelu."""
import math

from ..backend import xp_of
from ..kernels import erf
from ..tensor import Function


class Exp(Function):
    def forward(self, a):
        self.out = xp_of(a).exp(a)
        return self.out

    def backward(self, g):
        return g * self.out


class Log(Function):
    def forward(self, a):
        self.a = a
        return xp_of(a).log(a)

    def backward(self, g):
        return g / self.a


class Sqrt(Function):
    def forward(self, a):
        self.out = xp_of(a).sqrt(a)
        return self.out

    def backward(self, g):
        return g / (2 * self.out)


class Tanh(Function):
    def forward(self, a):
        self.out = xp_of(a).tanh(a)
        return self.out

    def backward(self, g):
        return g * (1 - self.out * self.out)


class Sigmoid(Function):
    def forward(self, a):
        xp = xp_of(a)
        # 0.5 * (1 + tanh(a/2)) never overflows, unlike 1 / (1 + exp(-a))
        self.out = 0.5 * (1 + xp.tanh(0.5 * a))
        return self.out

    def backward(self, g):
        return g * self.out * (1 - self.out)


class ReLU(Function):
    def forward(self, a):
        self.out = xp_of(a).maximum(a, 0)
        return self.out

    def backward(self, g):
        return g * (self.out > 0)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


class GELU(Function):
    """x·Φ(x), exact (erf) or PyTorch's tanh approximation."""

    def forward(self, a, approximate="none"):
        xp = xp_of(a)
        self.a, self.approximate = a, approximate
        if approximate == "tanh":
            self.t = xp.tanh(_SQRT_2_OVER_PI * (a + 0.044715 * a ** 3))
            return 0.5 * a * (1 + self.t)
        self.cdf = 0.5 * (1 + erf(a * _INV_SQRT_2))
        return a * self.cdf

    def backward(self, g):
        xp, a = xp_of(self.a), self.a
        if self.approximate == "tanh":
            dt = (1 - self.t * self.t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * a * a)
            return g * (0.5 * (1 + self.t) + 0.5 * a * dt)
        pdf = _INV_SQRT_2PI * xp.exp(-0.5 * a * a)
        return g * (self.cdf + a * pdf)
