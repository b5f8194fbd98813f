"""Train an MLP with data parallelism over every MPI rank: the main job.

    mpirun -n 8 python examples/train_mlp.py

With no argument it writes the UCI handwritten digits (kept in the package)
to HDF5 files on first use, trains an MLP with DataParallel over all ranks
(SGD with momentum; learning rate scaled with the global batch, linear
warmup then cosine decay), prints exact validation accuracy every epoch,
writes the epoch metrics as JSON lines, and exits non-zero when the final
test accuracy is below --min-accuracy. Also runs as plain `python` (1 rank)
and under Slurm's `srun`.

With --checkpoint-dir it checkpoints every --checkpoint-every steps and at
the end, resumes automatically from the newest checkpoint there (exactly:
sampler position, RNG and optimizer state included), and on SIGTERM or
SIGUSR1 saves a checkpoint at the next step boundary and exits with code 3
("stopped, resumable"): the pattern Slurm requeueing needs.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import data, dist, nn, optim, parallel
from spmdnet.profiler import StepProfiler

REFERENCE_BATCH = 256  # lr is given for this global batch and scaled linearly


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="digits",
                   help="'digits', 'synthetic', or a training HDF5 file with x and y")
    p.add_argument("--test-data", help="test HDF5 file (with --data PATH)")
    p.add_argument("--data-dir", default="data", help="where built-in datasets are written")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=0.4, help=f"for a global batch of "
                   f"{REFERENCE_BATCH}; scaled linearly with the actual global batch")
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--metrics", default="metrics.jsonl", help="JSON lines, one per epoch")
    p.add_argument("--plot", help="write loss/accuracy curves to this PNG (needs matplotlib)")
    p.add_argument("--min-accuracy", type=float, default=0.95)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--profile", action="store_true",
                   help="print every rank's per-step time breakdown at the end")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel group size")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages")
    p.add_argument("--micro-batches", type=int, default=4, help="per step, with --pp > 1")
    p.add_argument("--checkpoint-dir", help="checkpoint here and resume from here")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps (0: only at the end)")
    p.add_argument("--stop-after", type=int, default=0,
                   help="checkpoint and stop after this many steps (tests resumption)")
    return p.parse_args(argv)


def datasets(args):
    """(train, test) HDF5Datasets; built-in ones are written on first use."""
    if args.data == "digits":
        out = Path(args.data_dir)
        paths = out / "digits_train.h5", out / "digits_test.h5"
        if not all(p.exists() for p in paths):
            paths = data.datasets.make_digits(out)
    elif args.data == "synthetic":
        out = Path(args.data_dir)
        paths = out / "synthetic_train.h5", out / "synthetic_test.h5"
        if not all(p.exists() for p in paths):
            paths = (data.datasets.make_synthetic(paths[0], 20000, seed=1),
                     data.datasets.make_synthetic(paths[1], 4000, seed=2))
    else:
        if not args.test_data:
            raise SystemExit("--data PATH needs --test-data PATH as well")
        paths = args.data, args.test_data
    return data.HDF5Dataset(paths[0]), data.HDF5Dataset(paths[1])


def build_blocks(in_features, hidden, classes, dropout, mesh):
    """The MLP as blocks (lists of modules). With tp > 1 the first two layers
    are a column-then-row tensor-parallel pair (one block: they must share a
    pipeline stage); the same seed gives the serial model's weights."""
    if mesh.tp_size == 1:
        return [[nn.Linear(in_features, hidden), nn.ReLU(), nn.Dropout(dropout)],
                [nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout)],
                [nn.Linear(hidden, classes)]]
    tp = mesh.tp
    return [[parallel.ColumnParallelLinear(in_features, hidden, tp), nn.ReLU(),
             parallel.ParallelDropout(dropout, tp),  # inside the TP region: own masks
             parallel.RowParallelLinear(hidden, hidden, tp), nn.ReLU(),
             nn.Dropout(dropout)],  # outside it: the same mask on every TP rank
            [nn.Linear(hidden, classes)]]


class Net:
    """This rank's part of the model: its pipeline stage, data parallel over
    ``mesh.dp``, run through a GPipe pipeline over ``mesh.pp`` when pp > 1."""

    def __init__(self, args, mesh, in_features, classes):
        blocks = build_blocks(in_features, args.hidden, classes, args.dropout, mesh)
        if mesh.pp_size > len(blocks):
            raise SystemExit(f"--pp {mesh.pp_size} exceeds the model's {len(blocks)} blocks "
                             "(with --tp > 1 the first two layers form one block)")
        bounds = np.linspace(0, len(blocks), mesh.pp_size + 1).round().astype(int)
        mine = blocks[bounds[mesh.pp_rank]:bounds[mesh.pp_rank + 1]]
        self.module = nn.Sequential(*[m for block in mine for m in block])
        self.ddp = parallel.DataParallel(self.module, comm=mesh.dp)
        self.pipe = parallel.Pipeline(self.ddp, mesh.pp, args.micro_batches) \
            if mesh.pp_size > 1 else None

    def train_step(self, x, y, opt, prof):
        """One optimisation step; returns the loss (the same on a pipeline's ranks)."""
        opt.zero_grad()
        if self.pipe is not None:
            loss = self.pipe.train_step(x, y, F.cross_entropy)
            prof.mark("backward")  # the pipeline interleaves forward and backward
        else:
            out = F.cross_entropy(self.ddp(sn.Tensor(x)), y)
            prof.mark("forward")
            out.backward()
            prof.mark("backward")
            loss = out.item()
        opt.step()
        prof.mark("optimizer")
        return loss

    def __call__(self, x):  # evaluation: logits of the whole model
        if self.pipe is not None:
            return sn.Tensor(self.pipe.infer(x))
        return self.module(x)

    @property
    def training(self):
        return self.module.training

    def train(self, mode=True):
        self.module.train(mode)

    def eval(self):
        self.module.train(False)


def build_optimizer(args, params, global_batch, steps_per_epoch):
    lr = args.lr * global_batch / REFERENCE_BATCH
    if args.optimizer == "sgd":
        opt = optim.SGD(params, lr=lr, momentum=0.9, weight_decay=1e-4)
    else:
        opt = optim.Adam(params, lr=lr / 100)
    total = max(1, args.epochs * steps_per_epoch)
    warmup = min(total, int(args.warmup_epochs * steps_per_epoch))
    return opt, optim.lr_scheduler.WarmupCosine(opt, warmup, total)


class Progress:
    """One status line on rank 0: samples/s and loss (no output elsewhere)."""

    def __init__(self, epoch, steps):
        self.epoch, self.steps, self.t0 = epoch, steps, time.perf_counter()
        self.live = dist.is_root() and sys.stdout.isatty()

    def update(self, step, samples, loss):
        if self.live:
            rate = samples / max(time.perf_counter() - self.t0, 1e-9)
            bar = "#" * int(20 * step / self.steps)
            print(f"\repoch {self.epoch:3d} [{bar:<20}] {step}/{self.steps} "
                  f"{rate:8.0f} samples/s  loss {loss:.4f}", end="", flush=True)

    def close(self):
        if self.live:
            print("\r" + " " * 78 + "\r", end="", flush=True)


class Run:
    """Training state that a checkpoint saves and a resume restores."""

    def __init__(self, args, net, opt, sched, loader, mesh):
        self.args, self.net, self.opt, self.sched = args, net, opt, sched
        self.loader, self.mesh = loader, mesh
        self.step, self.epoch, self.resumed = 0, 0, False
        self.stop = dist.StopSignal() if args.checkpoint_dir else None
        self.prof = StepProfiler(net.ddp, loader, enabled=args.profile)

    def save(self, epoch, batches_done):
        """Checkpoint with the sampler at the next unread batch."""
        sampler = self.loader.sampler
        saved = sampler.state_dict()
        if batches_done >= len(self.loader) + saved["start_index"] // self.loader.batch_size:
            epoch, batches_done = epoch + 1, 0  # the epoch is complete
        sampler.set_epoch(epoch)
        sampler.start_index = batches_done * self.loader.batch_size
        sn.save_checkpoint(self.args.checkpoint_dir + "/", self.net.module, self.opt,
                           sampler=sampler, step=self.step, mesh=self.mesh,
                           scheduler=self.sched.state_dict(), epoch=epoch,
                           schedule=self.schedule())
        sampler.load_state_dict(saved)

    def schedule(self):
        """What a resumed run must share with the one it continues."""
        a = self.args
        return {"epochs": a.epochs, "batch_size": a.batch_size, "lr": a.lr,
                "optimizer": a.optimizer, "seed": a.seed}

    def resume(self):
        """Continue from the newest checkpoint in --checkpoint-dir, if any."""
        if not self.args.checkpoint_dir:
            return
        found = sn.latest_checkpoint(self.args.checkpoint_dir)
        if dist.check_same(self.mesh.comm, found, "newest checkpoint") is None:
            return
        extra = sn.load_checkpoint(found, self.net.module, self.opt, mesh=self.mesh,
                                   sampler=self.loader.sampler)
        if extra.get("schedule") != self.schedule():
            raise SystemExit(f"{found} was trained with {extra.get('schedule')}, this run asks "
                             f"for {self.schedule()}: resume with the same options or start a "
                             "new --checkpoint-dir")
        self.sched.load_state_dict(extra["scheduler"])
        self.step, self.epoch, self.resumed = extra["step"], extra["epoch"], True
        dist.print0(f"resumed from {found} at step {self.step}, epoch {self.epoch}, "
                    f"{self.loader.sampler.start_index} samples into it")

    def after_step(self, epoch, batches_done):
        """Checkpoint when due; True when the job must stop now."""
        self.step += 1
        every = self.args.checkpoint_every
        stop = self.step == self.args.stop_after or (
            self.stop is not None and self.stop.should_stop())
        if self.args.checkpoint_dir and (stop or (every and self.step % every == 0)):
            self.save(epoch, batches_done)
        return stop


def train_epoch(run, epoch):
    """One epoch (or its rest, after a resume); returns (mean local loss,
    seconds, samples/s over all ranks), or None when the run must stop."""
    loader = run.loader
    loader.sampler.set_epoch(epoch)
    first = loader.sampler.start_index // loader.batch_size  # > 0 after a mid-epoch resume
    progress = Progress(epoch, len(loader) + first)
    t0, losses, samples = time.perf_counter(), [], 0
    for batch, (x, y) in enumerate(loader, first + 1):
        run.prof.begin()
        losses.append(run.net.train_step(x, y, run.opt, run.prof))
        run.sched.step()
        samples += len(y) * run.mesh.dp_size
        progress.update(batch, samples, losses[-1])
        run.prof.end()
        if run.after_step(epoch, batch):
            progress.close()
            return None
    progress.close()
    loader.sampler.set_start_index(0)
    seconds = time.perf_counter() - t0
    return float(np.mean(losses)) if losses else float("nan"), seconds, samples / seconds


def plot(path, history):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        dist.print0("--plot needs matplotlib: pip install 'spmdnet[plot]'")
        return
    epochs = [h["epoch"] for h in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    a.plot(epochs, [h["train_loss"] for h in history], label="train")
    a.plot(epochs, [h["val_loss"] for h in history], label="validation")
    a.set_xlabel("epoch"), a.set_ylabel("loss"), a.legend()
    b.plot(epochs, [h["val_accuracy"] for h in history])
    b.set_xlabel("epoch"), b.set_ylabel("validation accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None):
    args = parse_args(argv)
    world = dist.init()
    mesh = dist.Mesh(tp=args.tp, pp=args.pp)
    sn.manual_seed(args.seed)  # the same on every rank: TP layers slice one full draw
    train_set, test_set = datasets(args)
    classes = int(train_set.targets().max()) + 1
    net = Net(args, mesh, int(np.prod(train_set.sample_shape)), classes)
    # every rank of a TP group and of a pipeline reads the same samples
    sampler = data.DistributedSampler(train_set, seed=args.seed, drop_last=True, comm=mesh.dp)
    loader = data.DataLoader(train_set, args.batch_size, sampler=sampler, drop_last=True)
    global_batch = args.batch_size * mesh.dp_size
    opt, sched = build_optimizer(args, net.module.parameters(), global_batch, len(loader))
    run = Run(args, net, opt, sched, loader, mesh)
    dist.print0(f"{world.size} ranks (dp {mesh.dp_size} x tp {mesh.tp_size} x pp "
                f"{mesh.pp_size}), {len(train_set)} training samples, global batch "
                f"{global_batch}, {len(loader)} steps/epoch")
    run.resume()
    history, train_s = [], 0.0
    for epoch in range(run.epoch, args.epochs):
        result = train_epoch(run, epoch)
        if result is None:
            dist.print0(f"stopped after step {run.step} with a checkpoint in "
                        f"{args.checkpoint_dir}; run again to resume")
            return 3
        train_loss, seconds, rate = result
        train_s += seconds
        val = data.evaluate(net, test_set, comm=mesh.dp)
        history.append({"epoch": epoch, "train_loss": dist.allreduce(train_loss, "mean"),
                        "val_loss": val["loss"], "val_accuracy": val["accuracy"],
                        "samples_per_s": rate, "lr": sched.get_last_lr()[0]})
        dist.print0(f"epoch {epoch:3d}  loss {history[-1]['train_loss']:.4f}  val loss "
                    f"{val['loss']:.4f}  val accuracy {val['accuracy']:.4f} "
                    f"({val['count']} samples)  {rate:.0f} samples/s")
    if args.checkpoint_dir:
        run.save(args.epochs, 0)
    run.prof.print_report()  # collective; a no-op without --profile
    final = finish(args, history, net, mesh, test_set, loader, train_s, run.resumed)
    if final["accuracy"] < args.min_accuracy:
        dist.print0(f"FAILED: test accuracy {final['accuracy']:.4f} < {args.min_accuracy}")
        return 1
    dist.print0("accuracy check passed")
    return 0


def finish(args, history, net, mesh, test_set, loader, train_s, append):
    """Metrics file (appended to after a resume), plot, and the summary line;
    returns the final evaluation."""
    if dist.is_root():
        with open(args.metrics, "a" if append else "w") as f:
            f.write("".join(json.dumps(h) + "\n" for h in history))
        if args.plot:
            plot(args.plot, history)
    wait = dist.allreduce(loader.wait_s / max(train_s, 1e-9), "max")
    final = data.evaluate(net, test_set, comm=mesh.dp)
    dist.print0(f"test accuracy {final['accuracy']:.4f} on {final['count']} samples; "
                f"waiting for data {100 * wait:.1f}% of training time (worst rank)")
    return final


if __name__ == "__main__":
    code = main()
    if code == 3:  # every rank stops together: finalize MPI ourselves so that
        from mpi4py import MPI  # `python -m mpi4py` keeps exit code 3 (no MPI_Abort)
        MPI.Finalize()
    sys.exit(code)
