"""``spmdnet.data``: an alias of ``spmdnet.utils.data``, the data package's
home (PyTorch's ``torch.utils.data`` path). Every name and every submodule
is the same object there: ``spmdnet.data.DataLoader is
spmdnet.utils.data.DataLoader``, and ``import spmdnet.data.hdf5`` gives
``spmdnet.utils.data.hdf5`` (one implementation, two paths)."""
import importlib
import pkgutil
import sys

from ..utils import data as _home

__all__ = list(_home.__all__)
globals().update({name: getattr(_home, name) for name in __all__})

# submodules: registered under this package's name too, so that
# ``from spmdnet.data.hdf5 import ...`` finds the one module, never a copy
for _info in pkgutil.iter_modules(_home.__path__):
    _module = importlib.import_module(f"{_home.__name__}.{_info.name}")
    sys.modules[f"{__name__}.{_info.name}"] = _module
    globals()[_info.name] = _module
del _info, _module
