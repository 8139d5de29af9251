"""The exact cache on Ray: the batches stay torch's cold, warm, off, after a worker's death
and after the entries are lost; a later loader (a later job) reads what an earlier one
stored; a stage that draws is refused; an owner expires; ``dpex cache ls`` / ``rm``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import dpex
from dpex.cache.owner import RAY_NAMESPACE
from dpex.ray_session import auth

from cache_datasets import (ChangesItsDecode, Decoded, DiesOnce, DrawsInStage, FolderImages,
                            runs_in)
from conftest import user_env
from helpers import _list_actors, assert_batches_equal, wait_until


N, BATCH = 48, 8


@pytest.fixture(autouse=True)
def _owners_removed(ray_local):
    """Owners are detached on purpose (a cache outlives its loader): each test starts and
    ends with none."""
    _remove_owners(ray_local)
    yield
    _remove_owners(ray_local)


def _remove_owners(ray) -> None:
    for name in _owner_names(ray):  # starting ones too
        ray.kill(ray.get_actor(name, namespace=RAY_NAMESPACE))


def _owner_names(ray) -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == RAY_NAMESPACE]


def _owners() -> list:
    return _list_actors("CacheOwner", alive_only=True)


def _torch_epochs(dataset, epochs: int, **kwargs) -> list:
    torch.manual_seed(7)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=2,
                                         **kwargs)
    return [list(loader) for _ in range(epochs)]


def _dpex_epochs(dataset, epochs: int, cache, **kwargs) -> tuple[list, dpex.DataLoader]:
    torch.manual_seed(7)
    loader = dpex.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=2,
                             distribute_mode=True, cache=cache, **kwargs)
    return [list(loader) for _ in range(epochs)], loader


def _stage(loader) -> dpex.cache.report.CacheStats:
    (stage,) = loader.stats().cache
    return stage


@pytest.mark.parametrize("persistent", [False, True])
def test_cold_warm_off_and_a_later_job_are_torchs_bits(ray_local, tmp_path, persistent):
    runs = tmp_path / "runs"
    runs.mkdir()
    cache = dpex.Cache(disk_dir=str(tmp_path / "disk"))
    expected = _torch_epochs(Decoded(N), 3, persistent_workers=persistent)

    got, first = _dpex_epochs(Decoded(N, str(runs)), 3, cache, persistent_workers=persistent)
    assert_batches_equal(expected, got, "cold, then warm")
    computed = runs_in(str(runs))
    assert sorted(set(computed)) == list(range(N))
    stage = _stage(first)
    # Hits within these epochs of 0.1 s depend on how soon the owner's process is up.
    assert stage.stage == "Decoded.decode" and stage.misses == len(computed)
    assert stage.memory_admitted + stage.disk_admitted >= N

    # A later job: a new loader and dataset object, same namespace. Its owner holds every
    # entry once the first loader's processes have sent them.
    assert wait_until(lambda: _owner_entries() >= N, timeout=10)
    assert not _owners_with_torch()  # their process starts beside the loop: kept light
    got, later = _dpex_epochs(Decoded(N, str(runs)), 2, cache, persistent_workers=persistent)
    assert_batches_equal(expected[:2], got, "a later job")
    assert len(runs_in(str(runs))) == len(computed)  # nothing computed again
    assert _stage(later).hit_rate == 1.0 and _stage(later).memory_hits > 0

    got, off = _dpex_epochs(Decoded(N, str(runs)), 1, False, persistent_workers=persistent)
    assert_batches_equal(expected[:1], got, "cache=False")
    assert off.stats().cache == () and len(runs_in(str(runs))) == len(computed) + N


def _owners_described() -> list[dict]:
    import ray

    # The handle kept in a name: Ray 2.40 loses a handle that only a chained call holds.
    handles = [ray.get_actor(a.name, namespace=RAY_NAMESPACE) for a in _owners()]
    return [ray.get(handle.describe.remote()) for handle in handles]


def _owner_entries() -> int:
    return sum(owner["entries"] for owner in _owners_described())


def _owners_with_torch() -> list[int]:
    """The owners' processes that mapped torch's library (imported torch)."""
    pids = [owner["pid"] for owner in _owners_described()]
    assert pids
    with_torch = []
    for pid in pids:
        with open(f"/proc/{pid}/maps") as f:
            if "libtorch" in f.read():
                with_torch.append(pid)
    return with_torch


def test_lost_entries_and_a_dead_worker_keep_torchs_bits(ray_local, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    cache = dpex.Cache(disk_bytes=0)  # the object store only: losing the owner loses all
    expected = _torch_epochs(Decoded(N), 2)
    _dpex_epochs(Decoded(N, str(runs)), 1, cache)
    assert wait_until(lambda: _owner_entries() >= N, timeout=10)
    for actor in _owners():  # as `dpex cache rm` does, or the node going
        ray_local.kill(ray_local.get_actor(actor.name, namespace=RAY_NAMESPACE))
    got, loader = _dpex_epochs(DiesOnce(N, str(runs), bad=N // 2), 2, cache)
    assert_batches_equal(expected, got, "entries lost, a worker killed")
    assert loader.stats().worker_restarts == 1
    assert _stage(loader).misses > 0


@pytest.mark.parametrize("tier", ["memory", "disk"])
def test_a_stage_output_changed_in_place_after_it_returns_is_cached_as_returned(
        ray_local, tmp_path, tier):
    cache = (dpex.Cache(disk_bytes=0) if tier == "memory"
             else dpex.Cache(disk_dir=str(tmp_path), memory_share=0.0))
    expected = _torch_epochs(ChangesItsDecode(N), 3)
    got, loader = _dpex_epochs(ChangesItsDecode(N), 3, cache)
    assert_batches_equal(expected, got, f"cold, then warm ({tier})")
    assert _stage(loader).hits > 0


@pytest.mark.parametrize("tier", ["memory", "disk"])
def test_a_file_rewritten_after_a_job_is_read_again_from_either_tier(ray_local, tmp_path, tier):
    """A folder and names: a later job finds the entries an earlier one left, and reads
    again the one file rewritten in place since (same name, size and modification time)."""
    images = tmp_path / "images"
    images.mkdir()
    for n in range(N):
        (images / f"{n:03}.jpg").write_bytes(bytes([n]) * 48)
    cache = (dpex.Cache(disk_bytes=0) if tier == "memory"
             else dpex.Cache(disk_dir=str(tmp_path / "disk"), memory_share=0.0))
    got, _ = _dpex_epochs(FolderImages(str(images)), 1, cache)
    assert_batches_equal(_torch_epochs(FolderImages(str(images)), 1), got, "first job")
    if tier == "memory":
        assert wait_until(lambda: _owner_entries() >= N, timeout=10)
    image = images / "007.jpg"
    st = os.stat(image)
    image.write_bytes(b"\xff" * 48)
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))
    got, later = _dpex_epochs(FolderImages(str(images)), 2, cache)
    assert_batches_equal(_torch_epochs(FolderImages(str(images)), 2), got, "after the rewrite")
    stage = _stage(later)
    assert stage.stale >= 1 and stage.hits >= N, stage


def test_an_entry_read_in_place_from_the_store_gives_private_values(ray_local):
    """A process reads an entry from Ray's store once and keeps it (memory.py): every hit
    unpacks that one object, and what a hit hands back must not be the entry itself."""
    import numpy as np

    from dpex.cache import entries

    frozen = np.arange(24, dtype=np.uint8).reshape(4, 6)
    frozen.flags.writeable = False
    value = {"tensor": torch.rand(5, 3).t(), "array": np.asfortranarray(np.random.rand(3, 4)),
             "frozen": frozen}
    stored = ray_local.get(ray_local.put(entries.pack(value)))
    first = entries.unpack(stored)
    first["tensor"].add_(1)
    first["array"] += 1
    with pytest.raises(ValueError):  # read-only, as the stage returned it
        first["frozen"].flags.writeable = True
    second = entries.unpack(stored)
    assert torch.equal(second["tensor"], value["tensor"])
    assert second["tensor"].stride() == value["tensor"].stride()
    assert np.array_equal(second["array"], value["array"]) and second["array"].flags.f_contiguous
    assert np.array_equal(second["frozen"], frozen) and not second["frozen"].flags.writeable


def test_a_stage_that_draws_a_random_number_is_refused(ray_local, tmp_path):
    loader = dpex.DataLoader(DrawsInStage(8), batch_size=4, num_workers=2,
                             distribute_mode=True, cache=dpex.Cache(disk_dir=str(tmp_path)))
    with pytest.raises(dpex.CacheError, match="drew from torch's default generator"):
        list(loader)
    # torch's loader, and dpex's without the cache, just run it.
    assert len(list(dpex.DataLoader(DrawsInStage(8), batch_size=4, num_workers=2,
                                    distribute_mode=True, cache=False))) == 2


def test_an_unused_cache_expires_after_its_ttl(ray_local, tmp_path):
    _dpex_epochs(Decoded(16), 1, dpex.Cache(disk_dir=str(tmp_path), ttl_s=3.0))
    assert wait_until(lambda: _owner_names(ray_local), timeout=10)  # sent as processes end
    (name,) = _owner_names(ray_local)
    owner = ray_local.get_actor(name, namespace=RAY_NAMESPACE)
    assert ray_local.get(owner.describe.remote(), timeout=60)["ttl_s"] == 3.0

    def gone() -> bool:
        try:
            ray_local.get_actor(name, namespace=RAY_NAMESPACE)
            return False
        except ValueError:
            return True

    assert wait_until(gone, timeout=15)


@pytest.mark.slow  # five runs of the `dpex cache` command, each a fresh process (20-30 s)
def test_dpex_cache_ls_and_rm(ray_local, tmp_path):
    folder = str(tmp_path / "disk")
    _dpex_epochs(Decoded(16), 1, dpex.Cache(disk_dir=folder, memory_share=0.0))
    _dpex_epochs(Decoded(16, shape=(3, 8, 8)), 1, dpex.Cache(disk_dir=folder))
    assert wait_until(lambda: _owner_entries() >= 16, timeout=10)
    address = ray_local.get_runtime_context().gcs_address
    token = auth.current_token()  # a shell of this cluster's user has it (Ray's lookup)
    env = user_env(**({"RAY_AUTH_TOKEN": token} if token else {}))

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dpex", "cache", *args, "--address",
                               address, "--disk-dir", folder], capture_output=True, text=True,
                              env=env, timeout=120)

    listed = cli("ls", "--json")
    assert listed.returncode == 0, listed.stderr
    caches = json.loads(listed.stdout)
    assert {c["stage"] for c in caches} == {"Decoded.decode"}
    assert sorted(c["where"] for c in caches) == ["disk", "disk", "memory"]
    memory = next(c for c in caches if c["where"] == "memory")
    assert memory["entries"] == 16 and memory["bytes"] > 0
    removed = cli("rm", memory["namespace"])
    assert removed.returncode == 0, removed.stderr
    assert wait_until(lambda: not _owners(), timeout=10)
    left = json.loads(cli("ls", "--json").stdout)
    assert memory["namespace"] not in {c["namespace"] for c in left} and len(left) == 1
    assert cli("rm", "--all").returncode == 0
    assert json.loads(cli("ls", "--json").stdout) == []


def test_a_resumed_epoch_with_a_warm_cache_is_torchs(ray_local, tmp_path):
    """Half an epoch, its state_dict, a new loader (a restarted job) that resumes it: the
    batches of an uninterrupted run of torch's loader, the second half read back."""
    cache = dpex.Cache(disk_dir=str(tmp_path))

    def make() -> dpex.DataLoader:
        return dpex.DataLoader(Decoded(N), batch_size=BATCH, shuffle=True, num_workers=2,
                               distribute_mode=True, cache=cache,
                               generator=torch.Generator().manual_seed(3))

    expected = list(torch.utils.data.DataLoader(
        Decoded(N), batch_size=BATCH, shuffle=True, num_workers=2,
        generator=torch.Generator().manual_seed(3)))
    warm = make()
    list(warm)  # fills the cache
    assert wait_until(lambda: _owner_entries() >= N, timeout=10)
    loader = make()
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    state = loader.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(state)
    assert_batches_equal(expected, head + list(resumed), "resumed on a warm cache")
    assert _stage(resumed).hit_rate == 1.0
