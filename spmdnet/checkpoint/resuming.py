"""Resuming a training run: what every example that checkpoints needs.

    extra = resume(args.checkpoint_dir, model, optimizer, scheduler=scheduler,
                   loader=loader, options=vars(args))
    step = 0 if extra is None else extra["step"]
    ...
    save_checkpoint(args.checkpoint_dir + "/", model, optimizer, step=step,
                    scheduler=scheduler, loader=loader, options=vars(args))

``resume`` finds the newest checkpoint that verifies, makes sure every rank
found the same one, loads it (model, optimizer, every rank's RNG, scheduler,
loader position) and refuses to continue a run that was started with other
options. A stop signal (``dist.StopSignal``) then a ``save_checkpoint`` and
exit code 3 make a run that Slurm can requeue.
"""
import json

from .. import distributed as dist
from ..errors import CheckpointError
from . import resharding
from .directory import agreed_newest
from .reading import load_contents


def resume(path, model, optimizer=None, *, scheduler=None, loader=None, sampler=None,
           options=None, comm=None, mesh=None):
    """Continue from the newest checkpoint in the directory ``path``
    (collectively); returns its ``extra`` dict (with ``step``), or None when
    ``path`` is None or holds no checkpoint (a new run).

    Another data-parallel size than the saved run's is resharded (see
    ``resharding``). A run never starts from scratch over checkpoints it
    cannot use: CheckpointError on every rank, naming the directory and why,
    when the newest intact checkpoint was written with another tp or pp, or
    when none verifies. To start a new run then, use another directory.

    ``options`` (a JSON-able dict, saved by ``save_checkpoint(...,
    options=...)``) must equal the saved ones: a difference raises ValueError
    on every rank naming each differing option with its saved and its new
    value, before anything is loaded. The checkpoint chosen verifies on every
    rank (each rank's part of a sharded one) and is the same on all ranks;
    newer ones that do not are named in a warning on rank 0. DistributedError
    when the ranks see different files (a directory not shared by all ranks)."""
    comm = dist.comm_or_default(comm)
    if path is None:
        return None
    found, contents, skipped = agreed_newest(path, comm, resharding.part_selector(comm, mesh))
    if found is None and skipped:  # the same on every rank
        raise CheckpointError(
            f"none of the {len(skipped)} checkpoints in checkpoint directory {path} verifies "
            f"on every rank: {'; '.join(skipped)}. Not starting from scratch over them: "
            "restore a good checkpoint into it, or use another directory to start a new run")
    if found is None:
        return None
    if options is not None:  # the same meta on every rank: all raise alike
        _check_options(found, contents[0]["extra"].get("options", {}), options)
    return load_contents(str(found), contents, model, optimizer, sampler=sampler,
                         loader=loader, scheduler=scheduler, comm=comm, mesh=mesh)


def _check_options(path, saved, options):
    now = json.loads(json.dumps(options))  # as saved: tuples become lists
    differ = {k: (saved.get(k), now.get(k)) for k in sorted(set(saved) | set(now))
              if saved.get(k) != now.get(k)}
    if differ:
        raise ValueError(f"{path} was written with other options, (saved, now): {differ}; "
                         "resume with the saved options or use another checkpoint directory")
