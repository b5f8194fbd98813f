"""Parameter: a leaf tensor that a Module registers and optimizers update."""
from .._device import builds_on_meta, meta_array
from .._tensor import Tensor, _as_array


class Parameter(Tensor):
    """A tensor that requires grad and is registered when set on a Module.

    Optimizers update ``.array`` in place, so views onto it (flat buffers of
    data parallelism) stay valid: never rebind ``.data`` of a live parameter
    (FSDP and ZeRO refuse it for the parameters whose storage they own).
    """

    __slots__ = ()

    def __init__(self, data, requires_grad=True):
        array = _as_array(data)
        if builds_on_meta() and not isinstance(data, Tensor):
            array = meta_array(array.shape, array.dtype)  # a layer's new array, on meta
        super().__init__(array, requires_grad=requires_grad)

    def __repr__(self):  # PyTorch's: the tensor's own text under a heading
        return "Parameter containing:\n" + Tensor.__repr__(self)


def grad_array(t):
    """The array holding ``t``'s gradient (``.grad`` is a Tensor; this is its
    ``.array``), or None. Clipping and ``Module.to`` read gradients through it."""
    return None if t.grad is None else t.grad.array
