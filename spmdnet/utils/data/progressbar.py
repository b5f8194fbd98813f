"""A progress bar for a training loop, on one rank and on terminals only."""
import sys

from ... import distributed as dist


def progress(iterable, desc=None):
    """``iterable`` with a tqdm bar when tqdm is installed (``pip install
    'spmdnet[progress]'``), stdout is a terminal and this is rank 0 (or MPI
    is not initialised: a serial run); else ``iterable`` itself, so that a
    log in a file or a pipe (a Slurm job) holds only the program's own lines.
    The bar is removed when the loop ends: ``desc`` names what it counts.

        for x, y in data.progress(loader, f"epoch {epoch}"): ...
    """
    if not sys.stdout.isatty() or (dist.is_initialized() and not dist.is_root()):
        return iterable
    try:
        from tqdm import tqdm  # noqa: PLC0415 - optional dependency
    except ImportError:
        return iterable
    return tqdm(iterable, desc=desc, leave=False, file=sys.stdout)
