"""Datasets and helpers shared by the tests (importable by Ray workers too)."""

from __future__ import annotations

import multiprocessing
import random
import time

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info


# torch's loader forks its workers. Forking a process that runs Ray (a test's driver) can copy
# a lock one of Ray's threads held, and the child hangs: the torch-mode reference loaders in
# such processes use forkserver, as the README advises users who mix the two. The server
# imports once what each worker would import itself: torch, these datasets, and the module
# torch's queue imports as a worker sends its first tensor (torch.multiprocessing.
# reductions.reduce_tensor). On torch 2.4 that module brings sympy: 0.4 s of CPU a worker
# (0.04 s with it preloaded), 336 workers in the oldest corner's run. The server skips a
# module a torch version lacks.
REFERENCE_CONTEXT = multiprocessing.get_context("forkserver")
REFERENCE_CONTEXT.set_forkserver_preload(["torch", "helpers",
                                          "torch.nested._internal.nested_tensor"])


class RangeDataset(Dataset):
    """Sample i is ``tensor([i])``."""

    def __init__(self, n: int = 40) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return torch.tensor([i], dtype=torch.int64)


class AugmentedDataset(Dataset):
    """Each sample draws from torch, numpy and random: parity needs identical worker seeding."""

    def __init__(self, n: int = 64) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        noise = torch.rand(3) + float(np.random.rand()) + random.random()
        return {"x": torch.full((3,), float(i)) + noise, "y": i}


class SleepyAugmented(AugmentedDataset):
    """Noisy samples that each take ``delay`` seconds (sleeping: no core needed)."""

    def __init__(self, n: int, delay: float) -> None:
        super().__init__(n)
        self.delay = delay

    def __getitem__(self, i):
        time.sleep(self.delay)
        return super().__getitem__(i)


class SlowToStartOn(SleepyAugmented):
    """``SleepyAugmented`` (``item_s`` a sample) whose replica takes ``delay_s`` to arrive in
    a Ray worker on the node ``node_id``: a worker that cannot start in time, as on a node
    where a busy normal-priority process starves Ray's workers at niceness 15."""

    def __init__(self, n: int, node_id: str, delay_s: float, item_s: float = 0.0) -> None:
        super().__init__(n, item_s)
        self.node_id = node_id
        self.delay_s = delay_s

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        import ray

        if ray.is_initialized() and ray.get_runtime_context().get_node_id() == self.node_id:
            time.sleep(self.delay_s)


class ShardedIterable(IterableDataset):
    """Yields range(n), split between workers by get_worker_info() as torch's docs show."""

    def __init__(self, n: int = 37) -> None:
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        if info is None:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))


class FailingDataset(Dataset):
    """Raises ``exc_type`` for the sample ``bad``; other samples are their index."""

    def __init__(self, n: int = 20, bad: int = 5, exc_type: type = ValueError) -> None:
        self.n, self.bad, self.exc_type = n, bad, exc_type

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise self.exc_type(f"bad sample {i}")
        return i


class SlowDataset(Dataset):
    """Sleeps ``delay`` seconds per sample."""

    def __init__(self, n: int = 8, delay: float = 0.5) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay)
        return i


def assert_batches_equal(expected, actual, case: str = "") -> None:
    """``torch.equal`` on every tensor of every batch; other leaves compared with ==."""
    prefix = f"{case}: " if case else ""
    assert len(expected) == len(actual), f"{prefix}{len(expected)} != {len(actual)} batches"
    for i, (a, b) in enumerate(zip(expected, actual)):
        _assert_same(a, b, f"{prefix}batch {i}")


def _assert_same(a, b, where: str) -> None:
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor) and a.is_nested:  # torch.equal has no nested kernel
        assert b.is_nested, f"{where}: {a} != {b}"
        _assert_same(list(a.unbind()), list(b.unbind()), where)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), f"{where}: {a} != {b}"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _list_actors(class_name: str, alive_only: bool) -> list:
    """Actors of a class in this process's Ray session, from Ray's state API."""
    from ray._private.worker import get_dashboard_url
    from ray.util.state import list_actors

    filters = [("class_name", "=", class_name)]
    if alive_only:
        filters.append(("state", "=", "ALIVE"))
    return list_actors(
        address=f"http://{get_dashboard_url()}",  # this session's, not another on the machine
        filters=filters, detail=True, limit=10000, raise_on_missing_output=False)


def alive_actor_count(class_name: str = "Worker") -> int:
    """ALIVE actors of a class in this process's Ray session."""
    return len(_list_actors(class_name, alive_only=True))


def leftovers(sessions: set[int], ray_sessions: set[str]) -> list[str]:
    """What is still alive of an exited run, up to benchmarks/ending.py's 10 s after: any
    process of its process ``sessions`` (its own, and its embedded Ray's), or naming one of
    its Ray sessions. Killed (by pid, never ``ray stop``) before returning."""
    import os
    import signal

    import ending  # benchmarks/ending.py (tests/conftest.py puts benchmarks/ on sys.path)

    def alive() -> list[str]:
        return ending.run_processes(sessions, ray_sessions)

    if wait_until(lambda: not alive(), timeout=ending.LEFT_AFTER_S, interval=0.25):
        return []
    left = alive()
    for entry in left:
        try:
            os.kill(int(entry.split()[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


class TwoArgError(Exception):
    """An exception whose constructor cannot take a single message."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(code, detail)
        self.code, self.detail = code, detail


class TwoArgFailingDataset(RangeDataset):
    def __getitem__(self, i):
        if i == 3:
            raise TwoArgError(42, "needs two arguments")
        return super().__getitem__(i)


INIT_CALLS = 0


def counting_init_fn(worker_id: int) -> None:
    global INIT_CALLS
    INIT_CALLS += 1


class WorkerInfoDataset(RangeDataset):
    """Sample i reports (i, worker id, num_workers, seed, init calls, dpex's info agrees)."""

    def __getitem__(self, i):
        import dpex

        info = get_worker_info()
        same = dpex.get_worker_info() is info and info.dataset is not None
        return torch.tensor([i, info.id, info.num_workers, info.seed, INIT_CALLS, int(same)])


class PoisonDataset(RangeDataset):
    """Sample ``bad`` kills the process that loads it, every time (a poison sample)."""

    def __init__(self, n: int = 20, bad: int = 9) -> None:
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i):
        if i == self.bad:
            import os

            os._exit(1)
        return super().__getitem__(i)


def worker_actors(alive_only: bool = True) -> list:
    """dpex worker actors of this session (pid, node_id, actor_id), from Ray's state API."""
    return _list_actors("Worker", alive_only)


class StatefulIterable(IterableDataset):
    """Yields noisy samples range(n) split by worker, and can save / restore its position."""

    def __init__(self, n: int = 40) -> None:
        self.n = n
        self.position = 0

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        mine = list(range(worker, self.n, workers))
        while self.position < len(mine):
            i = mine[self.position]
            self.position += 1
            yield torch.tensor([float(i), random.random()])
        self.position = 0  # the next epoch starts over

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


class EnvDataset(RangeDataset):
    """Sample i is (i, RANK, WORLD_SIZE) as the worker process sees them (-1 when unset)."""

    def __getitem__(self, i):
        import os

        return torch.tensor([i, int(os.environ.get("RANK", -1)), int(os.environ.get("WORLD_SIZE", -1))])


class PidDataset(RangeDataset):
    """Sample i is (i, the pid of the process that loaded it)."""

    def __getitem__(self, i):
        import os

        return torch.tensor([i, os.getpid()])


class ReplicaDataset(AugmentedDataset):
    """Noisy samples that also carry ``marks``, which ``mark_replica`` raises in a worker's
    replica: a replica carried over from an earlier epoch would show a larger count."""

    def __init__(self, n: int = 48) -> None:
        super().__init__(n)
        self.marks = 0

    def __getitem__(self, i):
        sample = super().__getitem__(i)
        sample["marks"] = self.marks
        return sample


def mark_replica(worker_id: int) -> None:
    get_worker_info().dataset.marks += 10 + worker_id


def _refuse_to_unpickle(n: int):
    raise RuntimeError("this dataset does not unpickle in a worker")


class UnpicklableDataset(RangeDataset):
    """Pickles (ray.put works) but cannot be unpickled: a worker cannot begin with it."""

    def __reduce__(self):
        return _refuse_to_unpickle, (self.n,)


class LargeRandom(Dataset):
    """Samples of ``mib`` MiB of torch.rand: large batches whose bits depend on the seeding."""

    def __init__(self, n: int = 96, mib: float = 1.0) -> None:
        self.n, self.numel = n, int(mib * 2**20) // 4

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return torch.rand(self.numel) + i
