"""Helpers shared by the tests, one module per concern:

- ``check_mode``: the collective check mode switched on for one MPI test;
- ``launch``: real MPI jobs started from serial tests (examples, abort, stalls);
- ``op_tables``: the forward-and-backward check of one row of an op table;
- ``oracles``: numeric settings and the serial training step that the
  distributed tests compare against;
- ``shared_dirs``: one directory for all ranks of an MPI test (checkpoints).
"""
