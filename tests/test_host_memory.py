"""The host allocator policy (spmdnet/host_memory.py): a step's large arrays
reuse freed memory instead of faulting in fresh pages."""
import os
import platform
import subprocess
import sys

import pytest

import spmdnet as sn

# a step's shape: allocate, touch and free 16 arrays of 2 MiB; prints the page
# faults of 20 steps after {first} (a statement run once, after a warm-up step)
SCRIPT = """
import resource, numpy as np, spmdnet
def step():
    arrays = [np.ones(2**19, np.float32) for _ in range(16)]
    return sum(float(a[-1]) for a in arrays)
def faults():
    step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(faults())
{first}
print(faults())
"""
SYSTEM_FAULTS = 20 * 512  # system malloc maps and unmaps each 2 MiB array: 512 faults a touch
GLIBC = pytest.mark.skipif(platform.libc_ver()[0] != "glibc",
                           reason="the policy is glibc's mallopt")


def page_faults(policy, first="pass"):
    """Faults of 20 steps after ``import spmdnet`` alone, then after ``first``."""
    env = dict(os.environ, SPMDNET_HOST_ALLOCATOR=policy)
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(first=first)], env=env,
                         capture_output=True, text=True, check=True)
    return tuple(int(n) for n in out.stdout.split()[-2:])


@GLIBC
def test_retained_memory_is_reused_without_page_faults():
    assert sn.host_memory.retain_freed_memory()
    _, retained = page_faults("retain", first="spmdnet.zeros(1)")
    _, system = page_faults("system", first="spmdnet.zeros(1)")
    assert retained < 100 < SYSTEM_FAULTS <= system, (retained, system)


@GLIBC
@pytest.mark.parametrize("first", ["spmdnet.zeros(1)", "spmdnet.tensor([1.0])",
                                   "spmdnet.nn.ReLU()"])
def test_import_leaves_malloc_alone_until_the_first_tensor_or_module(first):
    # issue 22: importing a library must not change the process's allocator
    imported, made = page_faults("retain", first)
    assert made < 100 < SYSTEM_FAULTS <= imported, (first, imported, made)


def test_bad_policy_fails_at_import_naming_the_knob():
    env = dict(os.environ, SPMDNET_HOST_ALLOCATOR="jemalloc")
    out = subprocess.run([sys.executable, "-c", "import spmdnet"], env=env,
                         capture_output=True, text=True)
    assert out.returncode != 0 and "SPMDNET_HOST_ALLOCATOR='jemalloc'" in out.stderr
