"""Whether operations record a graph (``no_grad``, ``enable_grad``).
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
