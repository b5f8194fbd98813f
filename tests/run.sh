#!/usr/bin/env bash
# The whole test suite: lint, serial tests, then the MPI tests at 2, 3 and 4
# ranks. Every rank runs one BLAS/Numba thread, so oversubscribed runs stay
# quick; `python -m mpi4py` turns one rank's failure into MPI_Abort, and an
# outer timeout bounds any hang.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 NUMBA_NUM_THREADS=1
export PYTHONUNBUFFERED=1

echo "== ruff"
ruff check spmdnet examples tests benchmarks

echo "== serial tests"
python -m pytest -q -p no:cacheprovider tests

if compgen -G "tests/mpi/test_*.py" > /dev/null; then
  for n in 2 3 4; do
    echo "== MPI tests on $n ranks"
    timeout 600 mpiexec -n "$n" python -m mpi4py -m pytest -q -x -p no:cacheprovider \
      --with-mpi --timeout=120 tests/mpi
  done
fi
echo "== all tests passed"
