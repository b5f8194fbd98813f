"""PyTorch's import path for the functional API: ``import
spmdnet.nn.functional as F`` binds ``spmdnet.functional`` itself.

This file replaces its own entry in ``sys.modules`` with that module (an
import system feature: the importer returns and binds whatever
``sys.modules`` holds after the file runs), so both paths give one module
object and ``spmdnet.nn.functional is spmdnet.functional``.
"""
import sys

from .. import functional

sys.modules[__name__] = functional
