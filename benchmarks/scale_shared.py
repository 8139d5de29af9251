"""The shared parts at scale: one stream's hub under many trainers, one node's cache owner
under many entries (the "scale model" of the design notes).

hub: C callers claim the same epoch of keys from one real ``StreamHub`` (share/hub.py),
each through a real ``SharedStream.claim`` (share/stream.py), with a slot kept as
sharing.py keeps it (``after`` the previous batch when another worker made it, a
``barrier`` reference), as a trainer does once per batch. The callers are threads in at
most ``--processes`` Ray actors; their workers are small actors whose ``fetch`` returns a
few bytes, so that the hub's work is what is measured. Two patterns: callers free (as
fast as the hub answers, started together: a tight pack, the worst case for read-ahead)
and callers paced at ``--rate`` claims/s, started ``--stagger`` batches apart. Per run:
the hub process's CPU per claim, of all its threads and of its main thread (``/proc``). An
actor runs its methods on its main thread, so that thread's CPU per claim bounds the
claims/s one hub answers, whatever the cores its Ray I/O threads find; on a small machine
the callers share the cores, so the wall rate says less. A first table gives Ray's floor:
an empty actor call, measured the same way.

owner: N entries of 8 bytes go into one real ``CacheOwner`` (cache/owner.py) through its
``put``, ``--send-every`` entries a call as workers send them, with an ``updates`` (a
worker's poll) every ``--poll-every`` calls. Then: the owner process's RSS and CPU per
entry admitted, its listing of everything (``updates(0)``), and a fresh worker process's
first read of the node's index through the real ``MemoryTier`` (memory.py: ``refresh``,
``poll``, ``_map``) until every key is indexed, with the owner's CPU serving it and the
reader's RSS growth. The growth per entry is printed, and extrapolated to 1.28M entries.

Both print median (min-max) over ``--repeats`` runs; ``--out FILE`` writes the tables as
markdown. Run it from a checkout (``PYTHONPATH=<checkout>/src``) to compare versions.

Usage:
    python benchmarks/scale_shared.py hub [--callers 1 4 16] [--claims 2000] [--repeats 3]
    python benchmarks/scale_shared.py owner [--sizes 10000 100000 1280000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from typing import Any

# ---------------------------------------------------------------------------- helpers


def spread(values: list[float], digits: int = 1) -> str:
    """``median (min-max)`` of ``values``."""
    fmt = f"{{:,.{digits}f}}"
    if len(values) == 1:
        return fmt.format(values[0])
    return (f"{fmt.format(statistics.median(values))} "
            f"({fmt.format(min(values))}-{fmt.format(max(values))})")


def process_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of process ``pid`` so far: (all its threads, its main
    thread)."""
    import psutil

    times = psutil.Process(pid).cpu_times()
    with open(f"/proc/{pid}/task/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    main = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return times.user + times.system, main


def process_rss(pid: int) -> int:
    import psutil

    return psutil.Process(pid).memory_info().rss


def start_ray(cpus: int, store_mib: int) -> bool:
    """An embedded local Ray of ``cpus`` logical CPUs, unless one runs (a test's): True if
    started here. Its workers import dpex from where this process did."""
    import ray
    from ray import cloudpickle
    from ray.job_config import JobConfig

    import dpex

    if __name__ in sys.modules and __name__ != "__main__":  # imported: its classes by value
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    if ray.is_initialized():
        return False
    src = os.path.dirname(os.path.dirname(os.path.abspath(dpex.__file__)))
    ray.init(address="local", num_cpus=cpus, object_store_memory=store_mib * 2**20,
             include_dashboard=False, logging_level="ERROR",
             job_config=JobConfig(_py_driver_sys_path=[src]))
    return True


def print_table(title: str, header: list[str], rows: list[list[str]], out: list[str]) -> None:
    lines = [f"### {title}", "", "| " + " | ".join(header) + " |",
             "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    print("\n".join(lines), flush=True)
    out.extend([*lines, ""])


# ---------------------------------------------------------------------------- hub

# One loader kind: every caller's keys are the same epoch's.
COMPONENTS = {"dataset": "scale", "num_workers": "1", "batching": "32/False",
              "collate_fn": "torch.default_collate", "worker_init_fn": "none",
              "rank": "0/1", "seed": "0"}


class FakeWorker:
    """A dpex worker process as the hub sees one: ``fetch`` (worker.py's signature)
    returns a few bytes; ``begin`` gives the slot its barrier reference."""

    def begin(self) -> None:
        return None

    def fetch(self, tasks: list, worker_id: Any = None, generation: Any = None,
              after: Any = None, barrier: Any = None) -> list[int]:
        return [task_id for task_id, _ in tasks]


class Caller:
    """One process of callers: ``threads`` trainers, each claiming every key of an epoch
    in order through its own ``SharedStream``."""

    def __init__(self, stream: str, threads: int, first_id: int, window: int,
                 store_bytes: int) -> None:
        import ray

        from dpex.share import keys

        self._stream, self._window, self._store = stream, window, store_bytes
        self._workers = [ray.remote(num_cpus=0)(FakeWorker).remote() for _ in range(threads)]
        self._first_id = first_id
        self._epoch = keys.epoch_key(COMPONENTS, base_seed=1)
        ray.get([w.begin.remote() for w in self._workers])

    def run(self, claims: int, start_at: float, rate: float, stagger: float
            ) -> list[dict[str, Any]]:
        """Each thread claims tasks 0..claims-1: from ``start_at`` (a wall time) as fast as
        it can (``rate`` 0), or at ``rate`` claims/s from ``stagger`` batches after the
        caller numbered before it."""
        from dpex.share import keys

        chain, key = [], self._epoch
        for task_id in range(claims):
            key = keys.task_key(key, task_id, list(range(task_id * 32, task_id * 32 + 32)))
            chain.append(key)
        results: list[dict[str, Any]] = [{} for _ in self._workers]
        threads = []
        for i in range(len(self._workers)):
            begin = start_at + (self._first_id + i) * stagger / rate if rate else start_at
            threads.append(threading.Thread(target=self._trainer,
                                            args=(i, chain, begin, rate, results)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return results

    def _trainer(self, i: int, chain: list[bytes], start_at: float, rate: float,
                 results: list[dict[str, Any]]) -> None:
        from types import SimpleNamespace

        from dpex import WorkerOptions
        from dpex.share.stream import SharedStream

        worker = self._workers[i]
        stream = SharedStream(self._stream, window_share=0.2)
        stream.attach(COMPONENTS, node_id=None, store_bytes=self._store)
        assert stream.usable(WorkerOptions().start_timeout_s)
        stream.batch_bytes = 0.2 * self._store / self._window  # the window holds `window`
        slot = SimpleNamespace(actor=worker, worker_id=self._first_id + i, generation=0,
                               barrier=worker.begin.remote(), after_ref=None)
        held: list[Any] = []  # the batches in flight, as a trainer's prefetch holds them
        latencies = []
        time.sleep(max(0.0, start_at - time.time()))
        started = time.time()
        for task_id, key in enumerate(chain):
            if rate:  # a trainer's pace: the next batch is due then
                time.sleep(max(0.0, started + task_id / rate - time.time()))
            t0 = time.perf_counter()
            previous = chain[task_id - 1] if task_id else None
            ref, made_here = stream.claim(key, previous, slot, [(task_id, None)],
                                          slot.after_ref)
            latencies.append(time.perf_counter() - t0)
            slot.after_ref = None if made_here else ref
            held = [*held[-3:], ref]
        results[i] = {"start": started, "end": time.time(), "claims": len(chain),
                      "calls": stream.calls, "computed": stream.computed,
                      "latency_ms": statistics.median(latencies) * 1e3}
        stream.close()


def hub_run(args: argparse.Namespace, callers: int, paced: bool, run: int) -> dict[str, Any]:
    """One run: a new hub, ``callers`` trainers in ``args.processes`` processes at most."""
    import ray

    from dpex.cache.options import user
    from dpex.share.hub import hub_for

    name = f"scale-shared-{os.getpid()}-{callers}-{int(paced)}-{run}"
    store = 2 * 2**30
    hub = hub_for(user(), name, int(0.2 * store), None)  # the callers attach to this one
    ray.get(hub.attach.remote(COMPONENTS))  # held here: the callers' leaving never ends it
    hub_pid = ray.get(hub.describe.remote())["pid"]
    processes = min(args.processes, callers)
    per = [callers // processes + (p < callers % processes) for p in range(processes)]
    remote_caller = ray.remote(num_cpus=0)(Caller)
    actors = [remote_caller.remote(name, threads, sum(per[:p]), args.window, store)
              for p, threads in enumerate(per)]
    ray.get([a.__ray_ready__.remote() for a in actors])
    rate, stagger = (args.rate, args.stagger) if paced else (0.0, 0.0)
    cpu0 = process_cpu_s(hub_pid)
    parts = [r for rs in ray.get([a.run.remote(args.claims, time.time() + 1.0, rate, stagger)
                                  for a in actors]) for r in rs]
    cpu1 = process_cpu_s(hub_pid)
    described = ray.get(hub.describe.remote())
    for actor in actors:
        ray.kill(actor)
    ray.kill(hub)
    wall = max(p["end"] for p in parts) - min(p["start"] for p in parts)
    total = sum(p["claims"] for p in parts)
    calls = sum(p["calls"] for p in parts)
    assert described["claims"] == calls, (described, calls)
    return {"claims_per_s": total / wall, "hub_cpu_us": (cpu1[0] - cpu0[0]) / total * 1e6,
            "hub_main_us": (cpu1[1] - cpu0[1]) / total * 1e6,
            "slowest_rate": min(p["claims"] / (p["end"] - p["start"]) for p in parts),
            "latency_ms": statistics.median(p["latency_ms"] for p in parts),
            "calls": calls / total, "computed": described["computed"] / total}


class Empty:
    """An actor with one empty method: what any actor call costs the actor."""

    def pid(self) -> int:
        return os.getpid()

    def ping(self, key: bytes) -> bytes:
        return key


def empty_call_cost(calls: int) -> tuple[float, float]:
    """(actor CPU us per call, its main thread's) over ``calls`` empty calls in turn."""
    import ray

    actor = ray.remote(num_cpus=0)(Empty).remote()
    pid = ray.get(actor.pid.remote())
    before = process_cpu_s(pid)
    for _ in range(calls):
        ray.get(actor.ping.remote(b"k" * 16))
    after = process_cpu_s(pid)
    ray.kill(actor)
    return (after[0] - before[0]) / calls * 1e6, (after[1] - before[1]) / calls * 1e6


def hub_part(args: argparse.Namespace, out: list[str]) -> None:
    floor = [empty_call_cost(args.floor_calls) for _ in range(args.repeats)]
    print_table(f"Ray's floor: an empty actor call, {args.floor_calls} in turn from one "
                f"caller; median (min-max) of {args.repeats}",
                ["actor CPU us/call, all threads", "main thread us/call"],
                [[spread([f[0] for f in floor], 0), spread([f[1] for f in floor], 0)]], out)
    for paced in (False, True):
        rows = []
        for callers in args.callers:
            runs = [hub_run(args, callers, paced, r) for r in range(args.repeats)]
            bound = [1e6 / r["hub_main_us"] for r in runs]
            rows.append([
                str(callers),
                spread([r["slowest_rate" if paced else "claims_per_s"] for r in runs], 0),
                spread([r["hub_cpu_us"] for r in runs], 0),
                spread([r["hub_main_us"] for r in runs], 0), spread(bound, 0),
                spread([b / args.rate for b in bound]),
                spread([r["latency_ms"] for r in runs], 2),
                spread([r["calls"] for r in runs], 2), spread([r["computed"] for r in runs], 2)])
        how = (f"paced at {args.rate:g} claims/s each, started {args.stagger:g} batches apart"
               if paced else "free (as fast as answered), started together")
        print_table(
            f"hub, callers {how}: {args.claims} claims each, window {args.window}; "
            f"median (min-max) of {args.repeats}",
            ["callers", "slowest caller's claims/s" if paced else "claims/s, all callers",
             "hub CPU us/claim, all threads", "main thread us/claim",
             "claims/s one hub answers (main thread)", f"trainers at {args.rate:g} batches/s",
             "claim latency ms", "hub calls per claim", "computed per claim"], rows, out)


# ---------------------------------------------------------------------------- owner


def tiny_entries(n: int, offset: int) -> list[tuple[str, Any, int, bool]]:
    """``n`` entries as a worker sends them to its node's owner (``MemoryTier.put``): a key
    as ``entry_key`` makes it, and an 8-byte read-only array (as ``np.asarray`` of a
    decoded image is) in parts (``entries.to_parts``)."""
    import numpy as np

    from dpex.cache import entries
    from dpex.cache.fingerprint import entry_key

    out = []
    for i in range(offset, offset + n):
        value = np.full(8, i % 251, dtype=np.uint8)
        value.flags.writeable = False
        stored = entries.Entry(entries.pack(value), ())
        out.append((entry_key((i,), {}), entries.to_parts(stored), entries.nbytes(stored), False))
    return out


class Reader:
    """A fresh worker process meeting its node's owner: the real ``MemoryTier``, polled
    until every key is indexed."""

    def pid(self) -> int:
        return os.getpid()

    def read(self, namespace: str, expected: int, timeout_s: float) -> dict[str, float]:
        import ray

        import dpex
        from dpex.cache import entries
        from dpex.cache.memory import MemoryTier

        node = ray.get_runtime_context().get_node_id()
        rss0 = process_rss(os.getpid())
        started = time.perf_counter()
        tier = MemoryTier(node, namespace, "scale", dpex.Cache(disk_bytes=0))  # refresh()
        while len(tier._index) < expected:
            if time.perf_counter() - started > timeout_s:
                raise TimeoutError(f"{len(tier._index)} of {expected} indexed")
            time.sleep(0.01)
            tier.poll()
        seconds = time.perf_counter() - started
        some = next(iter(tier._index))
        assert isinstance(tier.get(some), entries.Entry), some
        return {"read_s": seconds, "reader_rss": process_rss(os.getpid()) - rss0}


def owner_run(args: argparse.Namespace, n: int, run: int) -> dict[str, float]:
    """One owner filled with ``n`` entries; then its listing, and a fresh reader."""
    import ray

    from dpex.cache.options import user
    from dpex.cache.owner import owner_for

    namespace = f"scale-shared-{os.getpid()}-{n}-{run}"
    node = ray.get_runtime_context().get_node_id()
    owner = owner_for(user(), namespace, "scale", node, limit=2**40, ttl_s=3600.0)
    pid = ray.get(owner.describe.remote())["pid"]
    rss0, cpu0, fill_s = process_rss(pid), process_cpu_s(pid)[0], 0.0
    for call, offset in enumerate(range(0, n, args.send_every)):
        batch = tiny_entries(min(args.send_every, n - offset), offset)
        started = time.perf_counter()
        ray.get(owner.put.remote(batch))
        if call % args.poll_every == args.poll_every - 1:
            ray.get(owner.updates.remote(2**62))  # a worker's poll (it lists nothing here)
        fill_s += time.perf_counter() - started
    fill_cpu = process_cpu_s(pid)[0] - cpu0
    started, cpu0 = time.perf_counter(), process_cpu_s(pid)[0]
    count, listed, _, _ = ray.get(owner.updates.remote(0))
    list_s, list_cpu = time.perf_counter() - started, process_cpu_s(pid)[0] - cpu0
    assert count == len(listed), (count, len(listed))  # Ray objects: entries, or blocks
    del listed
    described = ray.get(owner.describe.remote())
    assert described["entries"] == n, described
    rss_full = process_rss(pid)
    reader = ray.remote(num_cpus=0)(Reader).remote()
    ray.get(reader.pid.remote())  # started: its process's start is not the read
    cpu0 = process_cpu_s(pid)[0]
    read = ray.get(reader.read.remote(namespace, n, args.read_timeout))
    serve_cpu = process_cpu_s(pid)[0] - cpu0
    rss_read = process_rss(pid)
    ray.kill(reader)
    ray.kill(owner)
    return {"objects": count, "fill_per_s": n / fill_s, "fill_cpu_us": fill_cpu / n * 1e6,
            "owner_rss0": rss0, "owner_rss": rss_full, "owner_rss_read": rss_read,
            "list_s": list_s, "list_cpu_s": list_cpu, "serve_cpu_s": serve_cpu, **read}


def owner_part(args: argparse.Namespace, out: list[str]) -> None:
    rows, medians = [], []
    mib = 2**20
    for n in args.sizes:
        runs = [owner_run(args, n, r) for r in range(args.repeats)]

        def col(name: str, digits: int = 0, scale: float = 1.0) -> str:
            return spread([r[name] / scale for r in runs], digits)  # noqa: B023

        rows.append([f"{n:,}", col("objects"), col("fill_per_s"), col("fill_cpu_us", 1),
                     col("owner_rss0", 0, mib), col("owner_rss", 0, mib),
                     spread([(r["owner_rss"] - r["owner_rss0"]) / n for r in runs], 0),
                     col("owner_rss_read", 0, mib), col("list_s", 3), col("list_cpu_s", 3),
                     col("read_s", 3), col("serve_cpu_s", 3), col("reader_rss", 0, mib)])
        medians.append((n, *(statistics.median(r[k] for r in runs)
                             for k in ("read_s", "serve_cpu_s", "reader_rss", "owner_rss"))))
    print_table(
        f"owner: N entries of 8 bytes, sent {args.send_every} a call, a poll every "
        f"{args.poll_every} calls; median (min-max) of {args.repeats}",
        ["entries", "Ray objects", "admitted/s (one sender)", "owner CPU us/entry admitted",
         "owner RSS MiB, empty", "owner RSS MiB, full", "owner bytes/entry",
         "owner RSS MiB after a reader", "listing all: s", "listing: owner CPU s",
         "a fresh worker's read until all indexed: s", "owner CPU s serving it",
         "reader RSS growth MiB"], rows, out)
    if len(medians) > 1:
        (n0, *first), (n1, *last) = medians[0], medians[-1]
        slopes = [(b - a) / (n1 - n0) for a, b in zip(first, last)]
        at = [b + s * (1_280_000 - n1) for b, s in zip(last, slopes)]
        growth = (f"Growth from {n0:,} to {n1:,} entries, per entry: a fresh worker's read "
                  f"{slopes[0] * 1e6:.2f} us, the owner's CPU serving it "
                  f"{slopes[1] * 1e6:.2f} us, the reader's RSS {slopes[2]:.0f} B, the "
                  f"owner's RSS {slopes[3]:.0f} B; at 1,280,000 entries (linear): read "
                  f"{at[0]:.2f} s, owner CPU {at[1]:.2f} s per worker process, reader RSS "
                  f"{at[2] / mib:.0f} MiB, owner RSS {at[3] / mib:.0f} MiB.")
        lines = [growth, ""]
        print("\n".join(lines))
        out.extend(lines)


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["hub", "owner", "all"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=2, help="the embedded Ray's logical CPUs")
    parser.add_argument("--store-mib", type=int, default=1024)
    parser.add_argument("--out", help="write the tables here (markdown)")
    hub = parser.add_argument_group("hub")
    hub.add_argument("--callers", type=int, nargs="+", default=[1, 4, 16])
    hub.add_argument("--processes", type=int, default=4, help="caller processes at most")
    hub.add_argument("--claims", type=int, default=2000, help="claims per caller and run")
    hub.add_argument("--window", type=int, default=64, help="batches the window holds")
    hub.add_argument("--rate", type=float, default=100.0, help="a trainer's batches/s")
    hub.add_argument("--stagger", type=float, default=4.0,
                     help="paced callers start this many batches apart")
    hub.add_argument("--floor-calls", type=int, default=1000,
                     help="empty calls that measure Ray's floor")
    owner = parser.add_argument_group("owner")
    owner.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    owner.add_argument("--send-every", type=int, default=16,
                       help="entries a put call carries (a worker sends 16)")
    owner.add_argument("--poll-every", type=int, default=8,
                       help="put calls between two polls (updates) of the owner")
    owner.add_argument("--read-timeout", type=float, default=900.0,
                       help="seconds a reader may take to index every entry")
    args = parser.parse_args(argv)
    import ray

    out: list[str] = []
    started = start_ray(args.cpus, args.store_mib)
    try:
        if args.what in ("hub", "all"):
            hub_part(args, out)
        if args.what in ("owner", "all"):
            owner_part(args, out)
    finally:
        if started:
            ray.shutdown()
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
