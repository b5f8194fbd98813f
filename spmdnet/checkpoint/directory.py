"""A rotating checkpoint directory: ``ckpt-<step>.h5`` files, the file
``latest`` naming the newest complete one, the newest ``keep`` kept (and the
newest one this process loaded cleanly, so a resume never loses its base),
a resume that skips a newest file that does not verify (on any rank, every
rank's part of a sharded file, chosen alike by all ranks) but stops at an
intact one of another layout, and a probe of the directory before training
starts.
"""
import os
from pathlib import Path

from .. import distributed as dist
from ..errors import CheckpointError
from . import files, h5format
from .resharding import LayoutMismatch

LATEST = "latest"
loaded_cleanly = {}  # checkpoint directory -> the newest file this process loaded


def target(path, step):
    """(file to write, checkpoint directory or None): a path that is a
    directory or ends with a separator names a rotating directory."""
    if str(path).endswith(os.sep) or Path(path).is_dir():
        return Path(path) / f"ckpt-{int(step):08d}.h5", Path(path)
    return Path(path), None


def point_latest(directory, name):
    """Make ``latest`` name the checkpoint ``name``, atomically."""
    files.write_atomically(directory / LATEST, (name + "\n").encode())


def remember_loaded(path):
    """Pin ``path`` against rotation: it loaded cleanly, a resume may need it."""
    loaded_cleanly[str(Path(path).parent.resolve())] = Path(path).name


def rotate(directory, keep, keep_also):
    """Keep the ``keep`` newest checkpoints, ``keep_also`` (the one just
    written) and the newest one this process loaded cleanly."""
    if keep is None or keep < 1:
        return
    pinned = {keep_also, loaded_cleanly.get(str(directory.resolve()))}
    for old in sorted(directory.glob("ckpt-*.h5"))[:-keep]:
        if old.name not in pinned:
            old.unlink()


def candidates(directory):
    """Checkpoints newest first: the one ``latest`` names, then the others."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = sorted(directory.glob("ckpt-*.h5"), reverse=True)
    try:
        named = directory / (directory / LATEST).read_text().strip()
    except OSError:
        return found
    if named not in found:
        return found
    return [named] + [p for p in found if p != named]


def newest_verified(directory, allow_nonfinite=False):
    """(path, ``h5format.read``'s result) of the newest checkpoint that
    verifies, every rank's part of a sharded one included, or (None, None);
    each newer one that fails is named with its reason in a warning on rank 0.
    One process's view: ``agreed_newest`` is the collective choice."""
    for candidate in candidates(directory):
        try:
            return candidate, h5format.read_every_part(candidate, allow_nonfinite)
        except CheckpointError as exc:
            if dist.rank_label() in (0, "?"):
                dist.get_logger().warning(f"skipping checkpoint {candidate}: {exc}")
    return None, None


def agreed_newest(directory, comm, rank=None, allow_nonfinite=False):
    """The newest checkpoint of ``directory`` that verifies on every rank of
    ``comm`` (collective): each rank reads its own part (``rank``, as
    ``h5format.read`` takes it; None: the whole unsharded state), the ranks
    agree on each candidate in turn, and the same one is chosen everywhere.
    Returns (path or None, this rank's ``h5format.read`` result, [skipped:
    "file: rank r: reason"]); rank 0 logs each skipped file. A damaged file
    (on any rank) is skipped; an intact one of another tensor/pipeline layout
    is not damage: LayoutMismatch on every rank, never a fall back to an
    older file. DistributedError when the ranks see different files (a
    directory not shared by all ranks)."""
    names = dist.check_same(comm, [str(p) for p in candidates(directory)],
                            f"the checkpoints in {directory}")
    skipped = []
    for name in names:
        try:
            contents, reason = h5format.read(name, rank, allow_nonfinite), None
        except LayoutMismatch as exc:
            contents, reason = None, ("layout", str(exc))
        except CheckpointError as exc:
            contents, reason = None, ("damaged", str(exc))
        with dist.guarded("allgather(checkpoint verified)", comm):
            reasons = comm.allgather(reason)
        mismatch = next((why for why in reasons if why is not None and why[0] == "layout"), None)
        if mismatch is not None:
            raise LayoutMismatch(f"{mismatch[1]}. Checkpoint directory {directory}: to start "
                                 "a new run instead, use another directory (or move its "
                                 "checkpoints away)")
        failed = [f"rank {r}: {why[1]}" for r, why in enumerate(reasons) if why is not None]
        if not failed:
            return Path(name), contents, skipped
        skipped.append(f"{name}: " + "; ".join(failed))
        if comm.Get_rank() == 0:
            dist.get_logger().warning("skipping checkpoint %s", skipped[-1])
    return None, None, skipped


def latest_checkpoint(directory, verify=True, allow_nonfinite=False):
    """The newest checkpoint in ``directory`` that is complete and verifies
    (checksums and finite values, as ``load_checkpoint`` checks), or None.
    Newer ones that fail (truncated, corrupt, NaN) are skipped with a warning
    on rank 0 naming each and why, so one bad file never blocks a resume.
    ``verify=False``: the newest by name, unread."""
    if verify:
        found = newest_verified(directory, allow_nonfinite)[0]
    else:
        found = next(iter(candidates(directory)), None)
    return None if found is None else str(found)


def check_checkpoint_dir(path, comm=None):
    """Fail before the first step, not at the first save: rank 0 (the rank
    that writes checkpoints) creates ``path`` if needed, then creates, fsyncs
    and removes a probe file in it. A file in its place, a read-only or
    uncreatable directory raises CheckpointError naming the path and the
    reason on every rank of ``comm`` (collectively). Returns the path."""
    comm = dist.comm_or_default(comm)
    reason = files.probe(Path(path)) if comm.Get_rank() == 0 else None
    with dist.guarded("bcast(checkpoint directory probe)", comm):
        reason = comm.bcast(reason, root=0)
    if reason is not None:
        raise CheckpointError(f"checkpoint directory {path} is not usable on rank 0: {reason}")
    return str(path)
