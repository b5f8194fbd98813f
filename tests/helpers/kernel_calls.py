"""Counting which kernels a dispatch row hands out (tests of the policy)."""
from spmdnet.kernels import dispatch


def count_steps(monkeypatch, op, steps):
    """Wrap ``dispatch.TABLE[op]``'s kernels for ``steps`` so that each call is
    counted; returns the live {step: calls} dict."""
    calls = dict.fromkeys(steps, 0)
    row = dispatch.TABLE[op].kernels
    for step in calls:
        kernel = row[step]

        def counted(*args, _kernel=kernel, _step=step, **kwargs):
            calls[_step] += 1
            return _kernel(*args, **kwargs)
        monkeypatch.setitem(row, step, counted)
    return calls
