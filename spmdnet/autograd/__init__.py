"""Automatic differentiation, as ``torch.autograd``: the ``Function`` base
class, the backward engine, grad mode and ``gradcheck``.

Reading order: ``function.py`` (how an op records the graph), ``engine.py``
(how ``backward()`` walks it), ``grad_mode.py``, ``finite_differences.py``
(``gradcheck``: no module shares its name with a package attribute).
"""
from .engine import backward, queue_callback
from .function import Function
from .finite_differences import gradcheck
from .grad_mode import (enable_grad, inference_mode, is_grad_enabled,
                        is_inference_mode_enabled, no_grad)

__all__ = ["Function", "backward", "queue_callback", "gradcheck", "no_grad",
           "enable_grad", "is_grad_enabled", "inference_mode", "is_inference_mode_enabled"]
