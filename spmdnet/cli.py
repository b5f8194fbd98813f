"""Helpers for command-line programs such as the examples.

argparse types: a bad value stops the program at parsing, before any MPI
work, with argparse's exit code 2 and a message naming the option
(``argument --epochs: -1 is not a positive integer``)::

    p.add_argument("--epochs", type=cli.positive_int, default=20)

``self_check``: the examples' last step, which CI relies on.
"""
import argparse
import math

from . import distributed as dist


def _checked(kind, test, what):
    """An argparse type: ``kind(text)``, refused unless ``test`` holds."""

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"{text} is not {what}")
        return value

    parse.__name__ = parse.__qualname__ = what.replace(" ", "_")
    return parse


positive_int = _checked(int, lambda v: v > 0, "a positive integer")
non_negative_int = _checked(int, lambda v: v >= 0, "a non-negative integer")
positive_float = _checked(float, lambda v: 0 < v < math.inf, "a positive finite number")
probability = _checked(float, lambda v: 0 <= v <= 1, "a probability in [0, 1]")

__all__ = ["positive_int", "non_negative_int", "positive_float", "probability"]


def self_check(passed, failure, success):
    """Rank 0 prints ``success``, or ``FAILED: failure``; returns the exit
    code (0 or 1). ``passed`` must be the same on every rank (every rank
    exits alike)."""
    dist.print0(success if passed else f"FAILED: {failure}")
    return 0 if passed else 1


def require_steps(loader, dataset, batch_size, ranks):
    """Stop the program (SystemExit naming the numbers) when ``loader`` gives
    no batch in an epoch: a dataset smaller than ranks x batch size with
    ``drop_last`` would otherwise train nothing, print a NaN loss and exit 0
    (PyTorch's DataLoader yields zero batches silently; a training program
    must not). ``len(loader)`` is the same on every rank (the sampler pads or
    drops to equal shares), so every rank stops alike."""
    steps = len(loader)
    if steps == 0:
        raise SystemExit(f"no training step in an epoch: {len(dataset)} samples over {ranks} "
                         f"ranks give {len(dataset) // ranks} per rank, fewer than the batch "
                         f"size {batch_size} (with drop_last); use a smaller --batch-size, "
                         f"fewer ranks or more data")
    return steps
