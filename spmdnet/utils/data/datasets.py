"""Datasets written as HDF5 files: the UCI handwritten digits kept in the
package, MNIST / Fashion-MNIST IDX files, the CIFAR-10 batches (binary and
python versions), synthetic data of any size, and character-level token files of a
text (``make_text``: the shipped corpus by default).

Images are stored ``(N, C, H, W)`` (``layout="image"``, the default of the
MNIST and CIFAR writers) or flattened to ``(N, C*H*W)`` (``layout="flat"``,
the default of ``make_digits``, whose callers are MLPs).

Files are written by rank 0 to a temporary name and renamed into place
(a crash never leaves a half-written file under the final name); the other
ranks wait at a barrier. Every file holds ``x`` (float32, scaled to [0, 1])
and ``y`` (int64 labels).
"""
import gzip
import importlib
import io
import json
import os
import pickle
from pathlib import Path

import numpy as np

from ... import distributed as dist
from .tokens import CORPUS, CharTokenizer

DIGITS_NPZ = Path(__file__).with_name("digits.npz")


def write_hdf5(path, x, y, comm=None, chunk_rows=None):
    """Write ``x`` and ``y`` to ``path`` atomically (rank 0), then barrier."""
    comm = dist.comm_or_default(comm)
    if comm.Get_rank() == 0:
        _write_atomically(path, lambda f: _fill(f, x, y, chunk_rows))
    dist.comm_barrier(comm)
    return str(path)


def _fill(f, x, y, chunk_rows):
    chunks = (min(len(x), chunk_rows),) + x.shape[1:] if chunk_rows and len(x) else None
    f.create_dataset("x", data=x, chunks=chunks)
    f.create_dataset("y", data=y)


def _write_atomically(path, fill):
    import h5py  # noqa: PLC0415 - 0.1 s to import: on first write only
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with h5py.File(tmp, "w") as f:
            fill(f)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def digits(layout="flat"):
    """The 1,797 8x8 UCI optical-recognition digits: x (n, 64), or (n, 1, 8, 8)
    with ``layout="image"``, in [0, 1]; y."""
    with np.load(DIGITS_NPZ) as d:
        x = d["images"].astype(np.float32) / 16.0
        return _layout(x[:, None], layout), d["labels"].astype(np.int64)


def _layout(x, layout):
    """(N, C, H, W) images as stored: unchanged ("image") or flattened ("flat")."""
    if layout == "image":
        return x
    if layout == "flat":
        return x.reshape(len(x), -1)
    raise ValueError(f"layout must be 'image' or 'flat', got {layout!r}")


def split(x, y, test_fraction, seed):
    """A seeded random train/test split."""
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def make_digits(out_dir, test_fraction=0.2, seed=0, comm=None, layout="flat"):
    """digits_train.h5 and digits_test.h5 in ``out_dir`` (digits_images_*.h5
    with ``layout="image"``); returns both paths."""
    (xtr, ytr), (xte, yte) = split(*digits(layout), test_fraction, seed)
    out, name = Path(out_dir), "digits" if layout == "flat" else "digits_images"
    return (write_hdf5(out / f"{name}_train.h5", xtr, ytr, comm),
            write_hdf5(out / f"{name}_test.h5", xte, yte, comm))


def read_idx(path):
    """An array from an IDX file (MNIST / Fashion-MNIST format), gzipped or not."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (EOFError, gzip.BadGzipFile) as exc:
        raise ValueError(f"{path}: cannot decompress ({exc}; truncated?)") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path} is not an IDX file (bad magic number {raw[:4]!r})")
    dtype = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4",
             0x0E: ">f8"}.get(raw[2])
    if dtype is None:
        raise ValueError(f"{path}: unknown IDX element type 0x{raw[2]:02x}")
    ndim, header = raw[3], 4 + 4 * raw[3]
    if len(raw) < header:
        raise ValueError(f"{path}: the IDX header of a {ndim}-d array needs {header} bytes "
                         f"but the file holds {len(raw)} (truncated?)")
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    expected = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if len(raw) - header != expected:
        raise ValueError(f"{path}: header says shape {shape} ({expected} bytes of data) but "
                         f"the file holds {len(raw) - header} bytes after the header "
                         "(truncated?)")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)


def make_mnist(images, labels, out_path, comm=None, layout="image"):
    """An HDF5 file from MNIST or Fashion-MNIST IDX images (N, H, W) and
    labels: x (N, 1, H, W) in [0, 1] (``layout="flat"``: (N, H*W)); returns its path."""
    x = read_idx(images)
    y = read_idx(labels).astype(np.int64)
    if len(x) != len(y):
        raise ValueError(f"{images} has {len(x)} images but {labels} has {len(y)} labels")
    if x.ndim != 3:
        raise ValueError(f"{images} holds a {x.ndim}-d array of shape {x.shape}, not "
                         "(N, H, W) images")
    x = _layout(x[:, None].astype(np.float32) / 255.0, layout)
    return write_hdf5(out_path, x, y, comm)


make_fashion_mnist = make_mnist  # the same IDX format, 28x28 grey images


# -- CIFAR-10 -----------------------------------------------------------------------------
CIFAR_SHAPE = (3, 32, 32)
_CIFAR_RECORD = 1 + 3 * 32 * 32  # the binary version: a label byte, then R, G, B planes


def read_cifar10_bin(path):
    """x uint8 (N, 3, 32, 32) and y int64 from a binary CIFAR-10 batch
    (``data_batch_N.bin``: records of 1 label byte + 3072 pixel bytes)."""
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % _CIFAR_RECORD:
        raise ValueError(f"{path}: {raw.size} bytes is not a whole number of "
                         f"{_CIFAR_RECORD}-byte CIFAR-10 records (truncated?)")
    records = raw.reshape(-1, _CIFAR_RECORD)
    return records[:, 1:].reshape((-1,) + CIFAR_SHAPE), records[:, 0].astype(np.int64)


# The only globals a pickled NumPy array needs (NumPy 1 names and NumPy 2 names).
_NUMPY_GLOBALS = {
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
}


class RestrictedUnpickler(pickle.Unpickler):
    """Loads dicts, lists, tuples, bytes, str, numbers and NumPy arrays only:
    every global a pickle names is refused except NumPy's array
    reconstruction functions, so a pickle cannot call ``os.system`` or build
    arbitrary objects."""

    def find_class(self, module, name):
        if (module, name) == ("_codecs", "encode"):  # bytes in a protocol-2 pickle of Python 3
            return _latin1_bytes
        if (module, name) not in _NUMPY_GLOBALS:
            raise pickle.UnpicklingError(
                f"refusing to load global {module}.{name}: only dicts, lists, bytes, str, "
                "numbers and NumPy arrays are allowed")
        if hasattr(np, "_core"):  # NumPy 2 renamed numpy.core (still importable, deprecated)
            module = module.replace("numpy.core.", "numpy._core.")
        return getattr(importlib.import_module(module), name)


def _latin1_bytes(text, encoding):
    """``_codecs.encode`` as protocol-2 pickles use it, for bytes only."""
    if not isinstance(text, str) or encoding != "latin1":
        raise pickle.UnpicklingError(f"refusing _codecs.encode({type(text).__name__}, "
                                     f"{encoding!r}): only latin1 bytes are allowed")
    return text.encode("latin1")


def restricted_load(data):
    """``pickle.loads`` through ``RestrictedUnpickler`` (bytes keys and strings
    kept as bytes, as Python 2 pickles such as CIFAR-10's need)."""
    return RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load()


def read_cifar10_pickle(path):
    """x uint8 (N, 3, 32, 32) and y int64 from a python-version CIFAR-10 batch
    (a pickled dict with b"data" (N, 3072) and b"labels"), read through
    ``RestrictedUnpickler``."""
    try:
        d = restricted_load(Path(path).read_bytes())
    except pickle.UnpicklingError as exc:
        raise ValueError(f"{path}: {exc}") from exc
    if not isinstance(d, dict) or b"data" not in d or b"labels" not in d:
        raise ValueError(f"{path} is not a CIFAR-10 python batch: expected a dict with "
                         f"b'data' and b'labels', got {type(d).__name__}")
    x, y = np.asarray(d[b"data"], dtype=np.uint8), np.asarray(d[b"labels"], dtype=np.int64)
    if x.ndim != 2 or x.shape[1] != np.prod(CIFAR_SHAPE) or len(x) != len(y):
        raise ValueError(f"{path}: b'data' of shape {x.shape} and {len(y)} labels are not "
                         f"N rows of {np.prod(CIFAR_SHAPE)} pixels and N labels")
    return x.reshape((-1,) + CIFAR_SHAPE), y


def read_cifar10(path):
    """A CIFAR-10 batch of either version: ``*.bin`` binary, otherwise pickled."""
    return (read_cifar10_bin if str(path).endswith(".bin") else read_cifar10_pickle)(path)


def make_cifar10(batches, out_path, comm=None, layout="image"):
    """An HDF5 file from CIFAR-10 batch files (one path or a list, e.g. the
    five ``data_batch_N[.bin]``; or ``test_batch[.bin]``): x float32
    (N, 3, 32, 32) in [0, 1] (``layout="flat"``: (N, 3072)), y int64; returns its path."""
    comm = dist.comm_or_default(comm)
    batches = [batches] if isinstance(batches, (str, os.PathLike)) else list(batches)
    if comm.Get_rank() == 0:
        parts = [read_cifar10(p) for p in batches]
        x = _layout(np.concatenate([p[0] for p in parts]).astype(np.float32) / 255.0, layout)
        _write_atomically(out_path, lambda f: _fill(f, x, np.concatenate([p[1] for p in parts]),
                                                    None))
    dist.comm_barrier(comm)
    return str(out_path)


def synthetic(n, features=784, classes=10, seed=0):
    """A learnable problem: Gaussian clusters around class centres. The
    centres depend only on (features, classes) and ``seed`` picks the samples,
    so a train and a test set written with different seeds hold the same
    problem."""
    rng = np.random.default_rng(seed)
    return _draw(rng, _centres(features, classes), n)


def _centres(features, classes):
    rng = np.random.default_rng([features, classes])
    return rng.standard_normal((classes, features)).astype(np.float32)


def _draw(rng, centres, n):
    y = rng.integers(0, len(centres), n)
    x = centres[y] + rng.standard_normal((n, centres.shape[1]), dtype=np.float32) * 2.0
    return x, y.astype(np.int64)


def make_synthetic(out_path, n, features=784, classes=10, seed=0, comm=None):
    """A synthetic HDF5 file of any size, generated and written 16,384 rows at a
    time (for n <= 16,384 exactly ``synthetic(n, ...)``); ``x`` is
    stored contiguous, the fastest layout for shuffled reads."""
    comm = dist.comm_or_default(comm)
    rows = 16384

    def fill(f):
        xs = f.create_dataset("x", (n, features), np.float32)
        ys = f.create_dataset("y", (n,), np.int64)
        rng, centres = np.random.default_rng(seed), _centres(features, classes)
        for start in range(0, n, rows):
            x, y = _draw(rng, centres, min(rows, n - start))
            xs[start:start + len(x)], ys[start:start + len(y)] = x, y

    if comm.Get_rank() == 0:
        _write_atomically(out_path, fill)
    dist.comm_barrier(comm)
    return str(out_path)


def read_text(path_or_text=None):
    """The text of a file (a ``Path``, or a str naming an existing file),
    ``path_or_text`` itself (any other str), or the shipped corpus (None)."""
    if path_or_text is None:
        path_or_text = CORPUS
    if isinstance(path_or_text, os.PathLike) or os.path.isfile(path_or_text):
        return Path(path_or_text).read_text(encoding="utf-8")
    if "\n" not in path_or_text and path_or_text.endswith(".txt"):
        raise FileNotFoundError(f"text file {path_or_text} does not exist")
    return path_or_text


def make_text(path_or_text=None, out_dir="data", val_fraction=0.1, name="text", comm=None):
    """Character-level token files of a text (see ``read_text``; default: the
    shipped corpus): ``{name}_train.h5`` (the first ``1 - val_fraction``) and
    ``{name}_val.h5`` (the rest), each a 1-D ``tokens`` dataset, and the
    vocabulary ``{name}_vocab.json`` (``CharTokenizer.state_dict()``).
    Returns the three paths."""
    comm = dist.comm_or_default(comm)
    if not 0 < val_fraction < 1:
        raise ValueError(f"make_text: val_fraction must be in (0, 1), got {val_fraction}")
    out = Path(out_dir)
    paths = out / f"{name}_train.h5", out / f"{name}_val.h5", out / f"{name}_vocab.json"
    if comm.Get_rank() == 0:
        text = read_text(path_or_text)
        tok = CharTokenizer(text)
        ids = tok.encode(text).astype(np.uint16 if tok.vocab_size <= 2**16 else np.int32)
        cut = len(ids) - max(1, int(round(len(ids) * val_fraction)))
        for path, part in zip(paths, (ids[:cut], ids[cut:])):
            _write_atomically(path, lambda f, part=part: f.create_dataset("tokens", data=part))
        out.mkdir(parents=True, exist_ok=True)
        tmp = paths[2].with_name(f".{paths[2].name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(tok.state_dict()), encoding="utf-8")
        os.replace(tmp, paths[2])
    dist.comm_barrier(comm)
    return tuple(str(p) for p in paths)
