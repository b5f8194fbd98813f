"""spmdnet's tests: a package, so that helpers import as ``tests.helpers``
under plain pytest and under ``mpiexec ... python -m mpi4py -m pytest``."""
