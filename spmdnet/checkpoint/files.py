"""How a checkpoint reaches the disk: whole-file atomic writes, temporaries,
free space and the writability probe (the other modules decide what to write).

- ``write_atomically`` writes a file image to a temporary, fsyncs it,
  renames it into place and fsyncs the directory: a crash at any moment
  leaves the previous file intact.
- Temporaries are named ``.<name>.tmp-<host>-<pid>``, so their writer can be
  recovered: ``remove_stale_temporaries`` removes those whose writer is dead
  (the same host and no such process) or, for another host (a requeued job
  often runs elsewhere), untouched for ``STALE_TEMP_S``. A live writer on
  this host is never touched.
- ``write_bytes`` writes a whole file image with plain ``os.write`` after
  checking the free space, so a full disk is one ``OSError`` naming the
  bytes needed, never an error inside the HDF5 library (which leaves its
  file state broken and crashed the process at exit).
"""
import contextlib
import errno
import os
import shutil
import socket
import time

STALE_TEMP_S = 3600.0  # another host's temporary untouched this long: its writer is dead
_WRITE_BYTES = 1 << 22  # per os.write: one huge write is slower on a new file
_OURS = (".ckpt-", ".latest.", ".spmdnet-probe.")  # temporaries in a checkpoint directory


# -- temporaries ---------------------------------------------------------------------
def temp_name(target):
    """The temporary to write ``target`` through: ``.<name>.tmp-<host>-<pid>``."""
    return target.with_name(f".{target.name}.tmp-{socket.gethostname()}-{os.getpid()}")


def writer_of(name):
    """(host, pid) of a temporary's writer; host is None for names without one
    (``.<name>.tmp-<pid>``, written before hosts were recorded)."""
    tag = name.rpartition(".tmp-")[2]
    host, _, pid = tag.rpartition("-")
    return (host or None), (int(pid) if pid.isdigit() else None)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def is_stale(path, now=None):
    """Whether the temporary's writer is dead (see the module's notes)."""
    host, pid = writer_of(path.name)
    if host == socket.gethostname() and pid is not None:
        return pid != os.getpid() and not _alive(pid)
    try:
        age = (time.time() if now is None else now) - path.stat().st_mtime
    except FileNotFoundError:
        return False
    return age > STALE_TEMP_S


def remove_stale_temporaries(directory, target_name=None):
    """Remove stale temporaries of this checkpoint directory (of ``target_name``
    only, when given: a checkpoint saved as a single file); returns their names."""
    prefixes = (f".{target_name}.tmp-",) if target_name else _OURS
    removed = []
    for path in sorted(directory.glob(".*.tmp-*")):
        if path.name.startswith(prefixes) and is_stale(path):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


# -- writing -------------------------------------------------------------------------
def describe_bytes(n):
    return f"{n} bytes ({n / 2**20:.1f} MiB)"


def no_space(directory, needed, free=None):
    """The OSError for a checkpoint that does not fit."""
    free = shutil.disk_usage(directory).free if free is None else free
    return OSError(errno.ENOSPC, f"no space left in {directory}: the checkpoint needs "
                                 f"{describe_bytes(needed)}, {describe_bytes(free)} free")


def write_bytes(path, data):
    """Write ``data`` (bytes-like) to ``path`` after checking the free space;
    the caller fsyncs. A full disk or quota raises ``no_space``'s OSError."""
    needed = len(memoryview(data).cast("B"))
    free = shutil.disk_usage(path.parent).free
    if free < needed:
        raise no_space(path.parent, needed, free)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(fd, view[:_WRITE_BYTES]):]
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise no_space(path.parent, needed) from exc
        raise
    finally:
        os.close(fd)


def fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(target, data):
    """Write ``data`` (bytes-like) to ``target`` through a temporary: write,
    fsync, rename into place, fsync the directory. The temporary never
    outlives a failure of this process (a crash leaves it for
    ``remove_stale_temporaries``)."""
    tmp = temp_name(target)
    try:
        write_bytes(tmp, data)
        fsync(tmp)
        os.replace(tmp, target)
        fsync(target.parent)
    finally:
        tmp.unlink(missing_ok=True)


def probe(directory):
    """None when ``directory`` can be created and written (a probe file is
    created, fsynced and removed), else the reason."""
    if directory.exists() and not directory.is_dir():
        return "a file is in its place, not a directory"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create it ({exc})"
    path = temp_name(directory / ".spmdnet-probe")
    try:
        write_bytes(path, b"spmdnet checkpoint directory probe\n")
        fsync(path)
        path.unlink()
        fsync(directory)
    except OSError as exc:
        return f"cannot write in it ({exc})"
    finally:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
    return None
