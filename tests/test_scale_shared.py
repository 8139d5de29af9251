"""The shared parts at scale (benchmarks/scale_shared.py measures them): a stream's hub
answers a trainer behind with several batches a call, knows each slot's worker without a
handle per claim and evicts without a scan; a cache owner keeps its entries in a few
blocks, which a worker maps and indexes. Counts and structure only, never a speed."""

from __future__ import annotations

import importlib.util
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import wait_until

import dpex
from dpex.cache import entries
from dpex.cache.owner import block_parts, seal
from dpex.share import keys
from dpex.share.hub import MAX_AHEAD, StreamHub

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "benchmarks", "scale_shared.py")
COMPONENTS = {"dataset": "d", "num_workers": "1", "batching": "4/False", "collate_fn": "c",
              "worker_init_fn": "none", "rank": "0/1", "seed": "0"}


def chain(n: int, base_seed: int = 1) -> list[bytes]:
    key, out = keys.epoch_key(COMPONENTS, base_seed), []
    for task_id in range(n):
        key = keys.task_key(key, task_id, [task_id])
        out.append(key)
    return out


class _Submitted:
    """What a worker handle's ``fetch.remote`` gives in a pure test: the call, numbered."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.fetch = SimpleNamespace(remote=self._remote)

    def _remote(self, *args):
        self.calls.append(args)
        return ("ref", len(self.calls))


def _pure_hub(window: int) -> tuple[StreamHub, _Submitted]:
    hub = StreamHub("pure", window_bytes=window)
    hub._batch_bytes = 1.0  # one byte a batch: the window holds `window`
    worker = _Submitted()
    hub.register(("t", 0), worker, 0, 0, [])
    return hub, worker


def test_a_claim_hands_back_the_batches_held_after_its_key_in_order():
    hub, worker = _pure_hub(window=64)
    stream = chain(40)
    made = []
    for task_id, key in enumerate(stream):
        refs, produced, _ = hub.claim(key, stream[task_id - 1] if task_id else None, ("t", 0),
                                      [(task_id, [task_id])], [], (0, task_id))
        assert produced
        made.append(refs[0])
    assert len(worker.calls) == 40
    refs, produced, ahead = hub.claim(stream[0], None, ("t", 0), [(0, [0])], [], (0, 0))
    assert not produced and refs[0] == made[0]
    assert list(ahead) == stream[1:1 + MAX_AHEAD]  # the next keys, in order, at most MAX_AHEAD
    assert [box[0] for box in ahead.values()] == made[1:1 + MAX_AHEAD]
    _, _, ahead = hub.claim(stream[30], stream[29], ("t", 0), [(30, [30])], [], (0, 30))
    assert list(ahead) == stream[31:]  # up to the newest held
    hub.forget([stream[35]])
    _, _, ahead = hub.claim(stream[30], stream[29], ("t", 0), [(30, [30])], [], (0, 30))
    assert list(ahead) == stream[31:35]  # a forgotten batch ends the read-ahead
    assert len(worker.calls) == 40  # nothing computed twice


class _Counted(int):
    """An int that counts the comparisons made with it (a position's epoch and task id)."""

    made = 0

    def __eq__(self, other):
        _Counted.made += 1
        return int(self) == int(other)

    def __lt__(self, other):
        _Counted.made += 1
        return int(self) < int(other)

    __hash__ = int.__hash__


def test_the_window_evicts_its_oldest_batch_without_scanning_it():
    window, claims = 256, 1500
    hub, _ = _pure_hub(window)
    stream = chain(claims)
    _Counted.made = 0
    for task_id, key in enumerate(stream):
        hub.claim(key, None, ("t", 0), [(task_id, None)], [],
                  (_Counted(0), _Counted((task_id * 7919) % claims)))  # out of order
    assert len(hub._refs) == window
    held = sorted((task_id * 7919) % claims for task_id in range(claims))[-window:]
    assert sorted(int(p[1]) for p, _, _ in hub._refs.values()) == held  # the furthest along
    # A heap: a few comparisons per claim (log2 of the window's), where a scan of the
    # window for its oldest batch makes hundreds.
    assert _Counted.made / claims < 16 * math.log2(window), _Counted.made / claims


class Fetcher:
    """A worker process as the hub sees one: ``fetch`` says what it was asked."""

    def begin(self) -> None:
        return None

    def fetch(self, tasks, worker_id=None, generation=None, after=None, barrier=None):
        return {"tasks": tasks, "worker_id": worker_id, "generation": generation}


@pytest.mark.ray
def test_a_trainer_behind_reads_many_batches_a_call_and_slots_register_once(ray_local):
    from dpex.share.stream import SharedStream

    name = f"scale-{os.getpid()}"
    worker_class = ray_local.remote(num_cpus=0)(Fetcher)
    streams, slots = [], []
    for worker_id in range(2):
        stream = SharedStream(name, window_share=0.2)
        stream.attach(COMPONENTS, None, store_bytes=64 * 2**20)
        assert stream.usable(dpex.WorkerOptions().start_timeout_s)
        stream.batch_bytes = 2**16  # a window of 204 batches
        worker = worker_class.remote()
        streams.append(stream)
        slots.append(SimpleNamespace(actor=worker, worker_id=worker_id, generation=0,
                                     barrier=worker.begin.remote(), after_ref=None))
    ahead_of, behind = streams
    stream_keys, n = chain(40), 40
    made = [ahead_of.claim(key, stream_keys[t - 1] if t else None, slots[0], [(t, [t])], None)
            for t, key in enumerate(stream_keys)]
    assert all(produced for _, produced in made) and ahead_of.calls == n
    read = []
    for t, key in enumerate(stream_keys):
        ref, produced = behind.claim(key, stream_keys[t - 1] if t else None, slots[1],
                                     [(t, [t])], slots[1].after_ref)
        slots[1].after_ref = None if produced else ref
        read.append(ref)
    assert read == [ref for ref, _ in made]  # the very batches the first one made
    assert behind.from_stream == n and behind.computed == 0
    assert behind.calls == math.ceil(n / (MAX_AHEAD + 1)), behind.calls
    hub = ahead_of.hub
    described = ray_local.get(hub.describe.remote())
    assert described["claims"] == n + behind.calls
    assert described["registered"] == 2  # one per slot: no handle with each claim
    # A slot that changes (a new replica's fence, an epoch's barrier) registers again, and
    # the claims after it compute with what it now is.
    slots[1].generation = 1
    slots[1].barrier = slots[1].actor.begin.remote()
    extra = chain(41)[-1]
    ref, produced = behind.claim(extra, stream_keys[-1], slots[1], [(40, [40])], None)
    assert produced
    assert ray_local.get(ref) == {"tasks": [(40, [40])], "worker_id": 1, "generation": 1}
    assert ray_local.get(hub.describe.remote())["registered"] == 3
    for stream in streams:
        stream.close()


def _entry(i: int):
    value = np.full(8, i % 251, dtype=np.uint8)
    value.flags.writeable = False
    return entries.Entry(entries.pack(value), ())


def test_a_block_gives_back_each_entry_as_it_was_stored():
    frozen = np.arange(24, dtype=np.float32).reshape(4, 6)
    frozen.flags.writeable = False
    values = [torch.rand(5, 3).t(), np.asfortranarray(np.random.rand(3, 4)), frozen,
              {"label": 3, "text": "a"}, np.zeros(0, dtype=np.int16), torch.arange(7)[::2]]
    stored = [entries.Entry(entries.pack(v), (("/x", ()),)) for v in values]
    block = seal([(f"k{i}", entries.to_parts(s)) for i, s in enumerate(stored)])
    assert block[0] == [f"k{i}" for i in range(len(values))]
    data = block[3]
    for i, value in enumerate(values):
        meta, arrays = block_parts(block, i)
        for array in arrays:  # views of the block's one buffer, each on a 64-byte boundary
            assert array.base is data or array.base is data.base
            assert (array.ctypes.data - data.ctypes.data) % 64 == 0
        entry = entries.from_parts((meta, arrays))
        assert entry.files == (("/x", ()),)
        got = entries.unpack(entry)
        if isinstance(value, torch.Tensor):
            assert torch.equal(got, value) and got.stride() == value.stride()
        elif isinstance(value, np.ndarray):
            assert np.array_equal(got, value) and got.dtype == value.dtype
            assert got.flags.f_contiguous == value.flags.f_contiguous
            assert got.flags.writeable == value.flags.writeable
        else:
            assert got == value


@pytest.mark.ray
def test_an_owner_keeps_its_entries_in_blocks_that_a_worker_maps_and_indexes(ray_local):
    from dpex.cache.memory import MemoryTier
    from dpex.cache.options import user
    from dpex.cache.owner import owner_for

    n, send_every, poll_every = 3000, 16, 8
    namespace = f"scale-{os.getpid()}"
    node = ray_local.get_runtime_context().get_node_id()
    owner = owner_for(user(), namespace, "scale", node, limit=2**30, ttl_s=600.0)
    keys_sent = [f"{i:032x}" for i in range(n)]
    try:
        for call, offset in enumerate(range(0, n, send_every)):
            ray_local.get(owner.put.remote(
                [(keys_sent[i], entries.to_parts(_entry(i)), 8, False)
                 for i in range(offset, min(n, offset + send_every))]))
            if call % poll_every == poll_every - 1:  # a worker's poll seals a block
                ray_local.get(owner.updates.remote(0))
        count, listed, full, received = ray_local.get(owner.updates.remote(0))
        per_poll = send_every * poll_every
        assert count == len(listed) == math.ceil(n / per_poll) and not full  # not 3000
        assert received == n  # every entry put counts, kept or not (sent.py)
        assert ray_local.get(owner.describe.remote())["entries"] == n
        tier = MemoryTier(node, namespace, "scale", dpex.Cache(disk_bytes=0))  # refresh()
        assert wait_until(lambda: (tier.poll(), len(tier._index) == n)[1], timeout=60)
        assert len(tier._mapped) == count  # one map per block, not per entry
        for i in (0, 1, per_poll - 1, per_poll, n - 1):
            got = entries.unpack(tier.get(keys_sent[i]))
            assert np.array_equal(got, np.full(8, i % 251, dtype=np.uint8))
            assert not got.flags.writeable  # a view of the block, in the store
        # A stale entry replaced: the later block's wins.
        ray_local.get(owner.put.remote([(keys_sent[7], entries.to_parts(_entry(100)), 8, True)]))
        tier._ask()
        assert wait_until(lambda: (tier.poll(), len(tier._mapped) == count + 1)[1], timeout=60)
        assert np.array_equal(entries.unpack(tier.get(keys_sent[7])), np.full(8, 100, np.uint8))
        assert tier.has(keys_sent[7])
    finally:
        ray_local.kill(owner)


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_scale_shared", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # 25-45 s of the default tier: make test-slow
@pytest.mark.ray
def test_the_scale_benchmark_runs_at_a_tiny_size(ray_local, tmp_path, capsys):
    out = tmp_path / "scale.md"
    bench = _load_bench()
    assert bench.main(["all", "--callers", "1", "2", "--processes", "1", "--claims", "12",
                       "--repeats", "1", "--floor-calls", "20", "--sizes", "64", "128",
                       "--read-timeout", "60", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    written = out.read_text()
    for title in ("Ray's floor", "hub, callers free", "hub, callers paced", "owner: N entries"):
        assert title in printed and title in written
    assert "| 128 |" in written and "at 1,280,000 entries" in written
