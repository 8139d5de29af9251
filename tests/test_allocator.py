"""The worker processes' allocator (NOTE [ dpex Worker Allocator ]): the policy, then the
page faults of a fresh process that allocates and frees batch-sized blocks, with dpex's
settings and with a user's own glibc tuning."""

from __future__ import annotations

import ast
import resource
import subprocess
import sys

import pytest
from conftest import user_env

from dpex.workers.allocator import (
    M_MMAP_THRESHOLD,
    M_TRIM_THRESHOLD,
    MMAP_THRESHOLD,
    TRIM_THRESHOLD,
    _glibc_version,
    settings_to_apply,
)

GLIBC = "glibc 2.36"


def test_glibc_gets_both_thresholds():
    assert settings_to_apply({}, GLIBC) == [(M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                                            (M_TRIM_THRESHOLD, TRIM_THRESHOLD)]
    assert MMAP_THRESHOLD == 32 * 2**20 and TRIM_THRESHOLD > 2 * MMAP_THRESHOLD


@pytest.mark.parametrize("environ", [
    {"MALLOC_TRIM_THRESHOLD_": "131072"},
    {"MALLOC_MMAP_THRESHOLD_": "65536"},
    {"MALLOC_MMAP_MAX_": "0"},
    {"MALLOC_TOP_PAD_": "0"},
    {"GLIBC_TUNABLES": "glibc.rtld.nns=4:glibc.malloc.trim_threshold=131072"},
])
def test_a_users_own_malloc_tuning_is_kept(environ):
    assert settings_to_apply(environ, GLIBC) == []


def test_other_tunables_and_other_c_libraries():
    assert settings_to_apply({"GLIBC_TUNABLES": "glibc.rtld.nns=4"}, GLIBC) != []
    assert settings_to_apply({}, None) == []  # musl, macOS: no CS_GNU_LIBC_VERSION
    assert settings_to_apply({}, "NPTL 2.36") == []


# A fresh interpreter, with and without what every worker process runs first (``Worker()``:
# a Ray actor's constructor, a local-start process's first step): whether a 20 MiB block
# gets a mapping of its own (glibc's defaults in a fresh process: yes, and it is unmapped
# when freed), and the page faults of rounds that make and free four such blocks. glibc's
# dynamic threshold makes the rounds vary by a process's history (and in a Ray worker with
# Ray's threads allocating beside the task); the bench measures the real case.
ROUNDS = r"""
import ctypes, resource, sys, torch
if sys.argv[1] == "worker":
    from dpex.workers.worker import Worker
    Worker()
class MallInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
mallinfo = ctypes.CDLL(None).mallinfo
mallinfo.restype = MallInfo
def own_mapping_of_a_block():
    before = mallinfo().hblkhd  # bytes in blocks that have a mapping of their own
    block = torch.ones(20 * 2**18)
    mapped = mallinfo().hblkhd - before >= 20 * 2**20
    del block
    return mapped
def faults_of_one_round():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [torch.ones(20 * 2**18) for _ in range(4)]  # every page touched
    del blocks
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(repr((own_mapping_of_a_block(), [faults_of_one_round() for _ in range(6)][2:])))
"""
PAGES = 4 * 20 * 2**20 // resource.getpagesize()


def blocks_in(process: str, **env: str) -> tuple[bool, list[int]]:
    proc = subprocess.run([sys.executable, "-c", ROUNDS, process], env=user_env(**env),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return ast.literal_eval(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not (_glibc_version() or "").startswith("glibc"),
                    reason="glibc's malloc only")
def test_a_worker_process_reuses_freed_batch_memory_unless_the_user_tuned_malloc():
    own_mapping, _ = blocks_in("plain")
    assert own_mapping  # glibc's defaults
    own_mapping, faults = blocks_in("worker")
    assert not own_mapping and faults[-1] < PAGES // 20  # from the heap, and reused
    users = {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=7"}  # glibc's default, set by hand
    own_mapping, _ = blocks_in("worker", **users)
    assert own_mapping  # dpex set nothing
