"""Checkpoints that never lose work: one HDF5 file, written atomically.

A checkpoint holds the model state, the optimizer state, every rank's RNG
state, the sampler's, loader's and scheduler's state, the step, the world
layout and the spmdnet version, plus any JSON-able ``extra`` values. Rank 0
writes it to a temporary name, fsyncs, renames it into place and fsyncs the
directory: a crash at any moment leaves the previous checkpoint intact.
Every rank then learns whether the write succeeded, so an error is raised on
all of them. Every array carries a checksum; NaN/Inf are refused.

``path`` may be a directory: checkpoints are then ``ckpt-<step>.h5`` inside
it, the file ``latest`` names the newest complete one, and only the newest
``keep`` are kept. ``resume`` continues a training run from it, at any
data-parallel size (the state is resharded), never from scratch over
checkpoints it cannot use.

Modules, bottom-up:
  files      atomic whole-file writes, temporaries, free space, the probe
  integrity  checksums and NaN/Inf checks of the arrays
  h5format   the HDF5 file: model, optimizer and meta, one group per rank when sharded
  resharding loading at another world size: same tp and pp, any data-parallel size
  state      this rank's model/optimizer state, the world layout, fitting a model
  directory  ckpt-<step>.h5 files, ``latest``, rotation, newest that verifies
  writing    save_checkpoint (collective)
  reading    load_checkpoint (collective)
  resuming   resume: the newest checkpoint, agreed by every rank, options compared
"""
from .directory import LATEST, check_checkpoint_dir, latest_checkpoint
from .h5format import FORMAT
from .reading import load_checkpoint
from .resuming import resume
from .writing import save_checkpoint

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint", "check_checkpoint_dir",
           "resume", "FORMAT", "LATEST"]
