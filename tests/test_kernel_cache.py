"""The kernel disk cache (on by default), warm-up, and compiling in rank order.

Tests that fill a cache point it at a temporary directory (a subprocess with
``SPMDNET_CACHE_DIR``), so they neither read nor write the user's cache.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import spmdnet as sn
from spmdnet import dist, kernels
from spmdnet.kernels import compile_order
from spmdnet.kernels import _cache, _numba

PLAIN_PYTHON = _numba.jit_disabled()


def test_warmup_compiles_and_reports_seconds():
    seconds = kernels.warmup([np.float32])
    assert seconds >= 0 and kernels.compile_seconds() >= 0
    assert kernels.warmup([np.float32]) < max(seconds, 0.5)  # compiled already
    with kernels.use("xp"):
        assert kernels.warmup([np.float32]) == 0.0


class FakeComm:
    """mpi4py-like communicator of one rank, recording the barriers."""

    def __init__(self, rank, gathered):
        self.rank, self.size, self.gathered, self.barriers = rank, len(gathered), gathered, 0

    def Get_rank(self):  # noqa: N802 - mpi4py's names
        return self.rank

    def Get_size(self):  # noqa: N802
        return self.size

    def allgather(self, value):
        assert value == self.gathered[self.rank], (value, self.gathered[self.rank])
        return list(self.gathered)

    def Barrier(self):  # noqa: N802
        self.barriers += 1


@pytest.mark.parametrize("rank,turn", [(0, 0), (1, 1), (2, 2), (3, 1), (4, 2)])
def test_compile_in_order_rank0_then_one_per_host_then_rest(rank, turn, monkeypatch):
    hosts = ["a", "b", "a", "c", "c"]
    monkeypatch.setattr(compile_order.socket, "gethostname", lambda: hosts[rank])
    comm = FakeComm(rank, [(h, "/cache") for h in hosts])
    seen = []
    result = dist.compile_in_order(lambda: seen.append(comm.barriers) or "done", comm,
                                   cache="/cache")
    assert result == "done" and seen == [turn] and comm.barriers == 3


def test_compile_in_order_without_cache_needs_no_barriers(monkeypatch):
    monkeypatch.setattr(compile_order.socket, "gethostname", lambda: "b")
    comm = FakeComm(1, [("a", None), ("b", None)])
    assert dist.compile_in_order(lambda: 5, comm) == 5 and comm.barriers == 0


def test_compile_in_order_rejects_ranks_that_disagree(monkeypatch):
    monkeypatch.setattr(compile_order.socket, "gethostname", lambda: "a")
    comm = FakeComm(0, [("a", None), ("a", "/tmp/x")])
    with pytest.raises(sn.DistributedError, match="rank 1 has the cache in /tmp/x"):
        dist.compile_in_order(lambda: 5, comm)


def test_kernels_compile_in_order_passes_the_kernel_cache(monkeypatch, tmp_path):
    monkeypatch.setattr(_cache, "use", lambda: True)  # keep Numba's config untouched
    monkeypatch.setenv("SPMDNET_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_order.socket, "gethostname", lambda: "a")
    comm = FakeComm(1, [("a", kernels.cache_dir()), ("a", kernels.cache_dir())])
    assert kernels.compile_in_order(lambda: 7, comm) == 7 and comm.barriers == 3


def test_cache_dir_is_per_user_by_default(monkeypatch, tmp_path):
    monkeypatch.delenv("SPMDNET_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert kernels.cache_dir().startswith(os.path.join(str(tmp_path), ".cache", "spmdnet"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert os.path.dirname(kernels.cache_dir()) == str(tmp_path / "xdg" / "spmdnet")
    monkeypatch.setenv("SPMDNET_CACHE_DIR", "/somewhere/else")
    assert os.path.dirname(kernels.cache_dir()) == "/somewhere/else"
    assert os.path.basename(kernels.cache_dir()).startswith("kernels-")  # sources' hash


def test_cache_is_on_by_default_and_has_a_knob(monkeypatch):
    monkeypatch.delenv("SPMDNET_KERNEL_CACHE", raising=False)
    assert _cache.enabled() is not PLAIN_PYTHON
    monkeypatch.setenv("SPMDNET_KERNEL_CACHE", "0")
    assert not _cache.enabled()


_CACHE_SCRIPT = """
import numpy as np
from spmdnet.kernels import activation
activation.warmup(np.dtype(np.float32), ("relu",))
k = activation._cpu["relu", "backward"].compiled
print(sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values()))
"""


def _run(env, tmp_path):
    env = dict(os.environ, SPMDNET_CACHE_DIR=str(tmp_path), **env)
    return subprocess.run([sys.executable, "-c", _CACHE_SCRIPT], env=env, check=True,
                          capture_output=True, text=True, timeout=300)


def _cache_files(tmp_path):
    return [name for _, _, files in os.walk(tmp_path) for name in files
            if name.endswith(".nbi")]


@pytest.mark.skipif(PLAIN_PYTHON, reason="nothing is compiled without the JIT")
def test_disk_cache_is_filled_once_then_loaded(tmp_path):
    env = {"SPMDNET_KERNEL_CACHE": ""}  # the default: on
    runs = [_run(env, tmp_path).stdout.split() for _ in range(2)]
    assert runs[0] == ["0", "1"] and runs[1] == ["1", "0"], runs
    assert _cache_files(tmp_path)


@pytest.mark.skipif(PLAIN_PYTHON, reason="nothing is compiled without the JIT")
def test_disk_cache_off_writes_nothing(tmp_path):
    assert _run({"SPMDNET_KERNEL_CACHE": "0"}, tmp_path).stdout.split()[0] == "0"  # no hit
    assert not _cache_files(tmp_path)


@pytest.mark.skipif(PLAIN_PYTHON, reason="nothing is compiled without the JIT")
def test_unusable_cache_dir_warns_and_compiles(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = _run({}, blocker)
    assert result.stdout.split()[0] == "0"
    assert "cannot create the kernel cache" in result.stderr
