"""``torch.backends.cudnn`` flags with PyTorch's defaults. spmdnet has no
cuDNN: the flags are stored for programs that set them and read them back,
and ``is_available()`` is False."""
enabled = True
benchmark = False
deterministic = False
allow_tf32 = True


def is_available():
    """False: spmdnet does not use cuDNN."""
    return False


def version():
    """None, as PyTorch's answer when cuDNN is not available."""
    return None
