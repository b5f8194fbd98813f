"""Directories that every rank of an MPI test writes to and reads from:
made once, on rank 0, and the path broadcast (each rank's own tmp_path
differs, see tests/mpi/conftest.py)."""
from mpi4py import MPI

from spmdnet import checkpoint, dist


def shared_directory(tmp_path_factory, name):
    """A fresh directory ``name``-N made on rank 0; its path on every rank."""
    dist.init()
    path = tmp_path_factory.mktemp(name) if dist.rank() == 0 else None
    return MPI.COMM_WORLD.bcast(str(path) if path else None, root=0)


def shared_checkpoint_directory(tmp_path_factory, monkeypatch):
    """A shared directory for checkpoints, with the record of which
    checkpoint loaded cleanly emptied for this test (it spares that one from
    rotation, and an earlier test's record would change what gets kept)."""
    monkeypatch.setattr(checkpoint.directory, "loaded_cleanly", {})
    return shared_directory(tmp_path_factory, "ck")
