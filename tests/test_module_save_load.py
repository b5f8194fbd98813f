"""Whole-module pickling, as PyTorch's word_language_model example does it:
``save(model, f)``, then ``load(f, weights_only=True)`` inside
``serialization.safe_globals([...])`` naming the ``nn.modules.*`` classes
(the paths a pickle records, PyTorch's file names)."""
import io
from pathlib import Path

import numpy as np
import pytest

import spmdnet as sn
from spmdnet import nn
from spmdnet.distributed.optim import ZeroRedundancyOptimizer
from spmdnet.serialization import safe_globals

FIXTURES = Path(__file__).parent / "fixtures" / "torch_files"


class RNNModel(nn.Module):
    """The word_language_model example's model, small."""

    def __init__(self, ntoken=11, ninp=4, nhid=5):
        super().__init__()
        self.drop = nn.Dropout(0.5)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, 1)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
        return self.decoder(self.drop(out)), hidden


SAFE = [nn.modules.sparse.Embedding, nn.modules.rnn.LSTM, nn.modules.dropout.Dropout,
        nn.modules.linear.Linear, RNNModel]


def test_each_class_records_pytorchs_module_path():
    assert [c.__module__ for c in SAFE[:4]] == [
        "spmdnet.nn.modules.sparse", "spmdnet.nn.modules.rnn", "spmdnet.nn.modules.dropout",
        "spmdnet.nn.modules.linear"]
    assert nn.Sequential.__module__ == "spmdnet.nn.modules.container"
    assert nn.Module.__module__ == "spmdnet.nn.modules.module"
    assert nn.DataParallel.__module__ == "spmdnet.nn.parallel.data_parallel"
    assert nn.parallel.DistributedDataParallel.__module__ == "spmdnet.nn.parallel.distributed"
    assert ZeroRedundancyOptimizer.__module__ == (
        "spmdnet.distributed.optim.zero_redundancy_optimizer")
    assert nn.Parameter.__module__ == "spmdnet.nn.parameter"


def test_a_whole_model_saves_and_loads_under_safe_globals():
    sn.manual_seed(0)
    model = RNNModel().eval()
    x = sn.tensor(np.array([[1, 2], [3, 4], [5, 6]]))
    hidden = (sn.zeros((1, 2, 5)), sn.zeros((1, 2, 5)))
    want, _ = model(x, hidden)
    buf = io.BytesIO()
    sn.save(model, buf)
    buf.seek(0)
    with safe_globals(SAFE):
        loaded = sn.load(buf, weights_only=True)
    assert type(loaded) is RNNModel and loaded is not model
    assert [type(m) for m in loaded.children()] == [nn.Dropout, nn.Embedding, nn.LSTM,
                                                     nn.Linear]
    assert not loaded.training and loaded.rnn.hidden_size == 5
    got, _ = loaded(x, hidden)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    for (k, a), (k2, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert k == k2
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # the loaded model takes hooks like any other (its hook tables came back empty)
    seen = []
    loaded.decoder.register_forward_hook(lambda m, a, o: seen.append(o.shape))
    loaded(x, hidden)
    assert seen == [(3, 2, 11)]


def test_a_class_not_admitted_is_refused_naming_it():
    buf = io.BytesIO()
    sn.save(RNNModel(), buf)
    buf.seek(0)
    with safe_globals(SAFE[:1] + SAFE[2:]), pytest.raises(Exception, match="LSTM"):
        sn.load(buf, weights_only=True)


def test_a_module_pytorch_saved_whole_loads_with_its_weights():
    ref = np.load(FIXTURES / "whole_sequential.npz")
    with safe_globals([nn.Sequential, nn.Embedding, nn.Dropout, nn.Linear]):
        seq = sn.load(FIXTURES / "whole_sequential.pt", weights_only=True)
    assert [type(m) for m in seq] == [nn.Embedding, nn.Dropout, nn.Linear]
    for key, value in seq.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), ref[key])
    np.testing.assert_allclose(seq(sn.tensor(ref["idx"])).numpy(), ref["y"], rtol=1e-6)
