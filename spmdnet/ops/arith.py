"""Elementwise arithmetic with broadcasting: add, sub, mul, div, neg, pow."""
from ..backend import xp_of
from ..autograd import Function
from ._util import unbroadcast


class Add(Function):
    def forward(self, a, b):
        self.shapes = a.shape, b.shape
        return a + b

    def backward(self, g):
        need_a, need_b = self.needs_input_grad
        return (unbroadcast(g, self.shapes[0]) if need_a else None,
                unbroadcast(g, self.shapes[1]) if need_b else None)


class Sub(Function):
    def forward(self, a, b):
        self.shapes = a.shape, b.shape
        return a - b

    def backward(self, g):
        need_a, need_b = self.needs_input_grad
        return (unbroadcast(g, self.shapes[0]) if need_a else None,
                unbroadcast(-g, self.shapes[1]) if need_b else None)


class Mul(Function):
    def forward(self, a, b):
        self.a, self.b = a, b
        return a * b

    def backward(self, g):
        need_a, need_b = self.needs_input_grad
        return (unbroadcast(g * self.b, self.a.shape) if need_a else None,
                unbroadcast(g * self.a, self.b.shape) if need_b else None)


class Div(Function):
    def forward(self, a, b):
        self.a, self.b = a, b
        return a / b

    def backward(self, g):
        need_a, need_b = self.needs_input_grad
        ga = g / self.b
        return (unbroadcast(ga, self.a.shape) if need_a else None,
                unbroadcast(-ga * self.a / self.b, self.b.shape) if need_b else None)


class Neg(Function):
    def forward(self, a):
        return -a

    def backward(self, g):
        return -g


class Pow(Function):
    """a ** b; a constant exponent is a tensor that needs no gradient."""

    def forward(self, a, b):
        self.a, self.b = a, b
        self.out = a ** b
        return self.out

    def backward(self, g):
        need_a, need_b = self.needs_input_grad
        ga = gb = None
        if need_a:
            ga = unbroadcast(g * self.b * self.a ** (self.b - 1), self.a.shape)
        if need_b:
            xp = xp_of(self.a)
            log_a = xp.log(xp.where(self.a > 0, self.a, 1))  # 0 ** b has no b-gradient
            gb = unbroadcast(g * self.out * log_a, self.b.shape)
        return ga, gb
