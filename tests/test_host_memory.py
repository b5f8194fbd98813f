"""The host allocator policy (spmdnet/host_memory.py): a step's large arrays
reuse freed memory instead of faulting in fresh pages."""
import os
import platform
import subprocess
import sys

import pytest

import spmdnet as sn

SCRIPT = """
import resource, numpy as np, spmdnet
def step():  # a step's shape: allocate, touch and free 16 arrays of 2 MiB
    arrays = [np.ones(2**19, np.float32) for _ in range(16)]
    return sum(float(a[-1]) for a in arrays)
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(policy):
    env = dict(os.environ, SPMDNET_HOST_ALLOCATOR=policy)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the policy is glibc's mallopt")
def test_retained_memory_is_reused_without_page_faults():
    assert sn.host_memory.retain_freed_memory()
    retained, system = page_faults("retain"), page_faults("system")
    # system malloc maps and unmaps each 2 MiB array: 512 faults per array touched
    assert retained < 100 < 20 * 512 <= system, (retained, system)


def test_bad_policy_fails_at_import_naming_the_knob():
    env = dict(os.environ, SPMDNET_HOST_ALLOCATOR="jemalloc")
    out = subprocess.run([sys.executable, "-c", "import spmdnet"], env=env,
                         capture_output=True, text=True)
    assert out.returncode != 0 and "SPMDNET_HOST_ALLOCATOR='jemalloc'" in out.stderr
