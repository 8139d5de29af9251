"""The disk tier's writer under load (pure: no Ray): a tight loop of puts on a slow disk
keeps every entry, within the budget; what is not kept is counted, and why
(disk_writer.py: NOTE [ dpex Cache Disk Writer ])."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from dpex.cache import disk, entries, runtime
from dpex.cache.disk_writer import Writer
from dpex.cache.options import Cache


def _slow_file_writes(monkeypatch, delay_s: float) -> None:
    """A test double of the file write only: the disk takes ``delay_s`` longer."""
    write = disk.write_file

    def slow(f, data: bytes) -> None:
        time.sleep(delay_s)
        write(f, data)

    monkeypatch.setattr(disk, "write_file", slow)


def _files(tier: disk.DiskTier) -> set[str]:
    return {name for name in os.listdir(tier.path) if not name.startswith(".")}


def _entry(i: int) -> entries.Entry:
    return entries.Entry(entries.pack(np.full((64, 64, 3), i % 251, dtype=np.uint8)), ())


def test_a_tight_loop_of_puts_on_a_slow_disk_keeps_every_entry(tmp_path, monkeypatch):
    _slow_file_writes(monkeypatch, 0.01)
    tier = disk.DiskTier(str(tmp_path), "ns", 2**30, 3600.0)
    for i in range(192):
        time.sleep(0.001)  # the stage: 10 times faster than the disk
        assert tier.put(f"k{i}", _entry(i)) > 0
    tier.settle(timeout_s=30)
    assert _files(tier) == {f"k{i}" for i in range(192)}  # the queue kept 17 of them
    assert tier._writer.inline > 0  # the worker wrote some itself: the thread was behind
    assert tier.take_not_kept() == {}
    for i in (0, 191):
        assert np.array_equal(entries.unpack(tier.get(f"k{i}")), entries.unpack(_entry(i)))


def test_a_full_budget_is_counted_as_budget(tmp_path):
    one = len(__import__("pickle").dumps(_entry(0), protocol=5))
    tier = disk.DiskTier(str(tmp_path), "ns", 3 * one, 3600.0)
    # A put after the writer found the budget full is refused at once (0), not handed to
    # it: the writer thread decides how many of the six that is.
    refused = sum(tier.put(f"k{i}", _entry(i)) == 0 for i in range(6))
    tier.settle(timeout_s=30)
    assert len(_files(tier)) == 3 and tier.full
    assert tier.take_not_kept() == ({"budget": 3 - refused} if refused < 3 else {})
    assert tier.put("k9", _entry(9)) == 0  # known full: not even handed to the writer


def test_a_failed_write_is_counted_as_writer(tmp_path, monkeypatch):
    def broken(f, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(disk, "write_file", broken)
    tier = disk.DiskTier(str(tmp_path), "ns", 2**30, 3600.0)
    for i in range(4):
        tier.put(f"k{i}", _entry(i))
    tier.settle(timeout_s=30)
    assert _files(tier) == set() and not [n for n in os.listdir(tier.path) if ".tmp-" in n]
    assert tier.take_not_kept() == {"writer": 4}


def test_settle_writes_beside_the_thread_and_counts_what_is_left_at_its_bound_until_written():
    written = []

    def write(key: str, data: bytes) -> bool:  # a disk that has almost stopped
        time.sleep(0.3)
        written.append(key)
        return True

    writer = Writer(write, buffer_bytes=2**20, backlog_s=10.0)
    for i in range(6):
        writer.hand(f"k{i}", b"x")
    left = writer.settle(timeout_s=0.2)  # each thread finishes the write it began
    # settle wrote one itself, beside the thread (which may not have begun one yet on a
    # busy machine): at most 5 are left, the thread's one in hand among them if it has one.
    assert written and 0 < left <= 5 and writer.take_not_kept() == {"writer": left}
    assert writer.settle(timeout_s=30) == 0 and sorted(written) == [f"k{i}" for i in range(6)]
    # All were written after all: the next counts take back what the first settle counted
    # (the trainer sums them), and a settle with nothing left counts nothing more.
    assert writer.take_not_kept() == {"writer": -left}
    assert writer.settle(timeout_s=1) == 0 and writer.take_not_kept() == {}


def test_an_entry_left_at_a_settle_and_then_failed_is_counted_once():
    go = threading.Event()

    def write(key: str, data: bytes) -> bool:  # the thread's write hangs, then fails
        if threading.current_thread().name == "dpex-cache-disk":
            go.wait(30)
        raise OSError("No such file or directory")

    writer = Writer(write, buffer_bytes=2**20, backlog_s=10.0)
    writer.hand("k0", b"x")  # the thread's, once it takes it
    while writer.pending() and not writer._writing:
        time.sleep(0.01)
    writer.hand("k1", b"x")
    left = writer.settle(timeout_s=0.2)  # writes k1 itself (it fails); k0 is left
    go.set()
    assert writer.settle(timeout_s=30) == 0
    counts = writer.take_not_kept()
    assert left == 1 and counts == {"writer": 2}, (left, counts)  # k1's failure, k0's


def test_the_thread_takes_no_more_than_it_writes_in_its_backlog_time():
    """At its last write's pace, the thread is handed at most BACKLOG_S of writes; past
    that the caller writes (so what a process must write before it ends stays short)."""
    def write(key: str, data: bytes) -> bool:
        time.sleep(0.02)
        return True

    writer = Writer(write, buffer_bytes=2**30, backlog_s=0.1)
    for i in range(40):
        time.sleep(0.005)  # the stage
        writer.hand(f"k{i}", b"x")
        assert writer.pending() <= 0.1 / 0.02 + 2
    writer.settle(timeout_s=30)
    assert writer.inline > 0 and writer.take_not_kept() == {}


@pytest.fixture
def disk_only_runtime(tmp_path):
    runtime.activate(Cache(disk_dir=str(tmp_path), memory_share=0.0, disk_bytes=1), False)
    yield runtime.active()
    runtime.activate(None, False)


def test_an_entry_no_tier_has_room_for_is_counted_in_the_stats(disk_only_runtime):
    import dpex

    class Stage:
        @dpex.cached
        def decode(self, i):
            time.sleep(0.002)
            return np.full(8, i)

    stage = Stage()
    for i in range(4):
        stage.decode(i)
    disk_only_runtime.settle(10)
    (counters,) = runtime.take_counters().values()
    # The first was handed to the writer, which found the budget full; the rest, none once
    # it had (on a busy machine, a few more may be handed before the writer has run).
    assert counters["misses"] == 4 and 1 <= counters["disk_admitted"] <= 4
    assert counters["not_kept_budget"] == 4, counters


def test_an_entry_written_inside_a_stage_is_no_read_of_that_stage(tmp_path):
    """A worker writes an entry itself (its writer behind) while an outer cached stage
    computes: the tier's own files (the temporary file, .bytes) are not the outer's reads,
    or its entry would be stale at once (.bytes changes with every entry)."""
    from dpex.cache import reads

    tier = disk.DiskTier(str(tmp_path), "ns", 2**30, 3600.0)
    with reads.record() as recorded:
        tier._write("k0", b"entry")
    assert recorded[0].files == ()
