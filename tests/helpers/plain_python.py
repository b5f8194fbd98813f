"""Running a test file's kernel cases again with the kernel bodies as plain
Python, in a subprocess (``NUMBA_DISABLE_JIT=1`` must be set before Numba is
imported)."""
import os
import subprocess
import sys

PLAIN_PYTHON = os.environ.get("NUMBA_DISABLE_JIT") == "1"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_plain_python_subprocess(path, keyword):
    """pytest ``-k keyword`` on ``path`` with NUMBA_DISABLE_JIT=1; fails with
    the subprocess's output, and when it ran no test."""
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", keyword,
         path], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0 and " passed" in result.stdout, \
        result.stdout[-4000:] + result.stderr[-2000:]
