"""One MPI job of tests/test_checkpoint_reshard.py: train small models with
DataParallel, ZeRO-1, ZeRO-2, FSDP or tensor x data parallelism at a fixed
global batch, save or resume checkpoints, and write what happened as JSON.

    mpiexec -n N python tests/helpers/reshard_run.py OUT.json CKPT_ROOT PLAN_JSON

PLAN_JSON is a list of [strategy, mode, steps]; modes: ``whole`` (train from
the start), ``save`` (train, then checkpoint into CKPT_ROOT/<strategy>/),
``resume`` (resume from there, then train) and ``refuse`` (a resume that
must fail: its message is recorded). Rank 0 writes {"<strategy> <mode>":
{"losses", "params", "position" or "error"}} to OUT.json.
"""
import json
import sys

import numpy as np

import spmdnet as sn
import spmdnet.nn.functional as F
from spmdnet import data, dist, nn, optim, parallel
from spmdnet.checkpoint import resume

GLOBAL_BATCH = 12
SAMPLES = 48  # 4 steps per epoch at any world size


def dataset():
    rng = np.random.default_rng(7)
    return data.ArrayDataset(rng.standard_normal((SAMPLES, 6)).astype(np.float32),
                             np.arange(SAMPLES) % 3)


def mlp():
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


class Run:
    """A model, its optimizer and loader for one strategy at this world size."""

    def __init__(self, strategy, dense=False):
        sn.manual_seed(0)
        self.strategy, self.mesh, self.closing = strategy, None, []
        dp_comm = dist.comm_or_default(None)
        if strategy == "tp" and not dense:
            self.mesh = dist.Mesh(tp=2)
            dp_comm = self.mesh.dp
            self.module = nn.Sequential(parallel.ColumnParallelLinear(6, 8, self.mesh.tp),
                                        nn.Tanh(), parallel.RowParallelLinear(8, 3, self.mesh.tp))
            self.model = parallel.DataParallel(self.module, comm=dp_comm)
            self.opt = optim.Adam(self.model.parameters(), lr=0.05)
            self.closing.append(self.model)
        elif strategy in ("dp", "tp"):
            self.module = mlp()
            self.model = parallel.DataParallel(self.module)
            self.opt = optim.SGD(self.module.parameters(), lr=0.1, momentum=0.9)
            self.closing.append(self.model)
        elif strategy in ("zero1", "zero2"):
            self.module = self.model = mlp()
            self.opt = parallel.ZeroRedundancyOptimizer(
                self.module.parameters(), optimizer_class=optim.Adam, lr=0.05,
                reduce_gradients=strategy == "zero1", stage=int(strategy[-1]))
        elif strategy == "fsdp":
            self.module = mlp()
            self.model = parallel.FullyShardedDataParallel(self.module, wrap={nn.Linear})
            self.opt = optim.AdamW(self.model.parameters(), lr=0.05)
            self.closing.append(self.model)
        else:
            raise ValueError(f"unknown strategy {strategy!r}")
        replicas, rank = dp_comm.Get_size(), dp_comm.Get_rank()
        self.sampler = data.DistributedSampler(dataset(), num_replicas=replicas, rank=rank,
                                               seed=3, drop_last=True)
        self.loader = data.DataLoader(self.sampler.dataset, GLOBAL_BATCH // replicas,
                                      sampler=self.sampler, drop_last=True)

    def train(self, steps):
        """The global batch's mean loss of each of ``steps`` steps, continuing
        the sampler's epoch and position."""
        losses = []
        while len(losses) < steps:
            self.sampler.set_epoch(self.sampler.epoch)
            for x, y in self.loader:
                loss = F.cross_entropy(self.model(sn.tensor(x)), y)
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                losses.append(dist.allreduce(loss.item(), "mean"))
                if len(losses) == steps:
                    return losses
            self.sampler.set_epoch(self.sampler.epoch + 1)
        return losses

    def full_params(self):
        """The serial model's state (rank 0; None elsewhere), as lists."""
        if self.mesh is not None:
            state = parallel.gather_state_dict(self.module, self.mesh)
        elif self.strategy == "fsdp":
            state = self.model.state_dict()
        else:
            state = self.module.state_dict()
        if state is None or dist.rank() != 0:
            return None
        return {k: np.asarray(v.numpy() if hasattr(v, "numpy") else v, np.float64).tolist()
                for k, v in state.items()}

    def close(self):
        for wrapper in self.closing:
            wrapper.close()
        if self.mesh is not None:
            self.mesh.free()


def main(out, root, plan):
    results = {}
    for strategy, mode, steps in plan:
        directory = f"{root}/{strategy}"
        run = Run(strategy, dense=mode == "refuse")
        record = {}
        if mode in ("resume", "refuse"):
            try:
                extra = resume(directory, run.model, run.opt, loader=run.loader,
                               mesh=run.mesh)
            except sn.CheckpointError as exc:
                record["error"] = str(exc)
            else:
                record["step"] = extra["step"]
                record["position"] = [run.sampler.epoch, run.sampler.start_index]
        if "error" not in record:
            record["losses"] = run.train(steps)
            record["params"] = run.full_params()
        if mode == "save":
            sn.save_checkpoint(directory + "/", run.model, run.opt, step=steps,
                               loader=run.loader, mesh=run.mesh)
        results[f"{strategy} {mode}"] = record
        run.close()
    if dist.rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    dist.init()
    main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
    dist.finalize_and_exit(0)
