"""Running a test file's kernel cases again as plain Python and on Numba's
CUDA simulator, in a subprocess (both need their variables before Numba is
imported)."""
import os
import subprocess
import sys

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
PLAIN_PYTHON = os.environ.get("NUMBA_DISABLE_JIT") == "1"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_simulator_subprocess(path, keyword):
    """pytest ``-k keyword`` on ``path`` with NUMBA_DISABLE_JIT=1 and
    NUMBA_ENABLE_CUDASIM=1; fails with the subprocess's output."""
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", NUMBA_ENABLE_CUDASIM="1")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", keyword,
         path], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
