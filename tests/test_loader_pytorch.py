"""spmdnet.utils.data as PyTorch documents torch.utils.data: default_collate's
structure, the dataset classes, random_split, the samplers' orders and
errors, and the DataLoader's arguments, hand-computed batches, len, the
batched read of spmdnet's datasets giving what per-item collation gives, and
exact resume with a RandomSampler."""
import collections
import json

import numpy as np
import pytest

import spmdnet as torch
from spmdnet.utils.data import (ArrayDataset, BatchSampler, ChainDataset, ConcatDataset,
                                DataLoader, Dataset, IterableDataset, RandomSampler,
                                SequentialSampler, Subset, SubsetRandomSampler, TensorDataset,
                                TokenDataset, WeightedRandomSampler, default_collate,
                                default_convert, random_split)
from spmdnet.utils.data.distributed import DistributedSampler


def values(batch):
    """A batch with every Tensor replaced by (dtype name, nested list)."""
    if isinstance(batch, torch.Tensor):
        return (str(batch.array.dtype), batch.tolist())
    if isinstance(batch, dict):
        return {k: values(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and not isinstance(batch, str):
        return type(batch)(values(b) for b in batch) if not hasattr(batch, "_fields") \
            else type(batch)(*(values(b) for b in batch))
    return batch


class Items(Dataset):
    """Per-item samples of any structure: ``make(i)``."""

    def __init__(self, n, make):
        self.n, self.make = n, make

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.make(i)


# -- default_collate ------------------------------------------------------------------
def test_collate_of_tuples_is_a_list_of_batches_numbers_typed_as_pytorch():
    got = default_collate([(1, 2.0, "a", True), (3, 4.0, "b", False)])
    assert isinstance(got, list)
    assert values(got) == [("int64", [1, 3]), ("float64", [2.0, 4.0]), ("a", "b"),
                           ("bool", [True, False])]


def test_collate_of_dicts_nested_and_namedtuples():
    Point = collections.namedtuple("Point", "x y")
    samples = [{"img": np.full((2,), i, np.float32), "meta": {"id": i, "p": Point(i, -i)},
                "seq": [i, 10 * i]} for i in range(3)]
    got = default_collate(samples)
    assert values(got["img"]) == ("float32", [[0, 0], [1, 1], [2, 2]])
    assert values(got["meta"]["id"]) == ("int64", [0, 1, 2])
    assert isinstance(got["meta"]["p"], Point)
    assert values(got["meta"]["p"]) == Point(("int64", [0, 1, 2]), ("int64", [0, -1, -2]))
    assert values(got["seq"]) == [("int64", [0, 1, 2]), ("int64", [0, 10, 20])]


def test_collate_stacks_tensors_and_numpy_keeping_dtype():
    got = default_collate([torch.tensor(np.array([1, 2], np.int32)),
                           torch.tensor(np.array([3, 4], np.int32))])
    assert values(got) == ("int32", [[1, 2], [3, 4]])
    assert values(default_collate([np.float32(1.5), np.float32(2.5)])) == ("float32",
                                                                          [1.5, 2.5])
    assert values(default_collate([np.array(1.0), np.array(2.0)])) == ("float64", [1.0, 2.0])


def test_collate_errors_as_pytorch():
    with pytest.raises(RuntimeError, match="each element in list of batch should be of equal "
                                           "size"):
        default_collate([[1, 2], [3]])
    with pytest.raises(TypeError, match="found <class 'object'>"):
        default_collate([object(), object()])
    with pytest.raises(TypeError, match="found <U1"):
        default_collate([np.array(["a"]), np.array(["b"])])
    with pytest.raises(RuntimeError, match=r"equal size, but got shapes \[\(2,\), \(3,\)\]"):
        default_collate([np.zeros(2), np.zeros(3)])


def test_default_convert_walks_containers_and_keeps_the_rest():
    got = default_convert((1, np.ones(2), "s", {"a": np.float64(2)}))
    assert got[0] == 1 and got[2] == "s" and isinstance(got, list)
    assert values(got[1]) == ("float64", [1.0, 1.0]) and values(got[3]["a"]) == ("float64", 2.0)
    strings = np.array(["a"])
    assert default_convert([strings])[0] is strings


# -- datasets -------------------------------------------------------------------------
def test_tensor_subset_concat_and_chain_datasets():
    ds = TensorDataset(torch.tensor(np.arange(5.0)), torch.tensor(np.arange(5) * 10))
    assert len(ds) == 5 and [t.item() for t in ds[3]] == [3.0, 30]
    with pytest.raises(ValueError, match=r"first dimensions \[3, 4\]"):
        TensorDataset(torch.ones(3), torch.ones(4))
    sub = Subset(ds, [4, 0])
    assert len(sub) == 2 and sub[0][1].item() == 40 and [s[1].item() for s in sub[[1, 0]]] == \
        [0, 40]
    cat = ds + Subset(ds, [1])
    assert isinstance(cat, ConcatDataset) and len(cat) == 6
    assert [cat[i][1].item() for i in (0, 4, 5, -1, -6)] == [0, 40, 10, 10, 0]
    with pytest.raises(ValueError, match="index should not exceed dataset length"):
        cat[-7]
    with pytest.raises(ValueError, match="empty iterable"):
        ConcatDataset([])

    class Stream(IterableDataset):
        def __init__(self, items):
            self.items = items

        def __iter__(self):
            return iter(self.items)

    with pytest.raises(TypeError, match="does not support IterableDataset"):
        ConcatDataset([Stream([1])])
    chained = Stream([1, 2]) + Stream([3])
    assert isinstance(chained, ChainDataset) and list(chained) == [1, 2, 3]
    with pytest.raises(NotImplementedError, match="__getitem__"):
        Dataset()[0]


def test_random_split_lengths_fractions_disjointness_and_errors():
    parts = random_split(range(10), [0.33, 0.33, 0.34], generator=torch.Generator().manual_seed(0))
    assert [len(p) for p in parts] == [4, 3, 3]  # floors 3, 3, 3; the remainder to the first
    assert sorted(i for p in parts for i in p) == list(range(10))
    assert [len(p) for p in random_split(range(11), [0.5, 0.5])] == [6, 5]
    again = random_split(range(10), [0.33, 0.33, 0.34], generator=torch.Generator().manual_seed(0))
    assert [list(p) for p in again] == [list(p) for p in parts]
    with pytest.raises(ValueError, match=r"sum to 6, not to the dataset's length 10"):
        random_split(range(10), [3, 3])
    with pytest.warns(UserWarning) as warned:
        empty = random_split(range(2), [0.9, 0.05, 0.05])  # floors 1, 0, 0: then 2, 0, 0
    assert [len(p) for p in empty] == [2, 0, 0]
    assert ["index 1 is 0" in str(w.message) for w in warned] == [True, False]


# -- samplers -------------------------------------------------------------------------
def test_sequential_random_and_subset_random_orders():
    assert list(SequentialSampler(range(4))) == [0, 1, 2, 3]
    rs = RandomSampler(range(50), generator=torch.Generator().manual_seed(1))
    first, second = list(rs), list(rs)
    assert sorted(first) == sorted(second) == list(range(50)) and first != second
    long = list(RandomSampler(range(7), num_samples=17, generator=torch.Generator().manual_seed(2)))
    assert len(long) == 17  # two whole permutations, then 3 distinct indices
    assert sorted(long[:7]) == sorted(long[7:14]) == list(range(7)) and len(set(long[14:])) == 3
    drawn = list(RandomSampler(range(3), replacement=True, num_samples=3000,
                               generator=torch.Generator().manual_seed(3)))
    counts = np.bincount(drawn, minlength=3)
    assert len(drawn) == 3000 and counts.min() > 900  # uniform: 1000 each, +-4 sigma
    assert sorted(SubsetRandomSampler([5, 9, 2])) == [2, 5, 9]
    with pytest.raises(TypeError, match="replacement should be a boolean value"):
        RandomSampler(range(3), replacement=1)
    with pytest.raises(ValueError, match="num_samples should be a positive integer value, but "
                                         "got num_samples=0"):
        RandomSampler(range(3), num_samples=0)


def test_weighted_random_sampler_follows_the_weights():
    s = WeightedRandomSampler([0.0, 1.0, 3.0], 4000, generator=torch.Generator().manual_seed(4))
    counts = np.bincount(list(s), minlength=3)
    assert counts[0] == 0 and abs(counts[2] / counts[1] - 3.0) < 0.4 and len(s) == 4000
    once = list(WeightedRandomSampler([1, 1, 1, 5], 4, replacement=False,
                                      generator=torch.Generator().manual_seed(5)))
    assert sorted(once) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="replacement should be a boolean value"):
        WeightedRandomSampler([1, 2], 3, replacement=2)
    with pytest.raises(ValueError, match="non-negative"):
        WeightedRandomSampler([1, -2], 3)
    with pytest.raises(ValueError, match="cannot draw 3 samples without replacement from 2"):
        WeightedRandomSampler([1, 0, 2], 3, replacement=False)


def test_batch_sampler_batches_and_len():
    assert list(BatchSampler(range(7), 3, False)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(BatchSampler(range(7), 3, True)) == [[0, 1, 2], [3, 4, 5]]
    assert len(BatchSampler(range(7), 3, False)) == 3 and len(BatchSampler(range(7), 3,
                                                                           True)) == 2
    with pytest.raises(ValueError, match="batch_size should be a positive integer value"):
        BatchSampler(range(3), 0, False)
    with pytest.raises(ValueError, match="drop_last should be a boolean value"):
        BatchSampler(range(3), 2, 1)


def test_distributed_sampler_takes_pytorchs_arguments_at_pytorchs_path():
    ds = list(range(10))
    shares = [list(DistributedSampler(dataset=ds, num_replicas=3, rank=r, shuffle=False))
              for r in range(3)]
    assert shares == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]  # padded from the start
    assert list(DistributedSampler(ds, 3, 2, shuffle=False, seed=0, drop_last=True)) == \
        [2, 5, 8]
    assert torch.utils.data.distributed.DistributedSampler is DistributedSampler


# -- the DataLoader -------------------------------------------------------------------
def test_loader_errors_as_pytorch():
    ds = Items(10, lambda i: i)
    bs = BatchSampler(SequentialSampler(ds), 3, False)
    cases = [(dict(shuffle=True, sampler=SequentialSampler(ds)), "mutually exclusive with "
                                                                   "shuffle"),
             (dict(batch_sampler=bs, batch_size=2), "batch_sampler option is mutually"),
             (dict(batch_sampler=bs, drop_last=True), "batch_sampler option is mutually"),
             (dict(batch_size=None, drop_last=True), "disables auto-batching"),
             (dict(num_workers=-1), "num_workers option should be non-negative"),
             (dict(timeout=-1), "timeout option should be non-negative"),
             (dict(prefetch_factor=2), "prefetch_factor option could only be specified"),
             (dict(persistent_workers=True), "persistent_workers option needs num_workers")]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            DataLoader(ds, **kwargs)

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(5))

    for name in ("shuffle", "sampler", "batch_sampler"):
        with pytest.raises(ValueError, match=f"expected unspecified {name} option"):
            DataLoader(Stream(), **{name: True if name == "shuffle" else [[1]]})


def test_hand_computed_batches_of_per_item_samples():
    ds = Items(5, lambda i: {"x": np.array([i, -i], np.float32), "label": i % 2})
    batches = list(DataLoader(ds, batch_size=2))
    assert len(batches) == 3 == len(DataLoader(ds, batch_size=2))
    assert values(batches[0]) == {"x": ("float32", [[0, 0], [1, -1]]), "label": ("int64", [0, 1])}
    assert values(batches[2]) == {"x": ("float32", [[4, -4]]), "label": ("int64", [0])}
    assert len(DataLoader(ds, batch_size=2, drop_last=True)) == 2
    unbatched = list(DataLoader(Items(3, lambda i: (np.int64(i), "s")), batch_size=None))
    assert values(unbatched) == [[("int64", 0), "s"], [("int64", 1), "s"], [("int64", 2), "s"]]
    by_batch = DataLoader(ds, batch_sampler=[[4, 0], [2]], collate_fn=lambda b: [s["label"]
                                                                                 for s in b])
    assert list(by_batch) == [[0, 0], [0]] and len(by_batch) == 2


def test_getitems_result_goes_to_collate_fn():
    class Batched(Items):
        def __getitems__(self, indices):
            self.calls.append(list(indices))
            return [10 * i for i in indices]

    ds = Batched(5, None)
    ds.calls = []
    assert [b.tolist() for b in DataLoader(ds, batch_size=3)] == [[0, 10, 20], [30, 40]]
    assert ds.calls == [[0, 1, 2], [3, 4]]


def test_shuffle_is_a_random_permutation_per_epoch():
    ds = Items(20, lambda i: i)
    loader = DataLoader(ds, batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(0))
    one = [i for b in loader for i in b.tolist()]
    two = [i for b in loader for i in b.tolist()]
    assert sorted(one) == sorted(two) == list(range(20)) and one != two


@pytest.mark.parametrize("make", [
    lambda x, y: ArrayDataset(x, y),
    lambda x, y: TensorDataset(torch.tensor(x), torch.tensor(y)),
    lambda x, y: Subset(ArrayDataset(x, y), list(range(len(x)))),
])
def test_batched_read_gives_what_per_item_collation_gives(make):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((11, 2, 3)).astype(np.float32), np.arange(11) * 3
    ds = make(x, y)
    sampler = RandomSampler(ds, generator=torch.Generator().manual_seed(7))
    fast = DataLoader(ds, batch_size=4, sampler=sampler, device="cpu")
    per_item = DataLoader(ds, batch_size=4, sampler=sampler, device="cpu",
                          collate_fn=lambda samples: default_collate(samples))
    assert fast._read_in_batches and not per_item._read_in_batches
    sampler.load_state_dict({"seed": 123})
    a = [values(b) for b in fast]
    sampler.load_state_dict({"seed": 123})
    b = [values(b) for b in per_item]
    assert a == b and isinstance(next(iter(fast)), list)


def test_token_dataset_batches_are_its_windows():
    ds = TokenDataset(np.arange(40), 4, windows="strided")
    x, y = next(iter(DataLoader(ds, batch_size=3, device="cpu")))
    assert x.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert y.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]


def test_resume_mid_pass_with_a_random_sampler_replays_its_order():
    ds = Items(23, lambda i: i)
    for stop in range(1, 5):  # 5 batches: stopped inside the pass
        loader = DataLoader(ds, batch_size=5, shuffle=True,
                            generator=torch.Generator().manual_seed(9))
        whole, state = [], None
        for k, b in enumerate(loader):
            whole.append(b.tolist())
            if k + 1 == stop:
                state = json.loads(json.dumps(loader.state_dict()))
        resumed = DataLoader(ds, batch_size=5, shuffle=True)
        resumed.load_state_dict(state)
        assert len(resumed) == 5 - stop
        assert whole[:stop] + [b.tolist() for b in resumed] == whole
        assert resumed.state_dict() == {"batch_size": 5, "sampler": None, "batches_done": 0}
    assert state_after_a_whole_pass(ds) == {"batch_size": 5, "sampler": None, "batches_done": 0}


def state_after_a_whole_pass(ds):
    """A complete pass: the next one is a new order, from its start."""
    loader = DataLoader(ds, batch_size=5, shuffle=True)
    list(loader)
    return loader.state_dict()
