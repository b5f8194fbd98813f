"""Automatic differentiation, as ``torch.autograd``: the ``Function`` base
class, the backward engine, grad mode and ``gradcheck``.

Reading order: ``function.py`` (how an op records the graph), ``engine.py``
(how ``backward()`` walks it), ``grad_mode.py``, ``gradcheck.py``.
"""
from .engine import backward, queue_callback
from .function import Function
from .gradcheck import gradcheck
from .grad_mode import enable_grad, is_grad_enabled, no_grad

__all__ = ["Function", "backward", "queue_callback", "gradcheck", "no_grad",
           "enable_grad", "is_grad_enabled"]
