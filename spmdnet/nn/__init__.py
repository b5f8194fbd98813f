"""Modules and layers (``spmdnet.nn``), PyTorch's names and state_dict keys.

The layers live in ``nn.modules`` (PyTorch's files), ``nn.Parameter`` in
``nn/parameter.py``, the functional API in ``nn/functional.py`` and
``nn.DataParallel`` in ``nn/parallel/data_parallel.py``: PyTorch's paths.
"""
from . import functional, init, modules, parallel, utils
from .modules import *  # noqa: F403 - PyTorch's nn re-exports every layer of nn.modules
from .modules import __all__ as _modules_all
from .parallel import DataParallel
from .parameter import Parameter

__all__ = [*_modules_all, "Parameter", "DataParallel", "functional", "init", "modules",
           "parallel", "utils"]
__all__ += ["SyncBatchNorm"]  # noqa: F405 - a lazy attribute, __getattr__ below


def __getattr__(name):
    """``nn.SyncBatchNorm`` (PyTorch's path): the layer reduces over MPI, so it
    lives with the strategies (``spmdnet.parallel.sync_batchnorm``, a layer
    above nn); it is imported at first use, so importing nn never imports them."""
    if name == "SyncBatchNorm":
        from ..parallel.sync_batchnorm import SyncBatchNorm  # noqa: PLC0415 - layer 8, lazily
        return SyncBatchNorm
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
