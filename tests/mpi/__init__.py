"""Tests that run on every rank of an MPI job (tests/run.sh: 1, 2, 3, 4 and 8 ranks)."""
