"""``spmdnet.save`` / ``spmdnet.load`` in PyTorch's file format (the zip
archive ``torch.save`` writes), both ways, without PyTorch: saving.py writes,
loading.py reads (by default with _unpickler.py, a pickle interpreter that
runs no code from the file, and _rebuild.py's allow-list), _format.py holds
the layout both share. spmdnet's own sharded HDF5 checkpoints
(``spmdnet.checkpoint``) are a separate format and stay as they are."""
from pickle import UnpicklingError  # noqa: F401 - what a refused global raises, as PyTorch

from ._rebuild import add_safe_globals, clear_safe_globals, get_safe_globals, safe_globals
from .loading import load
from .saving import save

__all__ = ["save", "load", "UnpicklingError", "add_safe_globals", "get_safe_globals",
           "clear_safe_globals", "safe_globals"]
