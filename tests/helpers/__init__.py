"""Helpers shared by the tests, one module per concern:

- ``launch``: real MPI jobs started from serial tests (examples, abort, stalls);
- ``oracles``: numeric settings and the serial training step that the
  distributed tests compare against.
"""
