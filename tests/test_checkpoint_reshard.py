"""Resuming at another world size reshards the checkpoint (PyTorch's
distributed checkpoint is the anchor): runs of DataParallel, ZeRO-1, ZeRO-2,
FSDP and tensor x data parallelism save after 3 steps on 2 ranks, resume on
4 ranks and on 1 with the same global batch, and go on with the losses and
weights of the run that never stopped (to float tolerance: other ranks sum
in another order). The sampler continues at the same global sample. A
tensor-parallel checkpoint is refused by a job of another tp, naming both
layouts. Before, any other world size was "damage": the TP run trained from
scratch, the others were refused. Real MPI jobs (tests/helpers/reshard_run.py)
with deadlines."""
import json

import numpy as np
import pytest

from tests.helpers.launch import ROOT, run_mpi

SCRIPT = ROOT / "tests/helpers/reshard_run.py"
STRATEGIES = ["dp", "zero1", "zero2", "fsdp", "tp"]
SAVED_AT, MORE = 3, 4  # steps before the checkpoint, after it (7 cross an epoch's end)
TOL = {"rtol": 2e-5, "atol": 2e-6}


def job(tmp_path, n, plan, name):
    out = tmp_path / f"{name}.json"
    code, stdout, stderr, _ = run_mpi(n, SCRIPT, out, tmp_path / "ckpt", json.dumps(plan),
                                      timeout=240)
    assert code == 0, stdout + stderr
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{world size: that job's results}; 2 also holds the uninterrupted runs."""
    tmp = tmp_path_factory.mktemp("reshard")
    first = [[s, mode, steps] for s in STRATEGIES
             for mode, steps in (("whole", SAVED_AT + MORE), ("save", SAVED_AT))]
    return {2: job(tmp, 2, first, "two"),
            4: job(tmp, 4, [[s, "resume", MORE] for s in STRATEGIES], "four"),
            1: job(tmp, 1, [[s, "refuse" if s == "tp" else "resume", MORE]
                            for s in STRATEGIES], "one")}


@pytest.mark.parametrize("size", [4, 1])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_resumed_at_another_size_continues_the_uninterrupted_run(runs, strategy, size):
    if strategy == "tp" and size == 1:
        pytest.skip("tp=2 needs 2 ranks: see the refusal test")
    whole, resumed = runs[2][f"{strategy} whole"], runs[size][f"{strategy} resume"]
    assert "error" not in resumed, resumed.get("error")
    assert resumed["step"] == SAVED_AT
    replicas = size // 2 if strategy == "tp" else size
    consumed = SAVED_AT * 12  # the global batch: 12 samples a step
    assert resumed["position"] == [0, consumed // replicas]
    np.testing.assert_allclose(resumed["losses"], whole["losses"][SAVED_AT:], **TOL)
    assert resumed["params"].keys() == whole["params"].keys()
    for name, value in whole["params"].items():
        np.testing.assert_allclose(resumed["params"][name], value, **TOL, err_msg=name)


def test_the_saving_run_is_the_uninterrupted_run_so_far(runs):
    for strategy in STRATEGIES:
        saved, whole = runs[2][f"{strategy} save"], runs[2][f"{strategy} whole"]
        assert saved["losses"] == whole["losses"][:SAVED_AT], strategy


def test_another_tensor_parallel_size_is_refused_naming_both_layouts(runs):
    error = runs[1]["tp refuse"]["error"]
    assert "ckpt-00000003.h5" in error
    assert "{'size': 2, 'tp': 2, 'pp': 1} (dp 1)" in error
    assert "this job is {'size': 1, 'tp': 1, 'pp': 1} (dp 1)" in error
    assert "Resume with tp=2 and pp=1" in error and "use another directory" in error
