"""Complex tensors, as PyTorch's rotary embeddings use them: ``polar``,
``complex``, ``view_as_complex``, ``view_as_real``, ``.real``, ``.imag``,
``conj``, ``angle``; NumPy and CuPy alike (``backend.xp_of``).

Gradients follow PyTorch's convention: for a real loss L, the gradient of a
complex z is dL/dRe z + i dL/dIm z (so |z|² at 1+1j gives 2+2j). A
holomorphic op f then passes ``g * conj(f'(z))`` back (``conj_if_complex``,
used by ``ops/arith.py`` and ``ops/unary.py``), and a real input of a complex
result gets the real part of ``g * conj(dz/dx)``.

``view_as_real``, ``view_as_complex``, ``.real`` and ``.imag`` are views
sharing memory, as PyTorch's; ``conj()`` is a copy (PyTorch's is a lazy
view: writing into it differs).
"""
import numpy as np

from .._tensor import Tensor
from ..autograd import Function
from ..backend import xp_of
from ._util import unbroadcast

_COMPLEX_OF = {np.dtype(np.float32): np.dtype(np.complex64),
               np.dtype(np.float64): np.dtype(np.complex128)}


def conj_if_complex(x):
    """conj(x) for a complex array, x itself for a real one."""
    return x.conj() if x.dtype.kind == "c" else x


def _complex_from_pair(re, im):
    """A fresh complex array re + i·im (re, im: real arrays of one dtype)."""
    out = xp_of(re).empty(np.broadcast_shapes(re.shape, im.shape), _COMPLEX_OF[re.dtype])
    out.real, out.imag = re, im
    return out


class ViewAsReal(Function):
    def forward(self, z):
        xp = xp_of(z)
        real = z.real  # a view with z's strides
        return xp.lib.stride_tricks.as_strided(real, shape=z.shape + (2,),
                                               strides=z.strides + (real.itemsize,))

    def backward(self, g):
        return _complex_from_pair(g[..., 0], g[..., 1])


class ViewAsComplex(Function):
    def forward(self, x):
        return x.view(_COMPLEX_OF[x.dtype])[..., 0]

    def backward(self, g):
        return xp_of(g).stack([g.real, g.imag], axis=-1)


class Real(Function):
    def forward(self, z):
        self.dtype = z.dtype
        return z.real

    def backward(self, g):
        return g.astype(self.dtype)


class Imag(Function):
    def forward(self, z):
        self.dtype = z.dtype
        return z.imag

    def backward(self, g):
        out = xp_of(g).zeros(g.shape, self.dtype)
        out.imag = g
        return out


class Polar(Function):
    """abs·(cos angle + i sin angle), for real abs and angle of one dtype."""

    def forward(self, r, theta):
        xp = xp_of(r, theta)
        self.shapes = r.shape, theta.shape
        self.cos, self.sin = xp.cos(theta), xp.sin(theta)
        self.out = _complex_from_pair(r * self.cos, r * self.sin)
        return self.out

    def backward(self, g):
        need_r, need_theta = self.needs_input_grad
        # dz/dr = e^{iθ}, dz/dθ = i z: the real part of g·conj(dz/dx)
        gr = g.real * self.cos + g.imag * self.sin if need_r else None
        gt = g.imag * self.out.real - g.real * self.out.imag if need_theta else None
        return (None if gr is None else unbroadcast(gr, self.shapes[0]),
                None if gt is None else unbroadcast(gt, self.shapes[1]))


class Complex(Function):
    def forward(self, re, im):
        self.shapes = re.shape, im.shape
        return _complex_from_pair(re, im)

    def backward(self, g):
        need_re, need_im = self.needs_input_grad
        return (unbroadcast(g.real.copy(), self.shapes[0]) if need_re else None,
                unbroadcast(g.imag.copy(), self.shapes[1]) if need_im else None)


class Conj(Function):
    def forward(self, z):
        return z.conj()

    def backward(self, g):
        return g.conj()


class Angle(Function):
    """The argument of z (for a real x: 0, or π where x < 0, no gradient)."""

    def forward(self, z):
        self.z = z
        xp = xp_of(z)
        return xp.angle(z) if z.dtype.kind == "c" else xp.where(z < 0, np.pi, 0).astype(z.dtype)

    def backward(self, g):
        xp, z = xp_of(g), self.z
        if z.dtype.kind != "c":
            return xp.zeros_like(g)
        norm = (z * z.conj()).real
        return xp.where(norm == 0, 0, g * 1j * z / xp.where(norm == 0, 1, norm))


def _floating_pair(name, a, b):
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
        raise TypeError(f"{name}(): expected two Tensors, got {type(a).__name__} and "
                        f"{type(b).__name__}")
    if a.dtype != b.dtype or a.dtype not in _COMPLEX_OF:
        raise RuntimeError(f"{name}(): expected both inputs to be float32 or float64 of one "
                           f"dtype, got {a.dtype} and {b.dtype}")


def polar(abs, angle):  # noqa: A002 - PyTorch's argument name
    """The complex tensor abs·(cos angle + i·sin angle) (torch.polar)."""
    _floating_pair("polar", abs, angle)
    return Polar.apply(abs, angle)


def complex(real, imag):  # noqa: A001 - PyTorch's name
    """The complex tensor real + i·imag (torch.complex)."""
    _floating_pair("complex", real, imag)
    return Complex.apply(real, imag)


def view_as_real(input):  # noqa: A002
    """A real view of complex ``input`` with a last dim of 2 (real, imag)."""
    if input.dtype.kind != "c":
        raise RuntimeError(f"view_as_real is only supported for complex tensors, got "
                           f"{input.dtype}")
    return ViewAsReal.apply(input)


def view_as_complex(input):  # noqa: A002
    """A complex view of real ``input`` (float32/float64) whose last dim is
    2 (real, imag) with stride 1 and other strides even, as PyTorch checks."""
    if input.dtype not in _COMPLEX_OF:
        raise RuntimeError(f"view_as_complex is only supported for float32 and float64 "
                           f"tensors, but got a tensor of scalar type: {input.dtype}")
    if input.ndim == 0 or input.shape[-1] != 2:
        raise RuntimeError(f"Tensor must have a last dimension of size 2, got shape "
                           f"{input.shape}")
    item = input.dtype.itemsize
    strides = input.array.strides
    if strides[-1] != item:
        raise RuntimeError("Tensor must have a last dimension with stride 1")
    if any(s % (2 * item) for s in strides[:-1]):
        raise RuntimeError("Tensor must have a stride divisible by 2 for all but last "
                           f"dimension (strides in elements: {[s // item for s in strides]})")
    return ViewAsComplex.apply(input)


def real(self):
    """``.real``: a view of the real part (the tensor itself when real, as PyTorch)."""
    return Real.apply(self) if self.dtype.kind == "c" else self


def imag(self):
    """``.imag``: a view of the imaginary part (complex tensors only, as PyTorch)."""
    if self.dtype.kind != "c":
        raise RuntimeError("imag is not implemented for tensors with non-complex dtypes.")
    return Imag.apply(self)


def conj(input):  # noqa: A002
    """The complex conjugate (a copy; a real tensor itself, as PyTorch)."""
    return Conj.apply(input) if input.dtype.kind == "c" else input


def angle(input):  # noqa: A002
    return Angle.apply(input)


def is_complex(self):
    return self.dtype.kind == "c"


METHODS = {"real": property(real), "imag": property(imag), "conj": conj,
           "resolve_conj": lambda self: self, "angle": angle, "is_complex": is_complex}
