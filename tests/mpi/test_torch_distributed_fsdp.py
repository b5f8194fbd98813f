"""FSDP and ZeroRedundancyOptimizer at PyTorch's paths with PyTorch's
arguments (issue 24 item 7): each sharding strategy trains as serial
training on the global batch, the auto-wrap policies pick the modules
PyTorch's documented recursion picks (hand-counted parameter numbers), the
state-dict type, and the strategies we do not build raise."""
import functools

import numpy as np
import pytest

import spmdnet as torch
import spmdnet.distributed as dist
import spmdnet.nn.functional as F
from spmdnet import nn
from spmdnet.distributed.fsdp import (CPUOffload, FullStateDictConfig,
                                      FullyShardedDataParallel as FSDP, ShardingStrategy,
                                      StateDictType)
from spmdnet.distributed.fsdp.wrap import (ModuleWrapPolicy, size_based_auto_wrap_policy,
                                           transformer_auto_wrap_policy, wrapped_modules)
from spmdnet.distributed.optim import ZeroRedundancyOptimizer
from spmdnet.parallel import DataParallel

pytestmark = pytest.mark.mpi
GLOBAL_BATCH = 12


@pytest.fixture(scope="module", autouse=True)
def process_group():
    if not dist.is_initialized():
        dist.init_process_group("gloo")


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)   # width^2 + width parameters

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(3, 6)                               # 24
        self.blocks = nn.ModuleList([Block(6), Block(6)])        # 42 each
        self.out = nn.Linear(6, 2)                               # 14

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


def net():
    torch.manual_seed(0)
    return Net().double()


def batch():
    rng = np.random.default_rng(3)
    return rng.standard_normal((GLOBAL_BATCH, 3)), rng.standard_normal((GLOBAL_BATCH, 2))


def train(model, params, x, y, steps=3):
    opt = torch.optim.SGD(params, lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(model(torch.tensor(x)), torch.tensor(y)).backward()
        opt.step()


def serial_state():
    model = net()
    x, y = batch()
    train(model, model.parameters(), x, y)
    return model.state_dict()


def shard():
    r, n = dist.get_rank(), dist.get_world_size()
    x, y = batch()
    rows = slice(r * GLOBAL_BATCH // n, (r + 1) * GLOBAL_BATCH // n)
    return x[rows], y[rows]


@pytest.mark.parametrize("strategy", [None, ShardingStrategy.FULL_SHARD,
                                      ShardingStrategy.SHARD_GRAD_OP,
                                      ShardingStrategy.NO_SHARD])
def test_each_strategy_trains_as_serial_on_the_global_batch(strategy):
    model = FSDP(net(), sharding_strategy=strategy, device_id=0, sync_module_states=True,
                 auto_wrap_policy=ModuleWrapPolicy({Block}), use_orig_params=True)
    x, y = shard()
    train(model, model.parameters(), x, y)
    want = serial_state()
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
        state = model.state_dict()
    everywhere = model.state_dict()  # collective: outside the block, on every rank
    assert sorted(everywhere) == sorted(want)
    if dist.get_rank() != 0:
        assert state == {}
        return
    assert sorted(state) == sorted(want)
    for key in want:
        np.testing.assert_allclose(state[key].numpy(), want[key].numpy(), rtol=1e-10,
                                   atol=1e-12, err_msg=key)


def test_wrap_policies_pick_what_pytorch_recursion_picks():
    model = net()
    names = {id(m): n for n, m in model.named_modules()}

    def picked(policy):
        return sorted(names[i] for i in wrapped_modules(model, policy))

    assert picked(ModuleWrapPolicy({Block})) == ["blocks.0", "blocks.1"]
    assert picked(functools.partial(transformer_auto_wrap_policy,
                                    transformer_layer_cls={Block, nn.Linear})) == \
        ["blocks.0", "blocks.0.fc", "blocks.1", "blocks.1.fc", "inp", "out"]
    # children first: each block's fc (42) wraps at 40, leaving its block 0 unwrapped
    # parameters; the ModuleList is excluded by default; inp (24) and out (14) stay below
    size40 = functools.partial(size_based_auto_wrap_policy, min_num_params=40)
    assert picked(size40) == ["blocks.0.fc", "blocks.1.fc"]
    # at 20: inp (24) too; the blocks' leftover after their fc was wrapped is 0 < 20
    size20 = functools.partial(size_based_auto_wrap_policy, min_num_params=20)
    assert picked(size20) == ["blocks.0.fc", "blocks.1.fc", "inp"]
    model_fsdp = FSDP(net(), auto_wrap_policy=size20)
    assert sorted(u.name for u in model_fsdp.units if u.name) == ["blocks.0.fc",
                                                                  "blocks.1.fc", "inp"]


def test_strategies_and_options_we_do_not_build_raise():
    for strategy in (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2):
        with pytest.raises(NotImplementedError, match="HYBRID"):
            FSDP(net(), sharding_strategy=strategy)
    with pytest.raises(NotImplementedError, match="cpu_offload"):
        FSDP(net(), cpu_offload=CPUOffload(offload_params=True))
    with pytest.raises(NotImplementedError, match="SHARDED_STATE_DICT"):
        FSDP.set_state_dict_type(net(), StateDictType.SHARDED_STATE_DICT)


def test_zero_redundancy_optimizer_with_pytorch_arguments_equals_serial():
    x, y = shard()
    model = DataParallel(net())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                  process_group=None, parameters_as_bucket_view=True, lr=0.01)
    serial = net()
    serial_opt = torch.optim.Adam(serial.parameters(), lr=0.01)
    gx, gy = batch()
    for _ in range(3):
        opt.zero_grad()
        F.mse_loss(model(torch.tensor(x)), torch.tensor(y)).backward()
        opt.step()
        serial_opt.zero_grad()
        F.mse_loss(serial(torch.tensor(gx)), torch.tensor(gy)).backward()
        serial_opt.step()
    for p, q in zip(model.module.parameters(), serial.parameters()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-9, atol=1e-12)
    model.close()
    with pytest.raises(NotImplementedError, match="overlap_with_ddp"):
        ZeroRedundancyOptimizer(net().parameters(), torch.optim.Adam, overlap_with_ddp=True)
