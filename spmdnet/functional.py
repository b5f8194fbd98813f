"""``import spmdnet.functional as F``: a second name for the functional API,
whose home is PyTorch's path ``spmdnet.nn.functional``.

This file replaces its own entry in ``sys.modules`` with that module (the
importer returns and binds whatever ``sys.modules`` holds after the file
runs), so both paths give one module object and
``spmdnet.functional is spmdnet.nn.functional``.
"""
import sys

from .nn import functional

sys.modules[__name__] = functional
