"""Scaling studies: ``python -m spmdnet.bench allreduce | step | scaling``.

- ``alphabeta``: the alpha-beta (Hockney) model, its fit, n_1/2 and the
  ring-allreduce projection;
- ``allreduce_bench``, ``step_bench``, ``scaling``: the three subcommands;
- ``report``: CSV and (optional, matplotlib) PNG output.
Importing this package needs no MPI launch and no matplotlib.
"""
from .alphabeta import fit, half_peak_bytes, project_step, ring_allreduce_s

__all__ = ["fit", "half_peak_bytes",
           "ring_allreduce_s", "project_step"]
