import numpy as np
import pytest

import spmdnet as sn


@pytest.fixture
def float64():
    """Run a test with float64 as the default dtype, then restore float32."""
    sn.set_default_dtype(np.float64)
    yield
    sn.set_default_dtype(np.float32)


def pytest_collection_modifyitems(config, items):
    from spmdnet.backend import cupy_available
    if cupy_available():
        return
    skip = pytest.mark.skip(reason="needs CuPy and a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
