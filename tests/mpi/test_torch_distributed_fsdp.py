"""FSDP and ZeroRedundancyOptimizer at PyTorch's paths with PyTorch's
arguments (issue 24 item 7): each sharding strategy trains as serial
training on the global batch, the auto-wrap policies pick the modules
PyTorch's documented recursion picks (hand-counted parameter numbers), the
state-dict type, and the strategies we do not build raise."""
import functools
import inspect

import numpy as np
import pytest

import spmdnet as torch
import spmdnet.distributed as dist
import spmdnet.nn.functional as F
from spmdnet import nn
from spmdnet import parallel
from spmdnet.autograd import is_grad_enabled
from spmdnet.distributed.fsdp import (BackwardPrefetch, FullStateDictConfig,
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
    with pytest.raises(NotImplementedError, match="ignored_modules"):
        FSDP(net(), ignored_modules=[nn.Linear(2, 2)])
    with pytest.raises(NotImplementedError, match="SHARDED_STATE_DICT"):
        FSDP.set_state_dict_type(net(), StateDictType.SHARDED_STATE_DICT)


# PyTorch 2.13's FullyShardedDataParallel.__init__ (inspect.signature), in order
PYTORCH_SIGNATURE = [
    ("module", inspect.Parameter.empty), ("process_group", None), ("sharding_strategy", None),
    ("cpu_offload", None), ("auto_wrap_policy", None),
    ("backward_prefetch", BackwardPrefetch.BACKWARD_PRE), ("mixed_precision", None),
    ("ignored_modules", None), ("param_init_fn", None), ("device_id", None),
    ("sync_module_states", False), ("forward_prefetch", False), ("limit_all_gathers", True),
    ("use_orig_params", False), ("ignored_states", None), ("device_mesh", None)]


def test_one_class_with_pytorch_positional_signature_and_spmdnet_keywords():
    assert parallel.FullyShardedDataParallel is FSDP
    params = list(inspect.signature(FSDP.__init__).parameters.values())[1:]
    positional = [(p.name, p.default) for p in params
                  if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == PYTORCH_SIGNATURE
    assert {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY} == {
        "comm", "wrap", "reshard_after_forward", "prefetch", "nonfinite", "overlap",
        "param_groups"}


def _prefetch_run(*args, **kwargs):
    """Train 3 steps; (state, forward hits, backward hits, the most gathers in
    flight while a unit recomputes in backward)."""
    model = FSDP(net(), *args, **kwargs)
    x, y = shard()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    in_flight = []

    def record(module, inputs, out):
        if is_grad_enabled() and model.prefetcher.phase == "backward":
            in_flight.append(len(model.prefetcher.pending))

    for block in model.module.blocks:  # inside the unit: called by the recompute too
        block.fc.register_forward_hook(record)
    fwd = bwd = 0
    for _ in range(3):
        opt.zero_grad()
        h0 = model.prefetcher.hits
        loss = F.mse_loss(model(torch.tensor(x)), torch.tensor(y))
        h1 = model.prefetcher.hits
        loss.backward()
        fwd, bwd = fwd + h1 - h0, bwd + model.prefetcher.hits - h1
        opt.step()
    state = model.state_dict()
    model.close()
    return state, fwd, bwd, max(in_flight)


@pytest.mark.parametrize("forward_prefetch, backward_prefetch", [
    (False, None), (True, None), (False, BackwardPrefetch.BACKWARD_PRE),
    (True, BackwardPrefetch.BACKWARD_POST)])
def test_prefetch_flags_choose_the_prefetched_phases_and_change_no_number(
        forward_prefetch, backward_prefetch):
    policy = ModuleWrapPolicy({Block})
    # PyTorch's positional order: process_group, sharding_strategy, cpu_offload,
    # auto_wrap_policy, backward_prefetch
    state, fwd, bwd, in_flight = _prefetch_run(None, None, None, policy, backward_prefetch,
                                               forward_prefetch=forward_prefetch)
    plain, *hits = _prefetch_run(auto_wrap_policy=policy, prefetch=False)
    assert hits == [0, 0, 0]
    for key in plain:
        np.testing.assert_array_equal(state[key].numpy(), plain[key].numpy(), err_msg=key)
    many = dist.get_world_size() > 1  # one rank gathers by copying: nothing to prefetch
    # from step 2 on (the order is recorded in step 1): forward gathers the root
    # unit and both blocks, backward recomputes the two blocks
    assert fwd == (6 if forward_prefetch and many else 0)
    assert bwd == (4 if backward_prefetch and many else 0)
    # BACKWARD_PRE gathers blocks.0 while blocks.1 recomputes; BACKWARD_POST only after
    assert in_flight == (1 if backward_prefetch is BackwardPrefetch.BACKWARD_PRE and many
                         else 0)


def test_contradicting_arguments_raise():
    with pytest.raises(ValueError, match="prefetch=False contradicts forward_prefetch=True"):
        FSDP(net(), forward_prefetch=True, prefetch=False)
    with pytest.raises(ValueError, match="BACKWARD_POST contradicts"):
        FSDP(net(), backward_prefetch=BackwardPrefetch.BACKWARD_POST, prefetch=True)
    with pytest.raises(ValueError, match="auto_wrap_policy or wrap, not both"):
        FSDP(net(), auto_wrap_policy=ModuleWrapPolicy({Block}), wrap={Block})
    with pytest.raises(ValueError, match="contradicts sharding_strategy"):
        FSDP(net(), sharding_strategy=ShardingStrategy.SHARD_GRAD_OP,
             reshard_after_forward=True)
    with pytest.raises(ValueError, match=r"NO_SHARD.*\['wrap'\]"):
        FSDP(net(), sharding_strategy=ShardingStrategy.NO_SHARD, wrap={Block})
    with pytest.raises(ValueError, match="comm or process_group, not both"):
        FSDP(net(), dist.group.WORLD, comm=dist.group.WORLD)


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
