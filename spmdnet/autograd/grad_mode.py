"""Whether operations record a graph (``no_grad``, ``enable_grad``,
``inference_mode``).
Thread-local, as in PyTorch, so a data-loader thread never switches it for
the training loop.
"""
import threading

_grad_mode = threading.local()


def is_grad_enabled():
    """False inside ``no_grad()``."""
    return getattr(_grad_mode, "enabled", True)


class _GradMode:
    """Context manager (and decorator) switching graph recording."""

    def __init__(self, enabled):
        self.enabled = enabled

    def __enter__(self):
        self.prev = is_grad_enabled()
        _grad_mode.enabled = self.enabled

    def __exit__(self, *exc):
        _grad_mode.enabled = self.prev

    def __call__(self, fn):
        def wrapper(*args, **kwargs):
            with _GradMode(self.enabled):
                return fn(*args, **kwargs)
        wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
        return wrapper


def no_grad():
    """Record no graph inside ``with no_grad():`` (or a decorated function)."""
    return _GradMode(False)


def enable_grad():
    """Record the graph again inside a ``no_grad`` region."""
    return _GradMode(True)


_inference = threading.local()


def is_inference_mode_enabled():
    """True inside ``inference_mode()``."""
    return getattr(_inference, "enabled", False)


class inference_mode(_GradMode):  # noqa: N801 - PyTorch's name
    """PyTorch's ``inference_mode(mode=True)``: a context, a decorator
    (``@inference_mode()``, ``@inference_mode`` or ``@inference_mode(False)``)
    recording no graph while on. Here it is ``no_grad`` plus the flag that
    ``is_inference_mode_enabled()`` reads: tensors made inside are ordinary
    tensors (PyTorch marks them inference tensors and refuses them in a
    later graph)."""

    def __new__(cls, mode=True):
        if callable(mode):  # the bare decorator: @inference_mode
            return cls()(mode)
        return super().__new__(cls)

    def __init__(self, mode=True):
        if not isinstance(mode, bool):
            raise TypeError(f"inference_mode(mode): mode must be a bool, got {mode!r}")
        super().__init__(not mode)
        self.mode = mode

    def __enter__(self):
        super().__enter__()
        self.prev_inference = is_inference_mode_enabled()
        _inference.enabled = self.mode

    def __exit__(self, *exc):
        _inference.enabled = self.prev_inference
        super().__exit__(*exc)

    def __call__(self, fn):
        def wrapper(*args, **kwargs):
            with inference_mode(self.mode):
                return fn(*args, **kwargs)
        wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
        return wrapper
