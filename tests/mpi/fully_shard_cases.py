"""What the ``fully_shard`` tests share: the model of residual blocks, a
sharded model with its serial twin, the global batch and each rank's rows,
and the comparison with serial training on the global batch."""
import numpy as np

import spmdnet as torch
import spmdnet.distributed as dist
from spmdnet import nn
from spmdnet.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, h)
        self.down = nn.Linear(h, d)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(self.norm(x))))


class Net(nn.Module):
    """An input layer, ``blocks`` (modules) applied in order, an output layer."""

    def __init__(self, inp, d, out, blocks):
        super().__init__()
        self.embed = nn.Linear(inp, d)
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(d, out)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def models(make, seed=0, shard=True, **kwargs):
    """(``make()``, the same model kept serial); with ``shard`` each of the
    first one's blocks and then the model are fully_shard-ed with ``kwargs``."""
    torch.manual_seed(seed)
    model, serial = make(), make()
    serial.load_state_dict({k: v.clone() for k, v in model.state_dict().items()})
    if shard:
        for block in model.blocks:
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
    return model, serial


def batch(step, inp, out, rows, seed=100):
    """The global batch of a step (x, y) and this rank's ``rows`` of it."""
    rng = np.random.default_rng(seed + step)
    size, rank = dist.get_world_size(), dist.get_rank()
    x, y = rng.standard_normal((size * rows, inp)), rng.standard_normal((size * rows, out))
    mine = slice(rank * rows, (rank + 1) * rows)
    return torch.tensor(x), torch.tensor(y), torch.tensor(x[mine]), torch.tensor(y[mine])


def loss(model, x, y):
    return ((model(x) - y) ** 2).mean()


def assert_same_params(model, serial, atol=1e-12):
    named = dict(serial.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.full_tensor().array, named[name].array, rtol=0, atol=atol,
                                   err_msg=name)


def train(model, serial, steps, make_batch, lr=0.05):
    """``steps`` AdamW steps of the sharded model on each rank's rows and of
    the serial one on the global batch; returns both optimizers."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    ref = torch.optim.AdamW(serial.parameters(), lr=lr)
    for step in range(steps):
        gx, gy, x, y = make_batch(step)
        opt.zero_grad()
        loss(model, x, y).backward()
        opt.step()
        ref.zero_grad()
        loss(serial, gx, gy).backward()
        ref.step()
    return opt, ref
