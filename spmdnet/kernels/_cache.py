"""The disk cache of compiled CPU kernels (on by default).

Kernels compiled once are kept in a per-user directory (``cache_dir``) and
loaded by later runs: about 0.1 s instead of seconds of compiling. The
directory's last part names a hash of the kernel sources and the Numba
version: Numba checks only the timestamp of a kernel's own file, so an
upgraded helper (special.py, reduce.py) would otherwise load stale machine
code. Numba writes every cache file under a temporary name and renames it,
so ranks that share the directory never read a half-written file; with
``kernels.warmup(comm=...)`` they also take turns (``compile_in_order``), so
that one rank compiles and the others load.

A damaged file (truncated by a crash or a full disk, or overwritten) would
make Numba die with a bare ``EOFError`` at the kernel's first call, naming no
file, in every later run: ``use()`` checks each cache file's pickle stream
once per process (without loading it), removes damaged ones with a warning
naming them, and their kernels are compiled again.

Knobs (spmdnet/config.py): ``SPMDNET_KERNEL_CACHE=0`` turns the cache off,
``SPMDNET_CACHE_DIR`` moves it.
"""
import hashlib
import os
import pickletools

from .. import config
from ._numba import jit_disabled, numba, warn_once

_FOLDER = os.path.dirname(os.path.abspath(__file__))


def base_dir():
    """``$SPMDNET_CACHE_DIR``, else ``$XDG_CACHE_HOME/spmdnet``, else
    ``~/.cache/spmdnet``."""
    base = config.get("SPMDNET_CACHE_DIR")
    if base is None:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                               ".cache")
        base = os.path.join(xdg, "spmdnet")
    return base


def cache_dir():
    """Where compiled kernels are kept: ``base_dir()/kernels-<sources hash>``."""
    return os.path.join(base_dir(), f"kernels-{_sources_hash()}")


_hash = []


def _sources_hash():
    if not _hash:
        digest = hashlib.sha1(numba.__version__.encode() if numba else b"")
        for name in sorted(os.listdir(_FOLDER)):
            if name.endswith(".py"):
                with open(os.path.join(_FOLDER, name), "rb") as f:
                    digest.update(name.encode() + f.read())
        _hash.append(digest.hexdigest()[:12])
    return _hash[0]


def enabled():
    """True when ``SPMDNET_KERNEL_CACHE`` is on (the default) and kernels are compiled."""
    return config.get_bool("SPMDNET_KERNEL_CACHE", True) and not jit_disabled()


_ready = {}


def use():
    """True when the cache is on and its directory usable; points Numba at
    ``cache_dir()`` then (Numba's own setting: other cached Numba code in the
    process goes there too). A directory that cannot be created warns once
    and compiles without the cache."""
    if not enabled():
        return False
    path = cache_dir()
    if path not in _ready:
        try:
            os.makedirs(path, exist_ok=True)
            if not os.access(path, os.W_OK):
                raise PermissionError("not writable")
            _ready[path] = True
            remove_damaged(path)
        except OSError as exc:
            _ready[path] = False
            warn_once("cache", f"cannot create the kernel cache {path} ({exc}); kernels "
                               "are compiled without it (set SPMDNET_CACHE_DIR)")
    if _ready[path] and numba.config.CACHE_DIR != path:
        numba.config.CACHE_DIR = path
    return _ready[path]


def _whole_pickles(blob, count):
    """True when ``blob`` starts with ``count`` complete pickle streams (an
    index file holds Numba's version, then the index; a data file one
    stream). Walks the opcodes only: nothing in the file is run or built."""
    pos = 0
    try:
        for _ in range(count):
            end = None
            for opcode, _arg, at in pickletools.genops(blob[pos:]):
                end = at
                if opcode.name == "STOP":
                    break
            else:
                return False
            pos += end + 1
    except (ValueError, EOFError, IndexError, KeyError, UnicodeDecodeError):
        return False
    return pos > 0


def remove_damaged(path):
    """Remove the cache files under ``path`` (at any depth) whose pickle streams are not
    whole, warning once per file with its name; returns their paths. A file
    another rank removed first is skipped."""
    removed = []
    files = [os.path.join(folder, name) for folder, _, names in os.walk(path)
             for name in names]  # Numba keeps them a folder down, per source folder
    for file in sorted(files):
        count = {".nbi": 2, ".nbc": 1}.get(os.path.splitext(file)[1])
        if count is None:
            continue
        try:
            with open(file, "rb") as f:
                blob = f.read()
            if _whole_pickles(blob, count):
                continue
            os.remove(file)
        except FileNotFoundError:
            continue
        removed.append(file)
        warn_once(("damaged", file), f"removed the damaged kernel-cache file {file} "
                                     f"({len(blob)} bytes, not a whole cache record: a crash or "
                                     "a full disk while it was written?); its kernel is "
                                     "compiled again")
    return removed
