"""``python local_start_script.py MODE``: a cold process's loader begins on local processes
and moves to Ray mid-epoch (tests/test_local_start.py). MODE ``handover``: nothing else
happens; ``kill``: a local process is SIGKILLed while its workers are being handed over;
``stalled``: epochs far shorter than a Ray process's start, with torch's default
non-persistent workers, until every worker is on Ray, while the embedded head's first
raylet is stopped (SIGSTOP) as soon as it exists, as a machine too busy to let it register
would, and the raylet of the head the trainer then joins is stopped for 5 s from the
moment it joined, as a head slow to answer would; ``short``: short epochs for 2.5 s, a run
that ends before the helper would start Ray; ``stream``: 3 epochs of a stream without
``state_dict``, whose workers cannot move. Prints one JSON line: whether the batches are
torch's, and what the loader did."""

import json
import os
import signal
import sys
import threading
import time

import torch
from grpc import _channel as grpc_channel
from grpc.aio import _channel as grpc_aio_channel

import dpex
from dpex.process_ends import descendants
from dpex.ray_session import embedded, head_priority

# The grpcio channels this process opens (the trainer opens none: from the first one on,
# each fork runs grpc's fork handlers, which at times hang; NOTE [ dpex How Each Process
# Ends ]). Counted where every sync and asyncio channel is made.
GRPC_CHANNELS: list[str] = []


def _counting(make):
    def made(self, target, *args, **kwargs):
        GRPC_CHANNELS.append(str(target))
        make(self, target, *args, **kwargs)
    return made


grpc_channel.Channel.__init__ = _counting(grpc_channel.Channel.__init__)
grpc_aio_channel.Channel.__init__ = _counting(grpc_aio_channel.Channel.__init__)


class Noisy(torch.utils.data.Dataset):
    """Items that take ``item_s`` and draw from torch's RNG (the worker's stream must carry
    over). torch's reference reads them without the wait: what an item holds does not
    depend on it, and the reference of a long run of short epochs then costs half as much."""

    def __init__(self, item_s: float = 0.0):
        self.item_s = item_s

    def __len__(self):
        return 1600

    def __getitem__(self, i):
        time.sleep(self.item_s)
        return torch.tensor([float(i)]) + torch.rand(3)


def item_s(distribute_mode) -> float:
    """dpex's items take their time (the hand-over happens while they do); torch's do not."""
    return 0.005 if distribute_mode else 0.0


def batches(distribute_mode, fault=None):
    loader = dpex.DataLoader(Noisy(item_s(distribute_mode)), batch_size=4, shuffle=True,
                             num_workers=2,
                             generator=torch.Generator().manual_seed(5),
                             distribute_mode=distribute_mode)
    it = iter(loader)
    out = [next(it) for _ in range(5)]
    if distribute_mode:
        local_pids = [p.actor.process.pid for p in it._procs]
        embedded._head.wait()
    for batch in it:
        out.append(batch)
        if distribute_mode and it._local_active:
            # A training step while the workers move: the rest of the epoch outlasts the
            # hand-over (Ray processes that import torch took over 4 s to answer on a slow
            # day of this machine, longer than the epoch's rest at full speed; on a day
            # twice as slow, with the slow tier beside it, over the 20 s that 50 ms steps
            # gave). Paid only until the workers moved.
            time.sleep(0.1)
        if fault is not None and it._local_twins and not fault["done"]:
            os.kill(local_pids[0], signal.SIGKILL)
            fault["done"] = True
    return out, loader, (local_pids if distribute_mode else [])


def short_epochs(distribute_mode, count=None, limit_s=None, spans=None):
    """Epochs of 8 batches (about 0.1 s), ``count`` of them or, for dpex, until an epoch
    began on Ray processes (or ``limit_s`` passed). ``spans``: each epoch's (start, end)."""
    from dpex.workers.pool import POOL

    deadline = time.monotonic() + limit_s if limit_s else None
    loader = dpex.DataLoader(Noisy(item_s(distribute_mode)), batch_size=4, num_workers=2,
                             sampler=range(32),
                             generator=torch.Generator().manual_seed(5),
                             distribute_mode=distribute_mode)
    epochs, began_on_ray = [], False
    while len(epochs) != count and (deadline is None or time.monotonic() < deadline):
        started = time.monotonic()
        it = iter(loader)
        began_on_ray = distribute_mode and not it._local_active
        epochs.append(list(it))
        if spans is not None:
            spans.append((started, time.monotonic()))
        if began_on_ray and POOL.answered:
            break
    return epochs, loader, began_on_ray


def first_raylet(besides: tuple[int, ...] = ()) -> int | None:
    """The pid of the first raylet below this process but ``besides``, if there is one."""
    for pid, _ in descendants([os.getpid()]):
        if pid in besides:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().split(b"\0")[0]
        except OSError:
            continue
        if command.endswith(b"/raylet"):
            return pid
    return None


def stall_first_raylet(stalled: list[int]) -> None:
    """SIGSTOP the first raylet below this process, and note its pid and its helper's."""
    while (pid := first_raylet()) is None:
        time.sleep(0.02)
    os.kill(pid, signal.SIGSTOP)
    stalled.extend([pid, embedded._head._proc.pid])


def stall_raylet_once_joined(stall: dict, stalled: list[int], stall_s: float = 5.0) -> None:
    """Once the trainer has joined the embedded head, stop its raylet (the node's object
    store, which a ``ray.put`` waits on) for ``stall_s``, as a head still starting at the
    lowest priority on a busy machine is slow to answer; note when. (The head it joins is
    the one after the head whose raylet ``stalled`` names, a raylet killed by now.)"""
    import ray

    while not ray.is_initialized():
        time.sleep(0.002)
    while (pid := first_raylet(besides=tuple(stalled))) is None:
        time.sleep(0.002)
    os.kill(pid, signal.SIGSTOP)
    stall["from"] = time.monotonic()
    time.sleep(stall_s)
    stall["to"] = time.monotonic()
    os.kill(pid, signal.SIGCONT)


def main_epochs():
    from dpex.workers.pool import POOL

    stalled: list[int] = []
    store_stall: dict[str, float] = {}
    spans: list[tuple[float, float]] = []
    threading.Thread(target=stall_first_raylet, args=(stalled,), daemon=True).start()
    threading.Thread(target=stall_raylet_once_joined, args=(store_stall, stalled),
                     daemon=True).start()
    # Until an epoch begins on Ray's processes. The loop leaves no core idle, so the head,
    # at the lowest priority until then, may take until its cap (head_priority.LOW_S) to
    # start on a machine busy with other work: the limit leaves room for it.
    got, loader, last_began_on_ray = short_epochs(True, limit_s=head_priority.LOW_S + 120,
                                                  spans=spans)
    expected, _, _ = short_epochs(False, count=len(got))

    print(json.dumps({
        "equal": [len(e) for e in got] == [len(e) for e in expected] and all(
            torch.equal(a, b) for epoch, theirs in zip(got, expected) for a, b in zip(epoch, theirs)),
        "epochs": len(got), "last_began_on_ray": last_began_on_ray,
        "created": POOL.created, "reused": POOL.reused,
        "events": [e.reason for e in loader.stats().scaling_events],
        "spilled": loader.stats().store_spilled_bytes, "grpc_channels": GRPC_CHANNELS,
        "stalled": stalled, "helper_pid": embedded._head._proc.pid,
        "head_retries_left": embedded._head.retries_left,
        "store_stall": store_stall, "spans": spans,
    }), flush=True)


def ray_worker_processes(helper_pid: int) -> list[str]:
    """The embedded node's Python worker processes (below the helper), by title."""
    from dpex.process_ends import descendants

    def title(pid: int) -> str:
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                return f.read().replace("\0", " ").strip()
        except OSError:
            return ""

    def a_worker(title: str) -> bool:  # "ray::IDLE", "ray::Worker", or still starting
        if title.startswith("ray::"):
            return "Agent" not in title
        return os.path.basename(title.split(" ", 1)[0]).startswith("python") and \
            "default_worker.py" in title

    titles = [title(pid) for pid, _ in descendants([helper_pid]) if pid != helper_pid]
    return [t for t in titles if a_worker(t)]


def outside_session(helper_pid: int) -> list[str]:
    """The embedded Ray's live processes outside the helper's session."""
    benchmarks = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "benchmarks")
    if benchmarks not in sys.path:
        sys.path.append(benchmarks)
    from clusters.process_tree import stat_fields  # benchmarks/clusters/process_tree.py

    return [str(pid) for pid, _ in descendants([helper_pid])
            if (fields := stat_fields(pid)) is not None and fields[0] != "Z"
            and os.getsid(pid) != helper_pid]


def main_short():
    """torch's loader, then dpex's for 2.5 s, well within the helper's wait before Ray's start
    (``head_priority.START_AFTER_S``), then the exit: every process below the trainer,
    watched to the end, and the epochs both ran, compared."""
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for pid, _ in descendants([os.getpid()]):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        seen.add(os.path.basename(f.read().split(b"\0")[0]).decode())
                except OSError:
                    pass
            time.sleep(0.05)

    expected, _, _ = short_epochs(False, limit_s=2.5)
    threading.Thread(target=watch, daemon=True).start()
    got, _, _ = short_epochs(True, limit_s=2.5)
    done.set()
    print(json.dumps({
        "epochs": len(got), "equal": all(torch.equal(a, b) for epoch, theirs in zip(
            got, expected) for a, b in zip(epoch, theirs)),
        "seen": sorted(seen), "helper_pid": embedded._head._proc.pid,
        "ray_initialized": __import__("ray").is_initialized(),
    }), flush=True)


class NoisyStream(torch.utils.data.IterableDataset):
    """A generator without ``state_dict``: its replica's place lives only in its process."""

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        for i in range(info.id, 48, info.num_workers):
            yield torch.full((2,), float(i)) + torch.rand(2)


def main_stream():
    """3 epochs of ``NoisyStream`` in each mode: dpex's on local processes throughout, and
    no Ray started for them (they could never use it)."""
    runs = {}
    for mode in (False, True):
        loader = dpex.DataLoader(NoisyStream(), batch_size=4, num_workers=2,
                                 generator=torch.Generator().manual_seed(5),
                                 distribute_mode=mode)
        runs[mode] = ([list(loader) for _ in range(3)], loader)
    (expected, _), (got, loader) = runs[False], runs[True]
    print(json.dumps({
        "equal": [len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
                  for a, b in zip(expected, got)],
        "nodes": sorted(loader.stats().per_node), "helper": embedded._head is not None,
        "ray_initialized": __import__("ray").is_initialized(),
    }), flush=True)


def main():
    mode = sys.argv[1]
    if mode == "stream":
        return main_stream()
    if mode == "short":
        return main_short()
    if mode == "stalled":
        return main_epochs()
    expected, _, _ = batches(False)
    fault = {"done": False} if mode == "kill" else None
    got, loader, local_pids = batches(True, fault)
    stats = loader.stats()
    workers = ray_worker_processes(embedded._head._proc.pid) if mode == "handover" else []
    helper = embedded._head._proc.pid
    print(json.dumps({
        "sessions": [os.getsid(0), os.getsid(helper)],
        "helper_group_niceness": head_priority.niceness(helper),
        "outside_session": outside_session(helper),
        "ray_workers": workers, "cpus": os.cpu_count(),
        "equal": len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(expected, got)),
        "batches": len(got), "moves": stats.moves, "restarts": stats.worker_restarts,
        "events": [e.reason for e in stats.scaling_events],
        "killed": bool(fault and fault["done"]), "local_pids": local_pids,
        "helper_pid": embedded._head._proc.pid,
        "spilled": stats.store_spilled_bytes, "grpc_channels": GRPC_CHANNELS,
    }), flush=True)


if __name__ == "__main__":
    main()
