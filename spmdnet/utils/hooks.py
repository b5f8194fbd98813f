"""PyTorch's ``torch.utils.hooks``: ``RemovableHandle``, what every
``register_*_hook`` returns, and ``BackwardHook``, which gives a module's
full backward hooks their ``grad_input`` and ``grad_output``. Both are
implemented with ``nn.Module``'s hooks (``spmdnet/nn/modules/_hooks.py``,
``_backward.py``), the layer that uses them; this is their public path.
"""
from ..nn.modules._backward import BackwardHook
from ..nn.modules._hooks import RemovableHandle

__all__ = ["RemovableHandle", "BackwardHook"]
