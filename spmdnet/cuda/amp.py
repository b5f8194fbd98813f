"""``torch.cuda.amp``: PyTorch's older spelling of ``torch.amp`` with the
device fixed to ``"cuda"`` (see ``spmdnet.amp``)."""
from .. import amp as _amp


def autocast(enabled=True, dtype=None, cache_enabled=True):
    """``spmdnet.amp.autocast("cuda", ...)``."""
    return _amp.autocast("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


def GradScaler(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,  # noqa: N802
               growth_interval=2000, enabled=True):
    """``spmdnet.amp.GradScaler("cuda", ...)``."""
    return _amp.GradScaler("cuda", init_scale=init_scale, growth_factor=growth_factor,
                           backoff_factor=backoff_factor, growth_interval=growth_interval,
                           enabled=enabled)
