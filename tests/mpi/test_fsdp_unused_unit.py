"""FSDP where a wrapped unit's output reaches the loss on some ranks only
(issue 26, item 7): no deadlock, and the step equals DataParallel's (the
oracle), where that unit's parameters contribute zeros on those ranks."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, optim, parallel

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        sn.manual_seed(3)
        self.body = nn.Linear(4, 5)
        self.head_a = nn.Linear(5, 3)
        self.head_b = nn.Linear(5, 3)

    def forward(self, x, use_b=True):
        h = self.body(x).tanh()
        a, b = self.head_a(h), self.head_b(h)  # every rank runs both units forward ...
        return a + b if use_b else a           # ... b reaches the loss on some ranks only


def train(wrapper_of, steps=2):
    model = TwoHeads()
    net = wrapper_of(model)
    opt = optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(dist.rank())
    for step in range(steps):
        x, y = rng.standard_normal((4, 4)), rng.integers(0, 3, 4)
        use_b = (dist.rank() + step) % 2 == 0  # rank 0 uses head b first, rank 1 then
        opt.zero_grad()
        F.cross_entropy(net(sn.tensor(x), use_b=use_b), y).backward()
        opt.step()
    state = {k: np.array(v.array if hasattr(v, "array") else v, copy=True)
             for k, v in net.state_dict().items()}
    net.close()
    return state


@pytest.mark.parametrize("reshard", [True, False])
def test_unit_reaching_the_loss_on_some_ranks_only(reshard):
    if dist.size() == 1:
        pytest.skip("needs two ranks")
    wrap = {nn.Linear}
    fsdp = train(lambda m: parallel.FullyShardedDataParallel(
        m, wrap=wrap, reshard_after_forward=reshard))
    ddp = train(lambda m: parallel.DataParallel(m))
    ddp = {k.removeprefix("module."): v for k, v in ddp.items()}
    assert fsdp.keys() == ddp.keys()
    for k in fsdp:
        np.testing.assert_allclose(fsdp[k], ddp[k], rtol=1e-12, atol=1e-12, err_msg=k)
