"""``torch.nn.parallel``'s path: ``DataParallel`` is PyTorch's single-process
wrapper (``data_parallel.py``); ``DistributedDataParallel`` is implemented in
``distributed.py`` (PyTorch's file), which sits with the strategies, a layer
above nn: importing nn does not import it. ``import spmdnet`` does (the
strategies re-export it as ``parallel.DataParallel``), so the name resolves
here from the loaded module.
"""
import sys

from .data_parallel import DataParallel

__all__ = ["DistributedDataParallel", "DataParallel"]


def __getattr__(name):
    if name == "DistributedDataParallel":
        return sys.modules[f"{__name__}.distributed"].DistributedDataParallel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
