"""The cache's reads of its node owner and of other nodes' owners at an epoch's start
(memory.py, peers.py, sent.py: NOTE [ dpex Cache Sent Counts ]), against real owner actors:
what the trainer knows an owner was sent is waited for, though it reaches the owner after
the epoch's first question; an owner that will never have it is not waited for long.

An owner named for another node stands for that node's here: the peer tier finds owners by
name. The bed (tests/test_hosts.py) runs the same over hosts that share no /tmp."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from dpex.cache import disk, entries
from dpex.cache.options import Cache, user
from dpex.cache.owner import RAY_NAMESPACE, CacheOwner, owner_name
from dpex.cache.memory import MemoryTier
from dpex.cache.peers import PeerTier
from dpex.cache.policy import MIN_SAMPLES, PULL_SAMPLES, CostModel
from dpex.cache.sent import STILL_S, OwnerCounts, OwnerLag, SentTally

NAMESPACE = "test-cache-peers"
OTHER = "f" * 56  # a node id no node has


# ---------------------------------------------------------------- pure: the tally, the lag

def test_the_tally_sums_what_each_node_was_sent_and_written_by_namespace():
    tally = SentTally()
    assert tally.snapshot() is None
    tally.add("a", {"ns": {"memory_admitted": 3, "misses": 5}})
    tally.add("a", {"ns": {"memory_admitted": 2}, "other": {"misses": 1}})
    tally.add("b", {"ns": {"memory_admitted": 1, "disk_admitted": 4}})
    tally.add(None, {"ns": {"memory_admitted": 9}})  # no node: not a Ray process's
    tally.add("b", None)
    tally.add("c", {"disk-only": {"disk_admitted": 2}})
    snapshot = tally.snapshot()
    assert snapshot.keys() == {"ns", "disk-only"}
    assert (snapshot["ns"].sent, snapshot["ns"].written) == ({"a": 5, "b": 1}, {"b": 4})
    assert (snapshot["disk-only"].sent, snapshot["disk-only"].written) == ({}, {"c": 2})
    snapshot["ns"].sent["a"] = 0  # a copy: a worker's is its own
    assert tally.snapshot()["ns"].sent == {"a": 5, "b": 1}


def test_a_disk_mark_changes_with_what_the_trainer_saw_written_and_names_the_trainer():
    """NOTE [ dpex Cache Sent Counts ]: the mark an owner scans again for."""
    tally, other_trainer = SentTally(), SentTally()
    for each in (tally, other_trainer):
        each.add("b", {"ns": {"disk_admitted": 4, "memory_admitted": 1}})
    first = tally.snapshot()["ns"]
    assert first.disk_mark("a") is None  # nothing written there: no scan asked for
    trainer, written = first.disk_mark("b")
    assert written == 4 and tally.snapshot()["ns"].disk_mark("b") == (trainer, 4)
    assert other_trainer.snapshot()["ns"].disk_mark("b")[0] != trainer
    tally.add("b", {"ns": {"memory_admitted": 1}})
    assert tally.snapshot()["ns"].disk_mark("b") == (trainer, 4)  # not the disk's
    tally.add("b", {"ns": {"disk_admitted": 1}})
    assert tally.snapshot()["ns"].disk_mark("b") == (trainer, 5)


def test_an_owner_is_waited_for_while_it_is_behind_and_its_count_grows():
    lag = OwnerLag(expected=10)
    assert lag.behind(received=4, now=0.0)
    assert lag.behind(received=7, now=0.8)
    assert lag.behind(received=7, now=0.8 + STILL_S - 0.1)
    assert not lag.behind(received=7, now=0.8 + STILL_S + 0.1)  # still: none will come
    assert not OwnerLag(expected=10).behind(received=10, now=0.0)
    assert not OwnerLag(expected=10).behind(received=None, now=0.0)  # does not count
    assert not OwnerLag(expected=None).behind(received=0, now=0.0)  # nothing sent


# ---------------------------------------------------------------- real owners

@pytest.fixture
def owners(ray_local):
    """Owners made here, killed after the test."""
    made = []

    def make(node: str):
        handle = ray_local.remote(CacheOwner).options(
            name=owner_name(user(), NAMESPACE, node), namespace=RAY_NAMESPACE,
            num_cpus=0).remote(NAMESPACE, "test", 2**26, 600.0)
        made.append(handle)
        return handle

    yield make
    for handle in made:
        ray_local.kill(handle)


def _entry(i: int) -> entries.Entry:
    return entries.Entry(entries.pack(torch.full((4,), float(i))), ())


def _put(owner, keys) -> None:
    import ray

    ray.get(owner.put.remote([(f"k{i}", entries.to_parts(_entry(i)), 16, False)
                              for i in keys]))


def _later(seconds: float, fn, *args) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), fn(*args)), daemon=True)
    thread.start()
    return thread


def _value(stored) -> torch.Tensor:
    assert not disk.is_miss(stored), "a miss: the sample would be computed again"
    return entries.unpack(stored)


def test_another_nodes_entry_is_read_and_a_key_none_holds_is_a_miss(ray_local, owners):
    owner = owners(OTHER)
    _put(owner, range(10))
    peers = PeerTier(ray_local.get_runtime_context().get_node_id(), NAMESPACE, CostModel(),
                     2**26)
    assert torch.equal(_value(peers.get("k3")), torch.full((4,), 3.0))
    assert disk.is_miss(peers.get("nowhere"))


def test_reads_that_cost_more_than_computing_stop_for_the_epoch_and_are_measured_again(
        ray_local, owners):
    """NOTE [ dpex Cache Across Hosts ]: reads measured dearer than the stage (a busy
    moment) make this process compute instead, for that epoch; the next measures again."""
    owner = owners(OTHER)
    _put(owner, range(10))
    cost = CostModel()
    cost.compute_s.extend([0.001] * MIN_SAMPLES)  # the stage: 1 ms
    peers = PeerTier(ray_local.get_runtime_context().get_node_id(), NAMESPACE, cost, 2**26)
    peers._read_s.extend([1.0] * PULL_SAMPLES)  # its first reads: 1 s each
    assert disk.is_miss(peers.get("k3"))  # held there, but computed here
    peers.refresh()  # the next epoch
    assert torch.equal(_value(peers.get("k3")), torch.full((4,), 3.0))


def test_entries_sent_before_the_epoch_but_received_after_its_first_answer_are_found(
        ray_local, owners):
    """The trainer knows 10 entries were sent to the other node's owner; 8 of them reach it
    after the epoch's first question was answered (as a put waiting in a worker while that
    owner started does). The lookup waits for them instead of computing the sample."""
    owner = owners(OTHER)
    _put(owner, range(2))
    here = ray_local.get_runtime_context().get_node_id()
    peers = PeerTier(here, NAMESPACE, CostModel(), 2**26,
                     expected=OwnerCounts(sent={OTHER: 10}))
    late = _later(0.3, _put, owner, range(2, 10))
    started = time.monotonic()
    assert torch.equal(_value(peers.get("k9")), torch.full((4,), 9.0))
    assert time.monotonic() - started < 5
    late.join()
    # The next epoch: nothing more was sent, so a key none holds is not waited for.
    peers.refresh(OwnerCounts(sent={OTHER: 10}))
    started = time.monotonic()
    assert disk.is_miss(peers.get("nowhere"))
    assert time.monotonic() - started < 2


def test_an_owner_that_will_never_have_what_was_sent_is_waited_for_a_second(ray_local, owners):
    """The sender died with its sends, or the owner was replaced: its count stands still."""
    owner = owners(OTHER)
    _put(owner, range(2))
    here = ray_local.get_runtime_context().get_node_id()
    peers = PeerTier(here, NAMESPACE, CostModel(), 2**26,
                     expected=OwnerCounts(sent={OTHER: 10}))
    started = time.monotonic()
    assert disk.is_miss(peers.get("k9"))
    assert time.monotonic() - started < STILL_S + 2


def test_the_nodes_own_owner_is_waited_for_too(ray_local, owners):
    """The same wait for this node's owner: another process of this node sent the entries
    the trainer counted, and they reach the owner after its first answer."""
    here = ray_local.get_runtime_context().get_node_id()
    owner = owners(here)
    _put(owner, range(2))
    memory = MemoryTier(here, NAMESPACE, "test", Cache(), expected=10)
    late = _later(0.3, _put, owner, range(2, 10))
    assert torch.equal(_value(memory.get("k9")), torch.full((4,), 9.0))
    late.join()


# ---------------------------------------------------------------- another host's disk
# NOTE [ dpex Cache Disk Across Hosts ]: entries that another host keeps on its disk alone,
# read through its owner. The folder here is this machine's; the owner named for another
# node serves it as that node's owner serves its own host's.

def _disk_tier(tmp_path, keys) -> disk.DiskTier:
    tier = disk.DiskTier(str(tmp_path / "cache"), NAMESPACE, 2**26, 600.0, "test")
    for i in keys:
        tier.put(f"k{i}", _entry(i))
    tier.settle()
    return tier


def test_an_entry_on_another_hosts_disk_alone_is_read_through_its_owner(
        ray_local, owners, tmp_path):
    import ray

    owner = owners(OTHER)
    tier = _disk_tier(tmp_path, range(40))
    _put(owner, [7])  # one in its store too: read from there, not from the disk
    ray.get(owner.disk_folder.remote(tier.path, False))
    peers = PeerTier(ray_local.get_runtime_context().get_node_id(), NAMESPACE, CostModel(),
                     2**26)
    assert torch.equal(_value(peers.get("k3")), torch.full((4,), 3.0))
    assert peers.last_from_disk
    assert len(peers._held) == 15  # read with it, in the one call: the next hits are here
    for i in range(40):
        assert torch.equal(_value(peers.get(f"k{i}")), torch.full((4,), float(i)))
        assert peers.last_from_disk == (i != 7), i
    assert disk.is_miss(peers.get("nowhere"))
    tier.discard("k5")  # made stale there: gone from its disk, a miss here
    peers.refresh()
    assert disk.is_miss(peers.get("k5"))


def test_a_disk_folder_others_could_write_is_never_read_and_ones_own_is_not_listed_twice(
        ray_local, owners, tmp_path):
    import os

    import ray

    tier = _disk_tier(tmp_path, range(4))
    os.chmod(tier.path, 0o777)  # anyone could have put a pickle there
    refused = owners(OTHER)
    ray.get(refused.disk_folder.remote(tier.path, False))
    here = ray_local.get_runtime_context().get_node_id()
    assert disk.is_miss(PeerTier(here, NAMESPACE, CostModel(), 2**26).get("k1"))
    ray.kill(refused)
    os.chmod(tier.path, 0o700)
    owner = owners("e" * 56)
    ray.get(owner.disk_folder.remote(tier.path, False))
    same_folder = PeerTier(here, NAMESPACE, CostModel(), 2**26)
    same_folder.folder_id = tier.folder_id()  # this node's own folder: its disk tier reads it
    assert disk.is_miss(same_folder.get("k1")) and same_folder._index == {}
    assert not disk.is_miss(PeerTier(here, NAMESPACE, CostModel(), 2**26).get("k1"))


def test_an_owner_made_as_workers_make_it_serves_a_disk_folder_without_importing_torch(
        ray_local, tmp_path):
    """The owner travels by value (NOTE [ dpex Cache Owner ]), its disk index and the
    folder rules with it: its process never imports torch (1.2 s of CPU on the cores the
    loop is using)."""
    import ray

    from dpex.cache.owner import owner_for

    tier = _disk_tier(tmp_path, range(3))
    here = ray_local.get_runtime_context().get_node_id()
    owner = owner_for(user(), NAMESPACE + "-by-value", "test", here, limit=2**26, ttl_s=600.0)
    try:
        ray.get(owner.disk_folder.remote(tier.path, False))
        assert ray.get(owner.read_disk.remote(["k1"], 2**20)) == []  # not listed yet
        *_, disk_keys, ids = ray.get(owner.keys.remote(0, 0))
        assert sorted(disk_keys) == ["k0", "k1", "k2"] and ids == [tier.folder_id()]
        ((key, data),) = ray.get(owner.read_disk.remote(["k1"], 2**20))
        assert key == "k1" and torch.equal(_value(disk.loads(data)), torch.full((4,), 1.0))
        pid = ray.get(owner.describe.remote())["pid"]
        with open(f"/proc/{pid}/maps") as maps:
            assert "libtorch" not in maps.read()
    finally:
        ray.kill(owner)
