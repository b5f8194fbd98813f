"""Loading a checkpoint at another world size (PyTorch's distributed
checkpoint is the anchor: a checkpoint is resharded for the job that loads
it, never refused for its size).

What changes with the number of data-parallel replicas, and what does not:

- The model and optimizer state saved by DataParallel, ZeRO and FSDP is the
  full (unsharded) state: ZeRO's and FSDP's optimizer shards are gathered
  into the original parameters' shapes when saved and cut into the new
  world's shards when loaded (``distributed/optim/zero_state.py``,
  ``distributed/fsdp/_optim_utils.py``), so they load at any world size.
- A tensor- or pipeline-parallel checkpoint holds one part per rank,
  ``rank<r>/``, ranks laid out as ``Mesh`` lays them out (tp fastest, then
  dp, then pp). Every data-parallel replica holds the same parts, so a job
  with the same tp and pp loads it at any data-parallel size: the rank at
  (pp, dp, tp) reads the part of the saved rank at (pp, dp, tp) when that
  replica existed, else the part of (pp, 0, tp). Another tp or pp is refused
  (``LayoutMismatch``), naming both layouts.
- RNG states: a rank whose (pp, dp, tp) coordinates existed in the saved
  run gets that rank's state back; a rank added by the resize keeps the
  state its program seeded.
- The sampler position is global: a ``DistributedSampler`` that used
  ``start_index`` of each of R replicas' shares has consumed the first
  ``start_index * R`` indices of the epoch's order, so R' replicas continue
  at ``start_index * R / R'`` each (and a DataLoader's batch size, which
  only counts positions in samples there, is the loader's own). With the
  same global batch, every step then sees the same samples as the run that
  never stopped.
"""
from ..errors import CheckpointError


class LayoutMismatch(CheckpointError):
    """An intact checkpoint written by another tensor- or pipeline-parallel
    layout: not damage, so never skipped for an older one."""


def saved_layout(meta):
    """(size, tp, pp) the checkpoint was written by."""
    saved = meta.get("layout") or {}
    return int(saved.get("size", len(meta.get("rng", [])) or 1)), int(saved.get("tp", 1)), \
        int(saved.get("pp", 1))


def job_layout(comm, mesh):
    """(size, tp, pp, (pp_rank, dp_rank, tp_rank)) of this rank's job."""
    if mesh is None:
        return comm.Get_size(), 1, 1, (0, comm.Get_rank(), 0)
    return comm.Get_size(), mesh.tp_size, mesh.pp_size, mesh.coords()


def describe(size, tp, pp):
    return f"{{'size': {size}, 'tp': {tp}, 'pp': {pp}}} (dp {size // (tp * pp)})"


def check_layout(path, meta, comm, mesh):
    """Raise LayoutMismatch unless the job has the checkpoint's tp and pp
    (any data-parallel size)."""
    size, tp, pp = saved_layout(meta)
    own_size, own_tp, own_pp, _ = job_layout(comm, mesh)
    if (tp, pp) != (own_tp, own_pp):
        raise LayoutMismatch(
            f"checkpoint {path} (step {meta.get('step')}) was written by layout "
            f"{describe(size, tp, pp)}, this job is {describe(own_size, own_tp, own_pp)}: "
            f"tensor- and pipeline-parallel parts load only with the same tp and pp (any "
            f"data-parallel size). Resume with tp={tp} and pp={pp}, or export a serial model "
            "from a job of that layout with parallel.gather_state_dict")


def source_rank(meta, comm, mesh):
    """The saved rank whose part this rank loads (see the module's notes)."""
    size, tp, pp = saved_layout(meta)
    dp = max(size // (tp * pp), 1)
    pp_rank, dp_rank, tp_rank = job_layout(comm, mesh)[3]
    return tp_rank + tp * ((dp_rank if dp_rank < dp else 0) + dp * pp_rank)


def part_selector(comm, mesh):
    """What ``h5format.read`` passes the checkpoint's meta to, to learn
    which part to read: None for an unsharded checkpoint (the root), else
    ``source_rank``; LayoutMismatch for another tp or pp."""
    def select(meta, path):
        check_layout(path, meta, comm, mesh)
        _, tp, pp = saved_layout(meta)
        return None if tp * pp == 1 else source_rank(meta, comm, mesh)
    return select


def rng_state_for(meta, comm, mesh):
    """This rank's saved RNG state, or None for a rank the resize added."""
    states = meta.get("rng") or []
    size, tp, pp = saved_layout(meta)
    if size == comm.Get_size():
        return states[comm.Get_rank()] if comm.Get_rank() < len(states) else None
    pp_rank, dp_rank, tp_rank = job_layout(comm, mesh)[3]
    dp = max(size // (tp * pp), 1)
    if dp_rank >= dp:
        return None
    old = tp_rank + tp * (dp_rank + dp * pp_rank)
    return states[old] if old < len(states) else None


def remap_position(path, state, component):
    """A saved sampler or loader ``state`` for ``component`` at this world
    size: a DistributedSampler position counted in this world's shares.
    States of anything else are returned as they are."""
    if state is None:
        return None
    if "sampler" in state and "batch_size" in state:  # a DataLoader's state
        sampler = getattr(component, "sampler", None)
        inner = remap_position(path, state["sampler"], sampler)
        if inner is state["sampler"]:
            return state
        # the position is in samples (batches_done is 0 with a start index):
        # the local batch size may change with the world size
        same = state.get("batches_done", 0) == 0
        return dict(state, sampler=inner,
                    batch_size=component.batch_size if same else state["batch_size"])
    replicas = getattr(component, "num_replicas", None)
    saved = state.get("num_replicas")
    if replicas is None or saved is None or saved == replicas or "start_index" not in state:
        return state
    consumed = int(state["start_index"]) * int(saved)
    if consumed % replicas:
        raise CheckpointError(
            f"checkpoint {path}: the sampler had consumed {consumed} samples of epoch "
            f"{state.get('epoch')} on {saved} replicas ({state['start_index']} each), which "
            f"{replicas} replicas cannot share equally; resume with a number of replicas "
            f"that divides {consumed}, or from a checkpoint at an epoch boundary")
    return dict(state, num_replicas=replicas, start_index=consumed // replicas)
