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
