"""An HDF5 dataset file changed in place under a running job: the next
read raises OSError naming the file, never a SIGBUS through the memory map
(before, a truncated mapped file killed the process with no file named).
Each case runs in a subprocess, so a signal death fails the test instead of
killing pytest; a file replaced by renaming (the documented way) keeps
being read."""
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from spmdnet.utils.data.datasets import write_hdf5

READER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from spmdnet.utils.data.hdf5 import HDF5Dataset
    path, how, memory_map = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    ds = HDF5Dataset(path, cache=False, memory_map=memory_map)
    assert ds.memory_mapped == (["x", "y"] if memory_map else [])
    first = ds[np.arange(len(ds))][0].copy()  # epoch 1 reads every row
    time.sleep(0.05)  # a later modification time than the open's, on coarse clocks too
    size = os.path.getsize(path)
    if how == "truncate":  # the in-place rewrite that used to kill the reader
        with open(path, "r+b") as f:
            f.truncate(size // 3)
    elif how == "overwrite":  # the same size, other bytes
        with open(path, "r+b") as f:
            f.seek(size // 2)
            f.write(b"\\xff" * (size // 2))
    elif how == "rename":  # the documented way: a new file renamed over the old one
        with open(path, "rb") as f:
            data = f.read()
        with open(path + ".new", "wb") as f:
            f.write(data[:size // 3])
        os.replace(path + ".new", path)
    try:
        again = ds[np.arange(len(ds))][0]  # epoch 2
    except OSError as exc:
        print("ERROR", exc)
        sys.exit(5)
    print("READ", np.array_equal(again, first))
""")


@pytest.fixture
def h5file(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "data.h5"
    write_hdf5(path, rng.standard_normal((2000, 16)).astype(np.float32),
               np.arange(2000) % 10)
    return path


def read_after(path, how, memory_map):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", READER, str(path), how, str(int(memory_map))],
                          capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("memory_map", [True, False], ids=["mmap", "h5py"])
@pytest.mark.parametrize("how", ["truncate", "overwrite"])
def test_a_file_changed_in_place_is_an_error_naming_it(h5file, how, memory_map):
    proc = read_after(h5file, how, memory_map)
    assert proc.returncode != -signal.SIGBUS, "killed by SIGBUS: " + proc.stderr
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert f"HDF5 dataset {h5file} changed on disk" in proc.stdout
    assert "rename it over the old one" in proc.stdout


def test_a_file_renamed_over_keeps_the_old_one_readable(h5file):
    proc = read_after(h5file, "rename", memory_map=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "READ True" in proc.stdout
