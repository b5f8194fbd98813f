"""Data-parallel training in one page (the README's example).

    mpirun -n 2 python examples/train_ddp.py

Every rank runs this program: the same model on each, its own share of the
handwritten digits, gradients averaged over all ranks in backward.
"""
import argparse

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import cli, data, dist, nn, optim
from spmdnet.nn.parallel import DistributedDataParallel as DDP


def main(argv=None):
    p = argparse.ArgumentParser(description="A data-parallel MLP on the digits")
    p.add_argument("--epochs", type=cli.positive_int, default=5)  # -1: an argparse error
    p.add_argument("--batch-size", type=cli.positive_int, default=32,
                   help="samples per rank per step")
    p.add_argument("--data-dir", default="data")
    p.add_argument("--min-accuracy", type=cli.probability, default=0.9)
    args = p.parse_args(argv)

    dist.init_process_group()                     # on MPI; one rank's exception aborts all
    sn.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    ddp = DDP(model)                              # broadcasts rank 0's weights, checks the model
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    train, test = data.datasets.make_digits(args.data_dir)  # HDF5 files, written by rank 0
    ds = data.HDF5Dataset(train)
    sampler = data.DistributedSampler(ds, shuffle=True, seed=0)
    loader = data.DataLoader(ds, batch_size=args.batch_size, sampler=sampler)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)                  # a new shuffle every epoch
        for x, y in data.progress(loader, f"epoch {epoch}"):  # prefetched; a bar in a tty
            loss = F.cross_entropy(ddp(x), y)     # x, y: Tensors, as PyTorch's loader gives
            opt.zero_grad()
            loss.backward()                       # gradients averaged over ranks, overlapped
            opt.step()
        result = data.evaluate(model, data.HDF5Dataset(test))  # exact: every sample once
        dist.print0(f"epoch {epoch}: loss {loss.item():.3f}, accuracy {result['accuracy']:.3f}")
    passed = result["accuracy"] >= args.min_accuracy  # the same on every rank
    dist.print0("accuracy check passed" if passed else f"FAILED: below {args.min_accuracy}")
    return 0 if passed else 1


if __name__ == "__main__":
    dist.finalize_and_exit(main())
