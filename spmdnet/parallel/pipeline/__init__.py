"""Pipeline parallelism: ``Pipeline`` (GPipe's schedule, ``gpipe``) and
``bubble_fraction``, the idle share of its schedule."""
from .gpipe import Pipeline, RecvActivation, SendActivation, bubble_fraction

__all__ = ["Pipeline", "RecvActivation", "SendActivation", "bubble_fraction"]
