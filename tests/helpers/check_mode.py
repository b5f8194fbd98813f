"""The collective check mode (``SPMDNET_DEBUG_COLLECTIVES=1``) switched on
for one test, shared by the MPI tests of check-mode reports."""
import contextlib

from spmdnet import dist
from spmdnet.distributed import guard


@contextlib.contextmanager
def collective_check_mode(monkeypatch):
    """Check mode on inside the block, off after it; ``guard.configure``
    re-reads the environment both times so that later tests run unchecked."""
    dist.init()
    monkeypatch.setenv("SPMDNET_DEBUG_COLLECTIVES", "1")
    guard.configure()
    try:
        yield
    finally:
        monkeypatch.delenv("SPMDNET_DEBUG_COLLECTIVES")
        guard.configure()
