#!/usr/bin/env bash
# The whole test suite: lint, serial tests, then the MPI tests at 1, 2, 3 and
# 4 ranks and 3D parallelism at 8. Every rank runs one BLAS/Numba thread, so
# oversubscribed runs stay quick; `python -m mpi4py` turns one rank's failure
# into MPI_Abort, and an outer timeout bounds any hang.
set -euo pipefail
cd "$(dirname "$0")/.."
# one thread per process and MPIEXEC, the mpiexec of this Python's environment
# (pip's mpich) else PATH's: the rule of spmdnet/launch.py, as the benchmarks use it
SETUP="$(python -m spmdnet.launch --shell)"
eval "$SETUP"

echo "== ruff"
ruff check spmdnet examples tests benchmarks
# ruff skips folders it takes for build output (it once skipped spmdnet/dist/):
# it must lint every file of the package
LINTED=$(ruff check --show-files spmdnet | grep -c '\.py$')
FILES=$(find spmdnet -name '*.py' | wc -l)
if [ "$LINTED" -ne "$FILES" ]; then
  echo "ruff lints $LINTED of the $FILES .py files under spmdnet/; not linted:" >&2
  comm -13 <(ruff check --show-files spmdnet | sed "s|^$PWD/||" | sort) \
    <(find spmdnet -name '*.py' | sort) >&2
  exit 1
fi

echo "== serial tests"
python -m pytest -q -p no:cacheprovider tests

echo "== MPI tests on 1 rank (plain python)"
python -m pytest -q -x -p no:cacheprovider --with-mpi --timeout=120 tests/mpi
for n in 2 3 4; do
  echo "== MPI tests on $n ranks"
  timeout 900 "$MPIEXEC" -n "$n" python -m mpi4py -m pytest -q -x -p no:cacheprovider \
    --with-mpi --timeout=120 tests/mpi
done
echo "== 3D parallelism (pp x tp x dp) on 8 ranks"
timeout 600 "$MPIEXEC" -n 8 python -m mpi4py -m pytest -q -x -p no:cacheprovider \
  --with-mpi --timeout=300 tests/mpi/test_3d.py
echo "== all tests passed"
