import numpy as np
import pytest

from spmdnet.backend import cupy_available
from tests.helpers.oracles import default_dtype


@pytest.fixture
def float64():
    """float64 as the default dtype for one test (finite differences, oracles
    compared to 1e-10 and tighter), the previous default afterwards."""
    with default_dtype(np.float64):
        yield


def pytest_collection_modifyitems(config, items):
    if cupy_available():
        return
    skip = pytest.mark.skip(reason="needs CuPy and a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
