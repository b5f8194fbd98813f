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
import pickle
import struct
import zipfile
import zlib

import numpy as np

from ..dtypes import bfloat16

ALIGNMENT = 64
FILE_VERSION = b"3\n"
# PyTorch's pickle of torch.save(..., _use_new_zipfile_serialization=False)
# (before 1.6) starts with protocol 2 and this magic number as a long.
LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
BFLOAT16 = "bfloat16"  # dtypes.bfloat16 (ml_dtypes'): its storages load as it, bit for bit

# NumPy dtype name <-> torch storage class name; torch dtype names below
STORAGE_OF_DTYPE = {
    "float64": "DoubleStorage", "float32": "FloatStorage", "float16": "HalfStorage",
    "int64": "LongStorage", "int32": "IntStorage", "int16": "ShortStorage",
    "int8": "CharStorage", "uint8": "ByteStorage", "bool": "BoolStorage",
    "complex64": "ComplexFloatStorage", "complex128": "ComplexDoubleStorage",
    BFLOAT16: "BFloat16Storage",
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
    "uint32": "uint32", "uint64": "uint64", BFLOAT16: "bfloat16",
}


def numpy_dtype(storage_dtype_name):
    """The NumPy dtype a storage of this kind loads as."""
    return bfloat16 if storage_dtype_name == BFLOAT16 else np.dtype(storage_dtype_name)


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
CHUNK = 1 << 20  # bytes decompressed per read: a record never inflates past what is asked
DEFLATE_RATIO = 1100  # deflate expands at most ~1032:1; a record claiming more is corrupt


class LoadError(pickle.UnpicklingError, RuntimeError):
    """Why a file cannot be loaded, naming it: PyTorch's ``UnpicklingError``
    (what its weights-only loader raises), and a RuntimeError as PyTorch's
    reader raises for damaged zip archives."""


def refuse(description, reason):
    return LoadError(f"{description}: {reason}")


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
    """The records of a ``torch.save`` zip file, all in one folder, each
    name once, stored or deflated, none reaching past the file. A record is
    read only after its declared size is checked (against what its tensor
    needs and against ``max_bytes`` for the whole load), through a reader
    that inflates at most ``CHUNK`` bytes at a time, so a small file cannot
    make the load allocate more than it declares."""

    def __init__(self, stream, description, max_bytes):
        self.description, self.limit, self.budget = description, max_bytes, max_bytes
        start = stream.tell()
        magic = stream.read(len(LEGACY_MAGIC))
        length = stream.seek(0, os.SEEK_END) - start
        stream.seek(start)
        if magic[:4] != b"PK\x03\x04":
            if magic == LEGACY_MAGIC:
                raise self.refuse(
                    "it is in PyTorch's legacy (pre-1.6, non-zip) torch.save format, which "
                    "spmdnet does not read: re-save it with PyTorch >= 1.6 "
                    "(torch.save(torch.load(path), path))")
            raise self.refuse(f"it is not a torch.save file: not a zip archive (starts with "
                              f"{magic[:8]!r})")
        try:
            self._zip = zipfile.ZipFile(stream)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as e:
            raise self.refuse(f"damaged zip archive ({type(e).__name__}: {e})") from None
        infos = self._zip.infolist()
        self._check_names([info.filename for info in infos])
        for info in infos:
            self._check_record(info, length)
        self._infos = {info.filename: info for info in infos}
        self._read = {}  # storage key -> its bytes as first read (uint8)
        order = self.read("byteorder", limit=16) if "byteorder" in self else b"little"
        if order not in (b"little", b"big"):
            raise self.refuse(f"unknown byteorder record {order[:16]!r}")
        self.byteorder = "<" if order == b"little" else ">"

    def refuse(self, reason):
        return refuse(self.description, reason)

    def _check_names(self, names):
        """One archive folder holding every record, each name once: what
        PyTorch writes, and the only layout every reader reads alike."""
        seen, twice = set(), []
        for name in names:
            if name in seen:
                twice.append(name)
            seen.add(name)
        if twice:
            raise self.refuse(f"the zip archive holds {len(twice)} duplicated record(s) "
                              f"({', '.join(repr(n[:80]) for n in twice[:3])}): which one is "
                              "meant is ambiguous")
        pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
        if not pickles:
            kind = ("a TorchScript archive (torch.jit.save)"
                    if any(n.endswith("/constants.pkl") for n in names) else "not torch.save's")
            raise self.refuse(f"it is a zip file but {kind}: it has no <archive>/data.pkl "
                              "record")
        if len(pickles) > 1:
            raise self.refuse(f"the zip archive holds {len(pickles)} data.pkl records "
                              f"({', '.join(repr(n[:80]) for n in pickles[:3])}): ambiguous")
        self.prefix = pickles[0][:-len("data.pkl")]
        outside = [n for n in names if not n.startswith(self.prefix)]
        if outside:
            raise self.refuse(f"record {outside[0][:80]!r} lies outside the archive's folder "
                              f"{self.prefix!r} (torch.save writes every record inside it)")

    def _check_record(self, info, length):
        name = info.filename[:80]
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise self.refuse(f"record {name!r} uses zip compression method "
                              f"{info.compress_type}: PyTorch's reader, and spmdnet's, read "
                              "stored and deflated records only")
        if info.flag_bits & 0x1:
            raise self.refuse(f"record {name!r} is encrypted")
        if info.header_offset + info.compress_size > length:
            raise self.refuse(f"record {name!r} reaches past the end of the file "
                              f"({info.compress_size} bytes at offset {info.header_offset} "
                              f"of {length}): truncated or damaged")
        stored = info.compress_type == zipfile.ZIP_STORED
        if (stored and info.compress_size != info.file_size) or (
                not stored and info.file_size > DEFLATE_RATIO * info.compress_size + CHUNK):
            raise self.refuse(f"record {name!r} declares {info.file_size} bytes from "
                              f"{info.compress_size} {'stored' if stored else 'deflated'} "
                              "bytes, which that method cannot produce: damaged")

    def __contains__(self, name):
        return self.prefix + name in self._infos

    def _charge(self, nbytes, what):
        if nbytes > self.budget:
            raise self.refuse(
                f"{what} needs {nbytes} bytes more: past the limit of {self.limit} bytes this "
                f"load may read ({self.limit - self.budget} read already). If the file is "
                "trusted, raise it: spmdnet.load(..., max_bytes=N), or SPMDNET_LOAD_MAX_BYTES "
                "(default: the machine's memory)")
        self.budget -= nbytes

    def _read_into(self, info, out):
        """The record's bytes into the uint8 array ``out`` (its declared size)."""
        size, done = out.size, 0
        try:
            with self._zip.open(info) as record:
                while done < size:
                    chunk = record.read(min(CHUNK, size - done))
                    if not chunk:
                        break
                    out[done:done + len(chunk)] = np.frombuffer(chunk, np.uint8)
                    done += len(chunk)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError, zlib.error) as e:
            raise self.refuse(f"record {info.filename[:80]!r} is damaged "
                              f"({type(e).__name__}: {e})") from None
        if done != size:
            raise self.refuse(f"record {info.filename[:80]!r} ends after {done} of its "
                              f"{size} bytes: truncated")

    def read(self, name, limit):
        """A small record's bytes (at most ``limit``)."""
        info = self._infos.get(self.prefix + name)
        if info is None:
            raise self.refuse(f"it has no record {name!r}")
        if info.file_size > limit:
            raise self.refuse(f"record {name!r} declares {info.file_size} bytes, more than "
                              f"the {limit} it can hold")
        self._charge(info.file_size, f"record {name!r}")
        out = np.empty(info.file_size, np.uint8)
        self._read_into(info, out)
        return out.tobytes()

    def storage(self, key, storage_dtype_name, numel):
        """The storage ``data/<key>`` as a writable native NumPy array of
        ``numel`` elements (bfloat16: its bits, viewed as dtypes.bfloat16). Its record must hold
        exactly ``numel`` elements, as PyTorch checks; a key named again with
        another dtype (a ``view(dtype)`` saved beside its base) reads the
        same bytes."""
        info = self._infos.get(f"{self.prefix}data/{key}")
        if info is None:
            raise self.refuse(f"it has no storage record data/{key[:80]!r}")
        stored = numpy_dtype(storage_dtype_name)
        if info.file_size != numel * stored.itemsize:
            raise self.refuse(
                f"storage record data/{key[:80]} holds {info.file_size} bytes, but its "
                f"tensors need {numel} {storage_dtype_name} elements of {stored.itemsize} "
                f"bytes = {numel * stored.itemsize}")
        raw = self._read.get(key)
        if raw is None:
            self._charge(info.file_size, f"storage data/{key[:80]}")
            typed = np.empty(numel, stored)  # owns its memory: views of it stay shared
            raw = typed.view(np.uint8)
            self._read_into(info, raw)
            self._read[key] = raw
        if stored == bfloat16:  # no byte order of its own: its 16 bits as uint16
            bits = raw.view(np.dtype(np.uint16).newbyteorder(self.byteorder))
            return (bits if bits.dtype.isnative else bits.astype(np.uint16)).view(bfloat16)
        array = raw.view(stored.newbyteorder(self.byteorder))
        if not array.dtype.isnative:
            array = array.astype(stored)  # native order, its own memory
        return array
