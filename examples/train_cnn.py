"""A small CNN, data-parallel, with batch normalization synchronised over
all ranks (SyncBatchNorm), on the built-in handwritten digits as 1×8×8 images.

    mpirun -n 4 python examples/train_cnn.py

Every rank runs this program: the same model on each, its own share of the
digits; each BatchNorm's training statistics are those of the global batch
(one small allgather per layer in forward, one allreduce in backward), so
4 ranks with 16 samples each normalise as one process with 64 would.
"""
import argparse

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import cli, data, dist, nn, optim, parallel


def make_model(width=16):
    """conv-BN-ReLU-pool twice, then a linear classifier; input (N, 64) seen as (N, 1, 8, 8)."""
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.MaxPool2d(2),                                   # 8×8 -> 4×4
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
        nn.MaxPool2d(2),                                   # 4×4 -> 2×2
        nn.Flatten(), nn.Linear(2 * width * 4, 10))


def main(argv=None):
    p = argparse.ArgumentParser(description="A data-parallel CNN with SyncBatchNorm on the digits")
    p.add_argument("--epochs", type=cli.positive_int, default=6)
    p.add_argument("--batch-size", type=cli.positive_int, default=16,
                   help="samples per rank per step")
    p.add_argument("--width", type=cli.positive_int, default=16, help="channels of conv1")
    p.add_argument("--lr", type=cli.positive_float, default=0.05)
    p.add_argument("--data-dir", default="data")
    p.add_argument("--min-accuracy", type=cli.probability, default=0.95)
    args = p.parse_args(argv)

    dist.init()
    sn.manual_seed(0)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(make_model(args.width))  # over the world
    ddp = parallel.DataParallel(model)
    opt = optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    train, test = data.datasets.make_digits(args.data_dir)
    ds = data.HDF5Dataset(train)
    sampler = data.DistributedSampler(ds, shuffle=True, seed=0, drop_last=True)
    loader = data.DataLoader(ds, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in data.progress(loader, f"epoch {epoch}"):
            loss = F.cross_entropy(ddp(sn.Tensor(x)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        result = data.evaluate(model, data.HDF5Dataset(test))  # eval mode: running statistics
        dist.print0(f"epoch {epoch}: loss {loss.item():.3f}, accuracy {result['accuracy']:.4f}")
    return cli.self_check(result["accuracy"] >= args.min_accuracy,
                          f"test accuracy {result['accuracy']:.4f} below {args.min_accuracy}",
                          "accuracy check passed")


if __name__ == "__main__":
    dist.finalize_and_exit(main())
