"""The check behind the table-driven op tests: one row's forward against its
NumPy expression, and its backward against float64 central differences."""
import numpy as np

import spmdnet as sn
from spmdnet.autograd import gradcheck


def check_row(fn, ref, inputs):
    out = fn(*[sn.tensor(a) for a in inputs])
    np.testing.assert_allclose(out.numpy(), ref(*inputs), rtol=1e-12, atol=1e-12)
    gradcheck(fn, *inputs)
