"""torch.utils.data under MPI (1-4 ranks): DistributedSampler with PyTorch's
arguments (explicit and from the world) shares the dataset as documented,
the course's loader (shuffle=False, pin_memory=True, sampler=...) gives each
rank its hand-computed batches, and loader workers inside every rank leave
MPI working."""
import numpy as np
import pytest
from mpi4py import MPI

import spmdnet as torch
from spmdnet import dist
from spmdnet.utils.data import DataLoader, Dataset, TensorDataset
from spmdnet.utils.data.distributed import DistributedSampler

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD


@pytest.fixture(scope="module", autouse=True)
def world():
    return dist.init()


class Labelled(Dataset):
    def __len__(self):
        return 11

    def __getitem__(self, i):
        return np.full(2, i, np.float32), i


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_shares_cover_the_dataset_as_documented(shuffle, drop_last):
    size, rank = COMM.Get_size(), COMM.Get_rank()
    defaults = DistributedSampler(Labelled(), shuffle=shuffle, seed=3, drop_last=drop_last)
    explicit = DistributedSampler(Labelled(), num_replicas=size, rank=rank, shuffle=shuffle,
                                  seed=3, drop_last=drop_last)
    assert (defaults.num_replicas, defaults.rank) == (size, rank)
    mine = list(defaults)
    assert mine == list(explicit)
    shares = COMM.allgather(mine)
    per_rank = 11 // size if drop_last else -(-11 // size)
    assert all(len(s) == per_rank for s in shares)
    order = torch.randperm(11, generator=torch.Generator().manual_seed(3)).numpy() if shuffle else \
        np.arange(11)
    padded = np.resize(order, per_rank * size)  # pad from the start, or cut the tail
    for r, share in enumerate(shares):
        assert share == padded[r::size].tolist()
    if not drop_last:
        assert set().union(*shares) == set(range(11))


def test_the_courses_loader_gives_each_rank_its_batches():
    size, rank = COMM.Get_size(), COMM.Get_rank()
    ds = TensorDataset(torch.tensor(np.arange(12.0)), torch.tensor(np.arange(12)))
    sampler = DistributedSampler(ds, num_replicas=size, rank=rank, shuffle=False)
    loader = DataLoader(dataset=ds, batch_size=2, shuffle=False, pin_memory=True,
                        sampler=sampler)
    mine = np.resize(np.arange(12), -(-12 // size) * size)[rank::size]
    want = [mine[k:k + 2].tolist() for k in range(0, len(mine), 2)]
    assert [y.tolist() for _, y in loader] == want
    assert len(loader) == len(want)


def test_workers_inside_every_rank_leave_mpi_working():
    size, rank = COMM.Get_size(), COMM.Get_rank()
    sampler = DistributedSampler(Labelled(), shuffle=True, seed=1)
    loader = DataLoader(Labelled(), batch_size=3, sampler=sampler, num_workers=2)
    sampler.set_epoch(1)
    seen = [i for _, y in loader for i in y.tolist()]
    assert seen == list(sampler)
    total = COMM.allreduce(len(seen))
    assert total == -(-11 // size) * size
    everyone = COMM.allgather(rank)
    assert everyone == list(range(size))
