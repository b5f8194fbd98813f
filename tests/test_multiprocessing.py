"""spmdnet.multiprocessing as torch.multiprocessing: Python's multiprocessing
re-exported, tensors in shared memory (``share_memory_``, ``is_shared``)
that a forked or spawned process updates in place, a copy otherwise (as
PyTorch), and a Hogwild trainer: processes training one shared model, each
with its own optimizer."""
import multiprocessing
import subprocess
import sys
import textwrap

import numpy as np

import spmdnet as torch
import spmdnet.multiprocessing as mp
from spmdnet import launch


def test_reexports_pythons_multiprocessing():
    for name in ("Process", "Queue", "SimpleQueue", "Pool", "get_context",
                 "set_start_method", "get_start_method", "cpu_count", "Event", "Value"):
        assert getattr(mp, name) is getattr(multiprocessing, name), name
    assert mp.get_start_method(allow_none=True) == multiprocessing.get_start_method(
        allow_none=True)


def test_share_memory_keeps_values_and_object():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    t.requires_grad_(True)
    assert not t.is_shared()
    assert t.share_memory_() is t and t.is_shared()
    np.testing.assert_array_equal(t.detach().numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    assert t.requires_grad and t[0].is_shared()  # a view of shared memory is shared
    before = t.array
    t.share_memory_()  # already shared: nothing moves
    assert t.array is before


SCRIPT = textwrap.dedent('''
    import sys
    import spmdnet as torch
    import spmdnet.nn as nn
    import spmdnet.multiprocessing as mp

    def bump(shared, private, q):
        shared.add_(1.0)
        private.add_(1.0)
        q.put((shared.is_shared(), private.is_shared()))

    def train(model, steps):
        torch.manual_seed(0)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        x, y = torch.ones(8, 4), torch.full((8, 1), 3.0)
        for _ in range(steps):
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()

    def loss(model):
        return float(((model(torch.ones(8, 4)) - 3.0) ** 2).mean())

    if __name__ == "__main__":
        method = sys.argv[1]
        ctx = mp.get_context(method)
        shared, private = torch.zeros(5).share_memory_(), torch.zeros(5)
        q = ctx.Queue()
        p = ctx.Process(target=bump, args=(shared, private, q))
        p.start()
        flags = q.get(timeout=60)
        p.join(60)
        print("BUMP", p.exitcode, flags, shared.tolist(), private.tolist())
        model = nn.Linear(4, 1)
        model.share_memory()
        start = loss(model)
        procs = [ctx.Process(target=train, args=(model, 25)) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        print("HOGWILD", [p.exitcode for p in procs], start > 1.0, loss(model) < 0.01 * start)
''')


def _run(tmp_path, method):
    path = tmp_path / "hogwild.py"
    path.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(path), method], capture_output=True, text=True,
                          timeout=180, env=launch.job_env())
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_fork_and_spawn_share_memory_and_copy_the_rest(tmp_path):
    for method in ("fork", "spawn"):
        out = _run(tmp_path, method)
        # the child wrote the shared tensor, its copy of the private one only
        assert "BUMP 0 (True, False) [1.0, 1.0, 1.0, 1.0, 1.0] [0.0, 0.0, 0.0, 0.0, 0.0]" \
            in out, (method, out)
        assert "HOGWILD [0, 0] True True" in out, (method, out)  # the parent's model learnt
