"""A small CNN, data-parallel, with batch normalization synchronised over
all ranks (SyncBatchNorm), on the built-in handwritten digits as 1×8×8 images.

    mpirun -n 4 python examples/train_cnn.py
    mpirun -n 4 python examples/train_cnn.py --augment
    mpirun -n 4 python examples/train_cnn.py --model cifar-net --data cifar_train.h5 \
        --test-data cifar_test.h5 --augment --min-accuracy 0

``--data`` takes an HDF5 file of images ``x (N, C, H, W)`` and labels ``y``,
as ``data.datasets.make_cifar10`` or ``make_mnist`` (Fashion-MNIST too) write
them; ``--augment`` adds random crops (padding 1 on 8×8 digits, 4 on 32×32
images) and, on ``--data`` images, horizontal flips (a mirrored digit is no
digit: flips cost the digits ~5 points of accuracy), seeded per rank and epoch.

Every rank runs this program: the same model on each, its own share of the
digits; each BatchNorm's training statistics are those of the global batch
(one small allgather per layer in forward, one allreduce in backward), so
4 ranks with 16 samples each normalise as one process with 64 would.
"""
import argparse

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import cli, data, dist, nn, optim, parallel


def make_model(width=16, in_channels=1, size=8):
    """conv-BN-ReLU-pool twice, then a linear classifier, on (N, C, size, size) images."""
    return nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.MaxPool2d(2),                                   # 8×8 -> 4×4
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
        nn.MaxPool2d(2),                                   # 4×4 -> 2×2
        nn.Flatten(), nn.Linear(2 * width * (size // 4) ** 2, 10))


def cifar_net(in_channels=3, size=32):
    """The course CIFAR-10 net (on 28×28 Fashion-MNIST: 1 channel, 16×4×4 features)."""
    side = ((size - 4) // 2 - 4) // 2
    return nn.Sequential(
        nn.Conv2d(in_channels, 6, 5), nn.ReLU(), nn.MaxPool2d(2, 2),   # 32 -> 28 -> 14
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2, 2),            # 14 -> 10 -> 5
        nn.Flatten(), nn.Linear(16 * side * side, 120), nn.ReLU(),     # view(-1, 400)
        nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))


def datasets(args):
    """(train, test) HDF5Datasets: the digits as 1×8×8 images, or --data / --test-data."""
    if args.data is None:
        train, test = data.datasets.make_digits(args.data_dir, layout="image")
        return data.HDF5Dataset(train), data.HDF5Dataset(test)
    train = data.HDF5Dataset(args.data)
    test = data.HDF5Dataset(args.test_data or args.data)
    data.check_same_features(train, test)
    if len(train.sample_shape) != 3 or train.sample_shape[1] != train.sample_shape[2]:
        raise ValueError(f"{args.data}: samples of shape {train.sample_shape} are not "
                         "square (C, H, W) images")
    return train, test


def augmentation(shape, flip):
    """Random crops after padding by 1/8 of the side (at least 1); mirror
    images too where that keeps the label (not on digits: a mirrored 2 is no 2)."""
    size = shape[-1]
    crop = [data.transforms.RandomCrop(size, padding=max(1, size // 8))]
    return data.transforms.Compose(crop + [data.transforms.RandomHorizontalFlip()] * flip)


def main(argv=None):
    p = argparse.ArgumentParser(description="A data-parallel CNN with SyncBatchNorm on the digits")
    p.add_argument("--epochs", type=cli.positive_int, default=6)
    p.add_argument("--batch-size", type=cli.positive_int, default=16,
                   help="samples per rank per step")
    p.add_argument("--width", type=cli.positive_int, default=16, help="channels of conv1")
    p.add_argument("--lr", type=cli.positive_float, default=0.05)
    p.add_argument("--data-dir", default="data", help="where the digits files are written")
    p.add_argument("--data", help="an HDF5 file of images x (N, C, H, W) and labels y "
                   "(default: the built-in digits)")
    p.add_argument("--test-data", help="the test file for --data (default: --data itself)")
    p.add_argument("--model", choices=["small", "cifar-net"], default="small",
                   help="small: conv-BN-pool twice; cifar-net: the course CIFAR-10 net")
    p.add_argument("--augment", action="store_true",
                   help="random crops (and flips on --data images)")
    p.add_argument("--min-accuracy", type=cli.probability, default=0.95)
    args = p.parse_args(argv)

    dist.init()
    sn.manual_seed(0)
    ds, test = datasets(args)
    channels, size = ds.sample_shape[0], ds.sample_shape[-1]
    model = (cifar_net(channels, size) if args.model == "cifar-net"
             else make_model(args.width, channels, size))
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # over the world
    ddp = parallel.DataParallel(model)
    opt = optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    sampler = data.DistributedSampler(ds, shuffle=True, seed=0, drop_last=True)
    loader = data.DataLoader(ds, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                             transform=augmentation(ds.sample_shape, flip=args.data is not None)
                             if args.augment else None)
    cli.require_steps(loader, ds, args.batch_size, dist.size())
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in data.progress(loader, f"epoch {epoch}"):
            loss = F.cross_entropy(ddp(sn.Tensor(x)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        result = data.evaluate(model, test)  # eval mode: running statistics
        dist.print0(f"epoch {epoch}: loss {loss.item():.3f}, accuracy {result['accuracy']:.4f}")
    return cli.self_check(result["accuracy"] >= args.min_accuracy,
                          f"test accuracy {result['accuracy']:.4f} below {args.min_accuracy}",
                          "accuracy check passed")


if __name__ == "__main__":
    dist.finalize_and_exit(main())
