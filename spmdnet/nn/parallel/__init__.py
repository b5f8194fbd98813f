"""``torch.nn.parallel``'s path: ``DataParallel`` is PyTorch's single-process
wrapper (``data_parallel.py``); ``DistributedDataParallel`` is spmdnet's data
parallelism (``spmdnet.parallel.data_parallel``, also at PyTorch's path
``nn.parallel.distributed``), with the strategies a layer above nn: importing
nn does not import it, ``import spmdnet`` does, and the name resolves here
from the loaded module.
"""
import sys

from .data_parallel import DataParallel

__all__ = ["DistributedDataParallel", "DataParallel"]


def __getattr__(name):
    if name == "DistributedDataParallel":
        return sys.modules["spmdnet.parallel.data_parallel"].DistributedDataParallel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
