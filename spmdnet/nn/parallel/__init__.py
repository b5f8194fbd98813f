"""``torch.nn.parallel``'s path: ``DataParallel`` is PyTorch's single-process
wrapper (``data_parallel.py``); ``DistributedDataParallel`` is spmdnet's data
parallelism, at PyTorch's ``distributed.py``. That module sits with the
strategies, a layer above nn, so this package does not import it: ``import
spmdnet`` loads it, and the name resolves here from the loaded submodule.
"""
import sys

from .data_parallel import DataParallel

__all__ = ["DistributedDataParallel", "DataParallel"]


def __getattr__(name):
    if name == "DistributedDataParallel":
        loaded = sys.modules.get(f"{__name__}.distributed")
        if loaded is None:
            raise AttributeError(f"{__name__}.DistributedDataParallel: import spmdnet first "
                                 "(it loads spmdnet.nn.parallel.distributed)")
        return loaded.DistributedDataParallel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *__all__})
