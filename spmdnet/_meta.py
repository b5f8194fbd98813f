"""The arrays of PyTorch's meta device: a shape and a dtype, no data.

A ``MetaArray`` is a read-only broadcast of one zero (no memory however large
the shape). NumPy on it gives meta results with NumPy's shape and dtype
rules, as PyTorch's meta kernels give shape-only results:

- ufuncs (elementwise, ``matmul``, ``reduce``/``accumulate``/``outer``) are
  evaluated from the shapes and from the ufunc on 0-d zeros of the operands'
  dtypes: no work however large the operands;
- other NumPy functions run on zero-stride dummies (``np.broadcast_to`` of a
  zero) and their result is kept as shape and dtype only: views cost
  nothing, functions that build a new array (``concatenate``, ``einsum``,
  ``pad``...) cost what they cost on real data once;
- functions whose result shape depends on the values (``nonzero``,
  ``unique``, boolean indexing...) raise NotImplementedError, as PyTorch's;
- writes into a meta array (``arr[...] = v``, ``copyto``, an ufunc's
  ``out=``) do nothing, as PyTorch's meta kernels of in-place ops;
- meta values written into a real array: inside an op run on meta tensors
  (into a buffer its forward made) the placeholder's zeros; outside, as
  PyTorch's CPU tensors: ``+=``, ``-=``, ``*=``, ``/=`` check shapes and
  dtypes and change nothing, ``copyto`` raises NotImplementedError, other
  ``out=`` RuntimeError, naming both devices and shapes;
- reading a value out (``item``, ``float``, ``bool``, ``tolist``) raises
  NotImplementedError, except inside an op run on meta tensors
  (``reading_placeholders``, autograd/meta.py), where argument checks that
  look at values see the placeholder zero: the op's result is a shape only.

A leaf (imports only NumPy): ``_device`` re-exports it.
"""
import contextlib
import threading

import numpy as np

_reading = threading.local()  # .depth: ops on meta tensors now running in this thread

DATA_DEPENDENT = {np.nonzero, np.flatnonzero, np.argwhere, np.unique, np.compress,
                  np.extract, np.bincount, np.histogram, np.trim_zeros, np.unique_all,
                  np.unique_counts, np.unique_inverse, np.unique_values, np.intersect1d,
                  np.union1d, np.setdiff1d, np.setxor1d}
METADATA = {np.shape, np.ndim, np.size, np.result_type, np.iscomplexobj, np.isrealobj,
            np.may_share_memory, np.shares_memory, np.min_scalar_type}
WRITES_FIRST = {np.copyto, np.put_along_axis, np.put, np.place, np.putmask,
                np.fill_diagonal}


@contextlib.contextmanager
def reading_placeholders():
    """Inside: a value read from a meta array is its placeholder zero (an
    op's argument checks run; its result stays shape-only)."""
    _reading.depth = getattr(_reading, "depth", 0) + 1
    try:
        yield
    finally:
        _reading.depth -= 1


def _no_data(op):
    return (f"{op} on a tensor of the 'meta' device: it has a shape and a dtype but no data; "
            "give it storage first (Module.to_empty(device=...) then reset_parameters() or "
            "load_state_dict, or create the tensor on 'cpu'/'cuda')")


def _read(name):
    if not getattr(_reading, "depth", 0):
        raise NotImplementedError(_no_data(name))


class MetaArray(np.ndarray):
    """The array of a meta tensor (see the module docstring); its type is
    the mark ``Tensor.device`` reads."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return _ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return _function(func, args, kwargs)

    def __getitem__(self, key):
        keys = key if isinstance(key, tuple) else (key,)
        if any(isinstance(k, MetaArray) and k.dtype == np.bool_ for k in keys):
            raise NotImplementedError(_no_data("indexing with a boolean mask") +
                                      ": the result's shape depends on the mask's values")
        key = tuple(dummy(k) for k in keys) if isinstance(key, tuple) else dummy(key)
        return _meta_of(dummy(self)[key])

    def __setitem__(self, key, value):
        """A write into a meta tensor: no data to change."""

    def fill(self, value):
        """``fill_``/``zero_`` of a meta tensor: no data to change."""

    def sort(self, *args, **kwargs):
        """An in-place sort: no data to change."""

    def partition(self, *args, **kwargs):
        """An in-place partition: no data to change."""

    def ravel(self, order="C"):
        return meta_array((self.size,), self.dtype)  # not NumPy's copy of the placeholder

    flatten = ravel

    def astype(self, dtype, *args, **kwargs):
        return meta_array(self.shape, dtype)

    def copy(self, order="C"):
        return meta_array(self.shape, self.dtype)

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):  # copy.deepcopy of a meta model stays shape-only
        return self.copy()

    def item(self, *args):
        _read("item")
        return dummy(self).item(*args)

    def __bool__(self):
        _read("bool")
        return bool(dummy(self))

    def __int__(self):
        _read("int")
        return int(dummy(self))

    def __float__(self):
        _read("float")
        return float(dummy(self))

    def __index__(self):
        _read("index")
        return dummy(self).__index__()

    def tolist(self):
        raise NotImplementedError(_no_data("tolist"))

    def __repr__(self):  # never the placeholder's zeros
        return f"MetaArray(shape={self.shape}, dtype={self.dtype})"

    __str__ = __repr__

    def __reduce__(self):
        raise NotImplementedError(_no_data("pickle"))


def _delegate(name):
    """An ndarray method computed in C from the data, routed through the NumPy
    function of that name (so through ``__array_function__``)."""
    func = getattr(np, name)

    def method(self, *args, **kwargs):
        return func(self, *args, **kwargs)
    method.__name__ = name
    return method


for _name in ("argmax", "argmin", "argsort", "argpartition", "take", "repeat", "dot",
              "searchsorted", "nonzero", "compress", "trace", "diagonal", "cumsum", "cumprod",
              "clip", "round", "choose", "ptp"):
    if hasattr(np, _name):
        setattr(MetaArray, _name, _delegate(_name))


def meta_array(shape, dtype):
    """A ``MetaArray`` of this shape and dtype (zero bytes of storage)."""
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(n) for n in shape)
    if any(n < 0 for n in shape):
        raise RuntimeError(f"Trying to create tensor with negative dimension: {shape}")
    return np.broadcast_to(np.zeros((), dtype), shape).view(MetaArray)


def is_meta_array(a):
    return isinstance(a, MetaArray)


def dummy(x):
    """A meta array as a plain read-only zero-stride array of its shape and
    dtype; anything else (lists and tuples searched) as it is."""
    if isinstance(x, MetaArray):
        return np.broadcast_to(np.zeros((), x.dtype), x.shape)
    if isinstance(x, (list, tuple)) and any(isinstance(v, (MetaArray, list, tuple)) for v in x):
        return type(x)(dummy(v) for v in x)
    return x


def _meta_of(result):
    """A result computed on dummies kept as shape and dtype only."""
    if isinstance(result, (np.ndarray, np.generic)):
        return meta_array(np.shape(result), result.dtype)
    if isinstance(result, (list, tuple)):
        return type(result)(_meta_of(r) for r in result)
    return result


def _zero_of(x):
    """A 0-d zero of an array operand's dtype; Python numbers stay (NumPy's
    weak scalars decide the result dtype as on real data)."""
    return np.zeros((), x.dtype) if isinstance(x, np.ndarray) else x


def _on_dummies(fn, args, kwargs):
    with np.errstate(all="ignore"):
        return fn(*[dummy(a) for a in args], **{k: dummy(v) for k, v in kwargs.items()})


def _ufunc(ufunc, method, inputs, kwargs):
    out = kwargs.get("out") or ()
    if out and all(isinstance(o, MetaArray) for o in out):
        return out[0] if len(out) == 1 else out  # an in-place op on meta: nothing to do
    if method == "at":
        return None if isinstance(inputs[0], MetaArray) else \
            _on_dummies(ufunc.at, inputs, kwargs)
    if out and getattr(_reading, "depth", 0):
        # into a real buffer a meta op's forward made: zeros, the placeholder's value
        for o in out:
            if o is not None and not isinstance(o, MetaArray):
                np.copyto(o, 0, casting="unsafe")
        return out[0] if len(out) == 1 else out
    if out:
        return _into_real(ufunc, method, inputs, out)
    kw = {k: v for k, v in kwargs.items() if k != "where"}
    with np.errstate(all="ignore"):
        if method == "__call__" and ufunc.signature is None:
            shape = np.broadcast_shapes(*[np.shape(x) for x in inputs])
            probe = ufunc(*[_zero_of(x) for x in inputs], **kw)
        elif method == "__call__" and ufunc is np.matmul:
            shape = _matmul_shape(*[np.shape(x) for x in inputs])
            probe = ufunc(*[np.zeros((1, 1), x.dtype) for x in inputs], **kw)
        elif method in ("reduce", "accumulate"):
            x = inputs[0]
            small = np.zeros(tuple(min(n, 1) for n in x.shape), x.dtype)
            probe = getattr(ufunc, method)(small, **kw)  # NumPy's errors for empty reductions
            shape = x.shape if method == "accumulate" else _reduced_shape(x.shape, kw)
        elif method == "outer":
            shape = np.shape(inputs[0]) + np.shape(inputs[1])
            probe = ufunc.outer(*[_zero_of(x) for x in inputs], **kw)
        else:
            return _meta_of(_on_dummies(getattr(ufunc, method), inputs, kwargs))
    if isinstance(probe, tuple):
        return tuple(meta_array(shape, p.dtype) for p in probe)
    return meta_array(shape, probe.dtype)


# PyTorch's ``add_``/``sub_``/``mul_``/``div_`` of a CPU tensor by a meta one
# check shapes and dtypes and leave the CPU tensor as it was
_ARITHMETIC = {np.add, np.subtract, np.multiply, np.true_divide}


def _shapes(arrays):
    return ", ".join(f"{'meta' if isinstance(a, MetaArray) else 'cpu'} {tuple(np.shape(a))}"
                     for a in arrays if a is not None)


def _into_real(ufunc, method, inputs, out):
    """A ufunc of meta operands writing into a real array outside any meta
    op (``cpu_tensor.add_(meta_tensor)``): as PyTorch, the in-place
    arithmetic checks and changes nothing; anything else raises."""
    if not (method == "__call__" and ufunc in _ARITHMETIC and len(out) == 1
            and out[0] is inputs[0]):
        raise RuntimeError(f"{ufunc.__name__}: a tensor on the 'meta' device cannot be "
                           f"written into one on the 'cpu' device (operands "
                           f"{_shapes(inputs)}; output {_shapes(out)})")
    target = out[0]
    try:
        shape = np.broadcast_shapes(*[np.shape(x) for x in inputs])
    except ValueError:
        shape = None
    if shape != target.shape:
        raise RuntimeError(f"output with shape {list(target.shape)} doesn't match the "
                           f"broadcast shape of {_shapes(inputs)} ({ufunc.__name__})")
    with np.errstate(all="ignore"):
        result = ufunc(*[_zero_of(x) for x in inputs]).dtype
    if not np.can_cast(result, target.dtype, "same_kind"):
        raise RuntimeError(f"{ufunc.__name__}: result type {result} can't be cast to the "
                           f"output's {target.dtype} ({_shapes(inputs)})")
    return target


def _matmul_shape(a, b):
    """``np.matmul``'s result shape, with its ValueError when the inner sizes
    differ."""
    if not a or not b:
        raise ValueError("matmul: Input operand does not have enough dimensions")
    a2, b2 = ((1,) + a if len(a) == 1 else a), (b + (1,) if len(b) == 1 else b)
    if a2[-1] != b2[-2]:
        raise ValueError(f"matmul: Input operand 1 has a mismatch in its core dimension 0, "
                         f"with gufunc signature (n?,k),(k,m?)->(n?,m?) (size {b2[-2]} is "
                         f"different from {a2[-1]})")
    shape = np.broadcast_shapes(a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
    if len(b) == 1:
        shape = shape[:-1]
    if len(a) == 1:
        shape = shape[:-2] + shape[-1:] if len(b) > 1 else shape[:-1]
    return shape


def _reduced_shape(shape, kw):
    axis, keep = kw.get("axis", 0), kw.get("keepdims", False)
    axes = range(len(shape)) if axis is None else \
        (axis,) if isinstance(axis, (int, np.integer)) else axis
    axes = {int(a) % len(shape) if shape else 0 for a in axes}
    if keep:
        return tuple(1 if i in axes else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in axes)


def _function(func, args, kwargs):
    if func in DATA_DEPENDENT or (func is np.repeat and isinstance(
            args[1] if len(args) > 1 else kwargs.get("repeats"), MetaArray)) or (
            func is np.where and len(args) + len(kwargs) == 1):  # where(cond): nonzero
        raise NotImplementedError(_no_data(func.__name__) +
                                  ": the result's shape depends on the values")
    reading = getattr(_reading, "depth", 0)
    if func in WRITES_FIRST:
        if isinstance(args[0] if args else None, MetaArray):
            return None  # a write into a meta tensor: no data to change
        if not reading:  # meta values into a real array: PyTorch's copy_ refuses
            raise NotImplementedError(_no_data(f"{func.__name__} into a 'cpu' array"))
    out = kwargs.get("out")
    outs = out if isinstance(out, tuple) else (out,)
    if not reading and any(o is not None and not isinstance(o, MetaArray) for o in outs):
        raise RuntimeError(f"{func.__name__}: a tensor on the 'meta' device cannot be written "
                           f"into one on the 'cpu' device (output {_shapes(outs)})")
    result = _on_dummies(func, args, kwargs)
    if out is not None and result is out:  # a real buffer a meta op's forward made
        return result
    if isinstance(result, (bool, int, float, complex)) and func not in METADATA:
        _read(func.__name__)  # a number computed from the values
    return _meta_of(result)
