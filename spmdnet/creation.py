"""Tensor creation with PyTorch's signatures: ``tensor``, ``zeros``,
``ones``, ``full``, ``empty``, ``arange``, ``linspace``, ``eye``, ``rand``,
``randn``, ``randint``, ``randperm`` and the ``*_like`` forms.

Sizes are ``*size`` or one tuple; every function takes ``dtype=``,
``device=`` (``"cpu"``, ``"gpu"``; ``"cuda"`` is the GPU) and
``requires_grad=``. Floating results take the default dtype
(``sn.set_default_dtype``), integer ``arange`` and ``randint`` are int64,
as PyTorch. Random draws on the CPU are PyTorch's (``spmdnet.random``).
"""
import math

import numpy as np

from ._args import resolve_device, resolve_dtype, scalar_dtype, shape_arg
from ._device import meta_array
from ._tensor import Tensor, _as_array, get_default_dtype
from .backend import require_cupy, to_device
from . import random as sn_random
from .random import distributions, generator_for


class _Meta:
    """The array namespace of the meta device: NumPy's creation calls that
    make a ``MetaArray`` of the shape and dtype they would give, computing
    and drawing nothing."""

    @staticmethod
    def empty(shape, dtype):
        return meta_array(shape, dtype)

    zeros = ones = empty

    @staticmethod
    def full(shape, fill_value, dtype):
        return meta_array(shape, dtype)

    @staticmethod
    def arange(start, end, step, dtype):
        return meta_array(max(0, math.ceil((end - start) / step)), dtype)

    @staticmethod
    def linspace(start, end, steps, dtype):
        return meta_array(steps, dtype)

    @staticmethod
    def eye(n, m, dtype):
        return meta_array((n, m), dtype)


def _xp(device):
    where = resolve_device(device)
    return require_cupy() if where == "gpu" else _Meta if where == "meta" else np


def _placed(arr, device):
    """``arr`` moved to ``device`` (None: left where it is); on meta, a
    placeholder of its shape and dtype."""
    if device == "meta":
        return meta_array(arr.shape, arr.dtype)
    return arr if device is None else to_device(arr, device)


def _dtype(dtype, default):
    """``dtype`` resolved, or ``default`` when None (a dtype is never used as
    a truth value: ``bool(np.dtype("f4"))`` is False)."""
    return default if dtype is None else resolve_dtype(dtype)


def _float(dtype):
    return _dtype(dtype, get_default_dtype())


def _new(array, requires_grad):
    return Tensor(array, requires_grad=requires_grad)


def tensor(data, dtype=None, device=None, requires_grad=False, pin_memory=False):
    """A new leaf tensor holding a copy of ``data`` (list, scalar, NumPy or
    CuPy array, or Tensor). Arrays keep their dtype (and device, unless
    ``device`` is given); floating lists and scalars take the default dtype,
    integer ones int64."""
    arr = _as_array(data, resolve_dtype(dtype))
    if arr is data or (isinstance(data, Tensor) and arr is data.array):
        arr = arr.copy()
    return _new(_placed(arr, resolve_device(device)), requires_grad)


def as_tensor(data, dtype=None, device=None):
    """A tensor sharing ``data``'s memory when no conversion is needed."""
    if isinstance(data, Tensor) and dtype is None and device is None:
        return data
    arr = _as_array(data, resolve_dtype(dtype))
    return Tensor(_placed(arr, resolve_device(device)))


def from_numpy(array):
    """A tensor sharing ``array``'s memory."""
    return Tensor(array)


def is_tensor(obj):
    return isinstance(obj, Tensor)


def zeros(*size, dtype=None, device=None, requires_grad=False):
    return _new(_xp(device).zeros(shape_arg(size), _float(dtype)), requires_grad)


def ones(*size, dtype=None, device=None, requires_grad=False):
    return _new(_xp(device).ones(shape_arg(size), _float(dtype)), requires_grad)


def empty(*size, dtype=None, device=None, requires_grad=False):
    """Uninitialised memory, as PyTorch (read nothing before writing)."""
    return _new(_xp(device).empty(shape_arg(size), _float(dtype)), requires_grad)


def full(size, fill_value, dtype=None, device=None, requires_grad=False):
    dtype = _dtype(dtype, scalar_dtype(fill_value, get_default_dtype()))  # as PyTorch
    return _new(_xp(device).full(shape_arg((size,)), fill_value, dtype), requires_grad)


def _like(input, dtype, device):  # noqa: A002 - PyTorch's argument name
    return (_dtype(dtype, input.dtype),
            _xp(device if device is not None else input.device))


def zeros_like(input, dtype=None, device=None, requires_grad=False):  # noqa: A002
    dtype, xp = _like(input, dtype, device)
    return _new(xp.zeros(input.shape, dtype), requires_grad)


def ones_like(input, dtype=None, device=None, requires_grad=False):  # noqa: A002
    dtype, xp = _like(input, dtype, device)
    return _new(xp.ones(input.shape, dtype), requires_grad)


def empty_like(input, dtype=None, device=None, requires_grad=False):  # noqa: A002
    dtype, xp = _like(input, dtype, device)
    return _new(xp.empty(input.shape, dtype), requires_grad)


def full_like(input, fill_value, dtype=None, device=None, requires_grad=False):  # noqa: A002
    dtype, xp = _like(input, dtype, device)
    return _new(xp.full(input.shape, fill_value, dtype), requires_grad)


def _number(x):
    return x.item() if isinstance(x, Tensor) else x


def arange(start=0, end=None, step=1, dtype=None, device=None, requires_grad=False):
    """``start, start+step, ...`` below ``end``; ``arange(n)`` is ``0..n-1``.
    int64 when every bound is an integer, else the default float dtype."""
    start, end, step = _number(start), _number(end), _number(step)
    if end is None:
        start, end = 0, start
    if step == 0:
        raise RuntimeError("step must be nonzero")
    integral = all(isinstance(v, (int, np.integer)) for v in (start, end, step))
    dtype = _dtype(dtype, np.dtype(np.int64) if integral else get_default_dtype())
    xp = _xp(device)
    values = xp.arange(start, end, step, dtype=np.int64 if integral else np.float64)
    return _new(values.astype(dtype, copy=False), requires_grad)


def linspace(start, end, steps, dtype=None, device=None, requires_grad=False):
    """``steps`` evenly spaced values from ``start`` to ``end`` inclusive."""
    values = _xp(device).linspace(_number(start), _number(end), int(steps), dtype=np.float64)
    return _new(values.astype(_float(dtype)), requires_grad)


def eye(n, m=None, dtype=None, device=None, requires_grad=False):
    return _new(_xp(device).eye(n, n if m is None else m, dtype=_float(dtype)), requires_grad)


def _host_generator(device, generator, where):
    """The ``Generator`` a host draw takes, or None when ``device`` is a GPU
    (CuPy's generator draws there)."""
    if _xp(device) is not np:  # the meta device draws nothing: callers branch before
        if generator is not None:
            raise ValueError(f"{where}: a generator= draws PyTorch's CPU stream; on device "
                             f"{device!r} spmdnet draws from CuPy's generator (leave it None)")
        return None
    return sn_random.resolve(generator, where)


def _floating_draw(kind, size, generator, dtype, device, requires_grad):
    """``rand`` (kind "uniform") or ``randn`` ("normal") as PyTorch fills a
    new tensor; complex dtypes fill the interleaved real and imaginary parts
    (a normal's parts with variance 1/2)."""
    dtype, shape = _float(dtype), shape_arg(size)
    if _xp(device) is _Meta:  # PyTorch's meta kernels draw nothing
        return _new(meta_array(shape, dtype), requires_grad)
    g = _host_generator(device, generator, "rand" if kind == "uniform" else "randn")
    if g is None:
        rng = generator_for(_xp(device))
        method = rng.random if kind == "uniform" else rng.standard_normal
        native = dtype if dtype in (np.float32, np.float64) else np.dtype(np.float32)
        return _new(method(shape, dtype=native).astype(dtype, copy=False), requires_grad)
    draw_dtype, draw_shape = dtype, shape
    if dtype.kind == "c":
        draw_dtype, draw_shape = np.dtype(np.float32 if dtype == np.complex64 else np.float64), \
            shape + (2,)
    if kind == "uniform":
        out = distributions.uniform(g, draw_shape, 0.0, 1.0, draw_dtype)
    else:
        std = math.sqrt(0.5) if dtype.kind == "c" else 1.0
        out = distributions.normal(g, draw_shape, 0.0, std, draw_dtype)
    if dtype.kind == "c":
        out = np.ascontiguousarray(out).view(dtype).reshape(shape)
    return _new(out, requires_grad)


def rand(*size, generator=None, dtype=None, device=None, requires_grad=False):
    """Uniform on [0, 1): PyTorch's draws after the same seed (on the CPU)."""
    return _floating_draw("uniform", size, generator, dtype, device, requires_grad)


def randn(*size, generator=None, dtype=None, device=None, requires_grad=False):
    """Standard normal: PyTorch's draws after the same seed (on the CPU)."""
    return _floating_draw("normal", size, generator, dtype, device, requires_grad)


def rand_like(input, dtype=None, device=None, requires_grad=False):  # noqa: A002
    return rand(input.shape, dtype=_dtype(dtype, input.dtype),
                device=device or input.device, requires_grad=requires_grad)


def randn_like(input, dtype=None, device=None, requires_grad=False):  # noqa: A002
    return randn(input.shape, dtype=_dtype(dtype, input.dtype),
                 device=device or input.device, requires_grad=requires_grad)


def randint(*args, size=None, low=None, high=None, generator=None, dtype=None, device=None,
            requires_grad=False):
    """Integers in ``[low, high)`` (``low`` defaults to 0), PyTorch's
    ``randint(high, size)`` / ``randint(low, high, size)``; int64."""
    args = list(args)
    if size is None and args and isinstance(args[-1], (tuple, list)):
        size = args.pop()
    if size is None:
        raise TypeError("randint() missing required argument 'size' (a tuple)")
    bounds = args + [v for v in (low, high) if v is not None]
    if len(bounds) == 1:
        bounds = [0] + bounds
    if len(bounds) != 2:
        raise TypeError(f"randint() takes (high, size) or (low, high, size), got {len(args)} "
                        "positional bounds")
    low, high = (int(_number(b)) for b in bounds)
    if low >= high:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got "
                           f"from={low} >= to={high}")
    if _xp(device) is _Meta:
        return _new(meta_array(shape_arg((size,)), _dtype(dtype, np.int64)), requires_grad)
    g = _host_generator(device, generator, "randint")
    if g is None:
        out = generator_for(_xp(device)).integers(low, high, size=shape_arg((size,)))
    else:
        out = distributions.random_from_to(g, shape_arg((size,)), low, high)
    return _new(out.astype(_dtype(dtype, np.int64), copy=False), requires_grad)


def randperm(n, generator=None, dtype=None, device=None, requires_grad=False):
    """A random permutation of ``0..n-1`` (int64), drawn on the host as
    PyTorch's CPU ``randperm``."""
    device = resolve_device(device)
    if device == "meta":
        return _new(meta_array(int(n), _dtype(dtype, np.int64)), requires_grad)
    g = sn_random.resolve(generator, "randperm")
    out = distributions.randperm(g, int(n)).astype(_dtype(dtype, np.int64))
    return _new(out if device in (None, "cpu") else to_device(out, device), requires_grad)
