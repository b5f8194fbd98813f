"""PyTorch's ``torch.save`` file layout, the parts both directions share.

A file is an uncompressed zip archive whose records all sit in one folder
(``<archive>/``): ``data.pkl`` (the object, pickle protocol 2, each tensor a
call of ``torch._utils._rebuild_tensor_v2`` on a storage named by a
persistent id ``('storage', torch.<Type>Storage, key, location, numel)``),
one record ``data/<key>`` of raw little-endian bytes per storage, aligned to
64 bytes, and small records ``byteorder``, ``version``, ``.format_version``,
``.storage_alignment``. Views of one storage name the same key with their
own offset and strides (in elements), so shared memory stays shared.
"""
import io
import os
import struct
import zipfile

import numpy as np

ALIGNMENT = 64
FILE_VERSION = b"3\n"
# PyTorch's pickle of torch.save(..., _use_new_zipfile_serialization=False)
# (before 1.6) starts with protocol 2 and this magic number as a long.
LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
BFLOAT16 = "bfloat16"  # NumPy has no bfloat16: its storages load widened to float32

# NumPy dtype name <-> torch storage class name; torch dtype names below
STORAGE_OF_DTYPE = {
    "float64": "DoubleStorage", "float32": "FloatStorage", "float16": "HalfStorage",
    "int64": "LongStorage", "int32": "IntStorage", "int16": "ShortStorage",
    "int8": "CharStorage", "uint8": "ByteStorage", "bool": "BoolStorage",
    "complex64": "ComplexFloatStorage", "complex128": "ComplexDoubleStorage",
}
DTYPE_OF_STORAGE = {v: k for k, v in STORAGE_OF_DTYPE.items()}
DTYPE_OF_STORAGE["BFloat16Storage"] = BFLOAT16

# torch.<name> dtype globals -> NumPy dtype name (aliases included)
DTYPE_OF_TORCH_NAME = {
    "float64": "float64", "double": "float64", "float32": "float32", "float": "float32",
    "float16": "float16", "half": "float16", "bfloat16": BFLOAT16,
    "int64": "int64", "long": "int64", "int32": "int32", "int": "int32",
    "int16": "int16", "short": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool",
    "complex64": "complex64", "cfloat": "complex64", "complex128": "complex128",
    "cdouble": "complex128", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
}
TORCH_NAME_OF_DTYPE = {
    "float64": "float64", "float32": "float32", "float16": "float16", "int64": "int64",
    "int32": "int32", "int16": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool",
    "complex64": "complex64", "complex128": "complex128", "uint16": "uint16",
    "uint32": "uint32", "uint64": "uint64",
}


def numpy_dtype(storage_dtype_name):
    """The NumPy dtype a storage of this kind loads as (bfloat16 -> float32)."""
    return np.dtype(np.float32 if storage_dtype_name == BFLOAT16 else storage_dtype_name)


def bfloat16_to_float32(raw):
    """Widen raw bfloat16 bits (uint16) exactly: a bfloat16 is the top half
    of the float32 with the same value."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


# -- writing -------------------------------------------------------------------
class ArchiveWriter:
    """Writes the records of one archive into ``stream`` (seekable, at 0)."""

    def __init__(self, stream, name="archive"):
        self._zip = zipfile.ZipFile(stream, "w", zipfile.ZIP_STORED, allowZip64=True)
        self._stream, self._prefix = stream, f"{name}/"

    def write(self, name, payload):
        """One stored record whose data starts on a 64-byte boundary (PyTorch
        aligns its records so storages can be memory-mapped)."""
        info = zipfile.ZipInfo(self._prefix + name, date_time=(1980, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_STORED
        info.external_attr = 0o600 << 16
        header = 30 + len(info.filename.encode("utf-8")) + 4  # local header + padding field
        if len(payload) > zipfile.ZIP64_LIMIT:
            header += 20  # zipfile adds its zip64 size field to the local header
        pad = (-(self._stream.tell() + header)) % ALIGNMENT
        info.extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad  # PyTorch's padding field id
        self._zip.writestr(info, payload)

    def close(self):
        self._zip.close()


# -- reading -------------------------------------------------------------------
def open_source(f):
    """(seekable binary stream, description, close-when-done) for a path or a
    file object; a non-seekable stream is read into memory first."""
    if isinstance(f, (str, bytes, os.PathLike)):
        path = os.fsdecode(f)
        return open(path, "rb"), path, True  # noqa: SIM115 - closed by the caller
    if not hasattr(f, "read"):
        raise TypeError(f"load() takes a path or a binary file object, got {type(f).__name__}")
    description = getattr(f, "name", None) or f"<{type(f).__name__}>"
    seekable = getattr(f, "seekable", lambda: False)()
    return (f if seekable else io.BytesIO(f.read())), str(description), False


class ArchiveReader:
    """The records of a ``torch.save`` zip file, found by their folder."""

    def __init__(self, stream, description):
        start = stream.tell()
        magic = stream.read(len(LEGACY_MAGIC))
        stream.seek(start)
        if magic[:4] != b"PK\x03\x04":
            if magic == LEGACY_MAGIC:
                raise RuntimeError(
                    f"{description} is in PyTorch's legacy (pre-1.6, non-zip) torch.save "
                    "format, which spmdnet does not read: re-save it with PyTorch >= 1.6 "
                    "(torch.save(torch.load(path), path))")
            raise RuntimeError(f"{description} is not a torch.save file: it is not a zip "
                               f"archive (starts with {magic[:8]!r})")
        self.description = description
        self._zip = zipfile.ZipFile(stream)
        names = self._zip.namelist()
        pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
        if not pickles:
            kind = ("a TorchScript archive (torch.jit.save)"
                    if any(n.endswith("/constants.pkl") for n in names) else "not torch.save's")
            raise RuntimeError(f"{description} is a zip file but {kind}: it has no "
                               "<archive>/data.pkl record")
        self.prefix = pickles[0][:-len("data.pkl")]
        self._names = set(names)
        order = self.read("byteorder") if "byteorder" in self else b"little"
        if order not in (b"little", b"big"):
            raise RuntimeError(f"{description}: unknown byteorder record {order!r}")
        self.byteorder = "<" if order == b"little" else ">"

    def __contains__(self, name):
        return self.prefix + name in self._names

    def read(self, name):
        return self._zip.read(self.prefix + name)

    def storage(self, key, storage_dtype_name, numel):
        """The storage ``data/<key>`` as a writable native NumPy array of
        ``numel`` elements (bfloat16 widened to float32)."""
        if not isinstance(key, str) or f"data/{key}" not in self:
            raise RuntimeError(f"{self.description}: no storage record data/{key!r}")
        raw = self.read(f"data/{key}")
        stored = np.dtype(np.uint16 if storage_dtype_name == BFLOAT16 else storage_dtype_name)
        if numel * stored.itemsize > len(raw):
            raise RuntimeError(f"{self.description}: storage data/{key} holds {len(raw)} "
                               f"bytes, fewer than {numel} {storage_dtype_name} elements")
        array = np.frombuffer(raw, stored.newbyteorder(self.byteorder), count=numel)
        array = array.astype(stored, copy=True)  # native order, writable, owns its memory
        return bfloat16_to_float32(array) if storage_dtype_name == BFLOAT16 else array
