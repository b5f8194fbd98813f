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

# mpiexec from the environment that runs python (pip's mpich), else PATH's
MPIEXEC="$(dirname "$(python -c 'import sys; print(sys.executable)')")/mpiexec"
[ -x "$MPIEXEC" ] || MPIEXEC=mpiexec

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
