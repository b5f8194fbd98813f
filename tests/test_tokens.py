"""Token data: the character tokenizer's round trip, TokenDataset windows
(content and count in every window mode, against a plain-Python slicing
reference), coverage under the DistributedSampler and DataLoader, and the
text writer (split, vocabulary, the shipped corpus)."""
import json

import h5py
import numpy as np
import pytest

from spmdnet.data import (CharTokenizer, DataLoader, DistributedSampler, TokenDataset,
                          datasets, unigram_entropy)
from spmdnet.utils.data.tokens import CORPUS
from tests.test_hdf5 import Solo

TEXT = "Down, down, down. Would the fall never come to an end?\n\"Oh dear!\" (\u00e9)"


def test_tokenizer_round_trips_text_and_its_state():
    tok = CharTokenizer(TEXT)
    assert tok.vocab_size == len(set(TEXT)) and tok.chars == "".join(sorted(set(TEXT)))
    ids = tok.encode(TEXT)
    assert ids.dtype == np.int64 and ids.shape == (len(TEXT),)
    assert tok.decode(ids) == TEXT and tok.decode(ids[3:9]) == TEXT[3:9]
    again = CharTokenizer.from_state_dict(json.loads(json.dumps(tok.state_dict())))
    assert np.array_equal(again.encode(TEXT), ids) and tok.encode("").size == 0
    with pytest.raises(ValueError, match="'Z'"):
        tok.encode("Z")
    with pytest.raises(ValueError, match="ids must be in"):
        tok.decode([tok.vocab_size])


def test_unigram_entropy_is_that_of_the_frequencies():
    assert unigram_entropy([0, 1, 0, 1]) == pytest.approx(np.log(2))
    assert unigram_entropy([3, 3, 3]) == pytest.approx(0.0)


@pytest.mark.parametrize("n,block", [(10, 3), (11, 3), (4, 3), (25, 1), (17, 16)])
@pytest.mark.parametrize("windows", ["all", "strided"])
def test_windows_are_the_next_token_slices(n, block, windows):
    tokens = np.arange(100, 100 + n, dtype=np.uint16)
    ds = TokenDataset(tokens, block, windows=windows)
    stride = 1 if windows == "all" else block
    starts = [s for s in range(0, n, stride) if s + block + 1 <= n]  # the reference
    assert len(ds) == len(starts) == (n - block if windows == "all" else (n - 1) // block)
    x, y = ds[np.arange(len(ds))]
    assert x.dtype == y.dtype == np.int64 and x.shape == y.shape == (len(ds), block)
    for i, s in enumerate(starts):
        assert x[i].tolist() == list(tokens[s:s + block])
        assert y[i].tolist() == list(tokens[s + 1:s + block + 1])
    order = np.array([len(ds) - 1, 0, -1])
    assert np.array_equal(ds[order][0], x[[len(ds) - 1, 0, len(ds) - 1]])
    with pytest.raises(IndexError):
        ds[np.array([len(ds)])]


def test_strided_windows_predict_every_target_once():
    ds = TokenDataset(np.arange(50), 7, windows="strided")
    _, y = ds[np.arange(len(ds))]
    assert sorted(y.ravel().tolist()) == list(range(1, 1 + 7 * len(ds)))


@pytest.mark.parametrize("n,block", [(12, 3), (9, 8), (40, 5)])
def test_random_windows_are_fresh_per_epoch_and_reproducible(n, block):
    tokens = np.arange(100, 100 + n)
    ds = TokenDataset(tokens, block, windows="random", seed=7)
    assert len(ds) == (n - 1) // block  # as many as the strided windows
    every = np.arange(len(ds))
    seen, per_epoch = set(), []
    for epoch in range(60):
        ds.set_epoch(epoch)
        x, y = ds[every]
        starts = x[:, 0] - 100
        for i, s in enumerate(starts.tolist()):  # next-token slices of a valid start
            assert 0 <= s <= n - block - 1
            assert x[i].tolist() == list(tokens[s:s + block])
            assert y[i].tolist() == list(tokens[s + 1:s + block + 1])
        assert np.array_equal(ds.starts(every[::-1]), starts[::-1])  # fixed within the epoch
        seen |= set(starts.tolist())
        per_epoch.append(starts)
    assert seen == set(range(n - block))  # every valid start drawn, over the epochs
    if n - block > 2:
        assert any(not np.array_equal(per_epoch[0], p) for p in per_epoch[1:])  # fresh
    again = TokenDataset(tokens, block, windows="random", seed=7)  # another rank, or a resume
    again.set_epoch(5)
    assert np.array_equal(again[every][0][:, 0] - 100, per_epoch[5])
    other = TokenDataset(np.arange(1000), 4, windows="random", seed=8)
    same = TokenDataset(np.arange(1000), 4, windows="random", seed=7)
    assert not np.array_equal(other.starts(np.arange(len(other))),
                              same.starts(np.arange(len(same))))


def test_random_windows_under_the_sampler_and_loader():
    ds = TokenDataset(np.arange(203), 8, windows="random", seed=1)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        got = []
        for rank in range(3):
            sampler = DistributedSampler(ds, num_replicas=3, rank=rank, seed=3, drop_last=True)
            sampler.set_epoch(epoch)
            for x, y in DataLoader(ds, 4, sampler=sampler):
                assert np.array_equal(y[:, :-1], x[:, 1:])
                got += x[:, 0].tolist()
        whole = DistributedSampler(ds, 1, 0, seed=3, drop_last=True)
        whole.set_epoch(epoch)
        want = ds.starts(whole.global_indices()[:len(got)])
        assert sorted(got) == sorted(want.tolist())


def test_random_windows_follow_the_samplers_epoch_and_its_resume():
    """The sampler tells the dataset its epoch: on set_epoch, and when a
    resumed run loads the sampler's state (no second call to forget)."""
    ds = TokenDataset(np.arange(500), 8, windows="random", seed=4)
    sampler = DistributedSampler(ds, 1, 0, seed=3)
    sampler.set_epoch(2)
    epoch2 = ds.starts(np.arange(len(ds)))
    assert ds.epoch == 2
    resumed_ds = TokenDataset(np.arange(500), 8, windows="random", seed=4)
    resumed = DistributedSampler(resumed_ds, 1, 0, seed=3)
    resumed.load_state_dict(sampler.state_dict())
    np.testing.assert_array_equal(resumed_ds.starts(np.arange(len(ds))), epoch2)
    fresh = TokenDataset(np.arange(500), 8, windows="random", seed=4)
    assert not np.array_equal(fresh.starts(np.arange(len(ds))), epoch2)  # epoch 0's


def test_bad_arguments_fail_with_a_message(tmp_path):
    with pytest.raises(ValueError, match="block_size"):
        TokenDataset(np.arange(10), 0)
    with pytest.raises(ValueError, match="windows"):
        TokenDataset(np.arange(10), 2, windows="overlapping")
    with pytest.raises(ValueError, match="fewer than block_size"):
        TokenDataset(np.arange(4), 4)
    with pytest.raises(ValueError, match="1-D integer"):
        TokenDataset(np.zeros((3, 4), np.int64), 2)
    with pytest.raises(FileNotFoundError, match="missing.h5"):
        TokenDataset(tmp_path / "missing.h5", 2)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_distributed_sampler_and_loader_cover_every_window(tmp_path, size):
    path = tmp_path / "t.h5"
    with h5py.File(path, "w") as f:
        f["tokens"] = np.arange(203, dtype=np.uint16)
    ds = TokenDataset(path, 8)
    seen = []
    for rank in range(size):
        sampler = DistributedSampler(ds, num_replicas=size, rank=rank, seed=3)
        sampler.set_epoch(1)
        for x, y in DataLoader(ds, 5, sampler=sampler):
            assert np.array_equal(y[:, :-1], x[:, 1:]) and bool((y[:, -1] == x[:, -1] + 1).all())
            seen += x[:, 0].tolist()
    assert set(seen) == set(range(len(ds)))  # every window start; padding repeats a few
    assert len(seen) == -(-len(ds) // size) * size


def test_make_text_writes_the_split_and_the_vocabulary(tmp_path):
    source = tmp_path / "in.txt"
    source.write_text(TEXT * 5, encoding="utf-8")
    train, val, vocab = datasets.make_text(source, tmp_path / "out", val_fraction=0.2,
                                           comm=Solo())
    tok = CharTokenizer.from_state_dict(json.loads(open(vocab, encoding="utf-8").read()))
    with h5py.File(train) as f, h5py.File(val) as g:
        a, b = f["tokens"][...], g["tokens"][...]
    assert len(b) == round(0.2 * len(TEXT) * 5) and tok.decode(np.concatenate([a, b])) == \
        TEXT * 5
    assert len(TokenDataset(val, 4, windows="strided")) == (len(b) - 1) // 4
    same = datasets.make_text(TEXT * 5, tmp_path / "again", val_fraction=0.2, comm=Solo())
    with h5py.File(same[0]) as f:
        assert np.array_equal(f["tokens"][...], a)
    with pytest.raises(FileNotFoundError, match="nothere.txt"):
        datasets.make_text(str(tmp_path / "nothere.txt"), tmp_path, comm=Solo())


def test_the_shipped_corpus_is_real_text_and_the_default(tmp_path):
    text = CORPUS.read_text(encoding="utf-8")
    assert len(text) > 10000 and text.isascii() and "Alice" in text
    train, val, _ = datasets.make_text(None, tmp_path, comm=Solo())
    with h5py.File(train) as f, h5py.File(val) as g:
        assert len(f["tokens"]) + len(g["tokens"]) == len(text)
    assert 2.5 < unigram_entropy(CharTokenizer(text).encode(text)) < 3.5  # English letters
