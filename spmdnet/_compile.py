"""``spmdnet.compile(model)``: PyTorch's ``torch.compile`` returns an
optimized module; spmdnet has no graph compiler (its kernels are compiled
ahead, see kernels/), so it returns ``model`` itself, unchanged, and accepts
PyTorch's arguments so programs that call it run as written."""


def compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor",  # noqa: A001
            mode=None, options=None, disable=False):
    """``model`` itself; ``spmdnet.compile()`` with no model is a decorator
    factory, as PyTorch's (``@spmdnet.compile(mode=...)``)."""
    if model is None:
        return lambda fn: fn
    return model
