"""DistributedDataParallel with ``flat_params=True`` (its default): every parameter a view
of one flat array, every ``.grad`` a view of the buffer's flat gradient
array, so an optimizer steps the whole model in one update call
(``optim._flat_runs``). The oracle: a plain DDP copy (separate arrays)
stepped per parameter with the same averaged gradients, bit for bit; and
PyTorch's DDP, which owns no storage: ``p.data = t`` stays allowed."""
import copy

import numpy as np
import pytest

import spmdnet as sn
from spmdnet import dist, nn, optim, parallel

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]


def test_ddp_flat_params_step_in_one_call_like_the_per_parameter_path():
    sn.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 5), nn.Tanh(),
                          nn.Linear(5, 2))
    ref = parallel.DataParallel(copy.deepcopy(model), flat_params=False)
    ddp = parallel.DataParallel(model, flat_params=True)
    flat = ddp.buffer.param_flats[np.dtype(np.float64)]
    params, ref_params = list(model.parameters()), list(ref.module.parameters())
    assert all(np.shares_memory(p.array, flat) for p in params)
    opt = optim.AdamW(params, lr=0.01, weight_decay=0.1, amsgrad=True)
    ref_opt = optim.AdamW(ref_params, lr=0.01, weight_decay=0.1, amsgrad=True)
    calls, update = [], opt._update
    opt._update = lambda data, *rest: (calls.append(data.size), update(data, *rest))[1]
    rng = np.random.default_rng(dist.rank())
    grad_flat = ddp.buffer.grad_flats[np.dtype(np.float64)]
    for step in range(4):
        if step == 2:  # as PyTorch's DDP allows: the parameter leaves the flat array
            model[2].bias.data = sn.tensor(np.array(model[2].bias.array))
        x = sn.tensor(rng.standard_normal((3, 4)))
        for net, o in ((ddp, opt), (ref, ref_opt)):
            o.zero_grad(set_to_none=True)
            net(x).pow(2).sum().backward()
        for p, r in zip(params, ref_params):
            assert np.shares_memory(p.grad.array, grad_flat)
            np.testing.assert_allclose(p.grad.array, r.grad.array, rtol=1e-12, atol=1e-14)
            p.grad.array[...] = r.grad.array  # the optimizers compared on equal gradients
        del calls[:]
        opt.step()
        ref_opt.step()
        for p, r in zip(params, ref_params):
            np.testing.assert_array_equal(p.array, r.array, strict=True)
        for p, r in zip(params, ref_params):
            for k, v in ref_opt.state[r].items():
                np.testing.assert_array_equal(opt.state[p][k], v)
        n = sum(p.array.size for p in params)
        # steps 2, 3: the rebound bias (parameter 3) steps alone, [0, 3) and [4, 6) in runs
        assert calls == ([n] if step < 2 else [sum(p.array.size for p in params[:3]),
                                               params[3].array.size,
                                               sum(p.array.size for p in params[4:])])
    ddp.close()
    ref.close()
