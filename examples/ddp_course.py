"""The course's DistributedDataParallel program, as a PyTorch user writes it,
with `torch` spelled `spmdnet` in the import lines.

    python examples/ddp_course.py                  # spawn starts 2 MPI ranks
    mpirun -n 2 python examples/ddp_course.py      # the ranks exist: spawn runs
                                                   # train() on each of them
    python examples/ddp_course.py --world-size 4 --epochs 3

Each rank trains a small classifier on its DistributedSampler shard of a
synthetic 4-class dataset; DistributedDataParallel averages the gradients,
so every rank ends with the same model. Rank 0 prints the loss per epoch
and the final accuracy on the whole dataset.
"""
import argparse
import os

import spmdnet as torch
import spmdnet.distributed as dist
import spmdnet.multiprocessing as mp
import spmdnet.nn as nn
import spmdnet.nn.functional as F
from spmdnet.nn.parallel import DistributedDataParallel as DDP
from spmdnet.utils.data import DataLoader, TensorDataset
from spmdnet.utils.data.distributed import DistributedSampler


class Net(nn.Module):
    def __init__(self, features=8, classes=4):
        super().__init__()
        self.fc1 = nn.Linear(features, 32)
        self.fc2 = nn.Linear(32, classes)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def make_dataset(n=512, features=8, classes=4):
    """Gaussian clusters around one centre per class (the same on every rank)."""
    torch.manual_seed(1234)
    centres = torch.randn(classes, features) * 3
    labels = torch.randint(0, classes, (n,))
    return TensorDataset(centres[labels] + torch.randn(n, features), labels)


def setup(rank, world_size):
    os.environ.setdefault("MASTER_ADDR", "localhost")  # as the course does; MPI ignores it
    os.environ.setdefault("MASTER_PORT", "12355")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


def train(rank, world_size, epochs, batch_size):
    setup(rank, world_size)
    dataset = make_dataset()
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True)
    loader = DataLoader(dataset=dataset, batch_size=batch_size, shuffle=False,
                        pin_memory=True, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(Net(), device_ids=None)
    criterion = nn.NLLLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2)  # loss sum, samples
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = criterion(model(inputs), targets)
            loss.backward()
            optimizer.step()
            total += torch.tensor([loss.item() * len(targets), len(targets)])
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        if rank == 0:
            print(f"epoch {epoch}: loss {total[0].item() / total[1].item():.4f}", flush=True)
    with torch.no_grad():
        inputs, targets = dataset.tensors
        accuracy = (model(inputs).argmax(dim=1) == targets).float().mean()
    if rank == 0:
        print(f"accuracy {accuracy.item():.3f} on {world_size} ranks", flush=True)
    cleanup()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", 2)))
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    mp.spawn(train, args=(args.world_size, args.epochs, args.batch_size),
             nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
