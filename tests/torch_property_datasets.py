"""The datasets of tests/test_torch_properties*.py: module level, so that Ray workers and
torch's forkserver workers import them from here."""

from __future__ import annotations

import collections
import math
import os
import time
import warnings

import numpy as np
import torch
import torch.utils.data
from torch.utils.data import (
    Dataset,
    IterableDataset,
    TensorDataset,
    get_worker_info,
)


WORKERS = 2
SEED = 1234

# ----------------------------------------------------------------------------- datasets
# Module level: Ray workers and torch's forkserver workers import them from here.


def tensor_data(n: int = 20) -> TensorDataset:
    """Samples (a 2x3 float tensor, an int label), distinct and deterministic."""
    return TensorDataset(torch.arange(n * 6, dtype=torch.float32).view(n, 2, 3),
                         torch.arange(n) % 7)


class Counting(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return i


class CountingIterable(IterableDataset):
    """range(n) in every replica: no sharding."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


class PerWorkerSizes(IterableDataset):
    """Worker w yields range(sizes[w])."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def __iter__(self):
        return iter(range(self.sizes[get_worker_info().id]))

    def __len__(self) -> int:
        return sum(self.sizes)


class WorkerOfEachSample(IterableDataset):
    """Each worker yields its id ``length // num_workers`` times."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self):
        info = get_worker_info()
        return iter([info.id] * (self.length // info.num_workers))


class NoGetItem(Dataset):
    """A Dataset without __getitem__: torch's base class raises NotImplementedError."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


class FailingIter(IterableDataset):
    def __iter__(self):
        raise RuntimeError("Error in __iter__")


def failing_init(worker_id: int) -> None:
    raise RuntimeError("Error in worker_init_fn")


class SleepOnce(Dataset):
    """Each replica sleeps ``sleep_s`` on its first sample."""

    def __init__(self, n: int, sleep_s: float) -> None:
        self.n, self.sleep_s, self.slept = n, sleep_s, False

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if not self.slept:
            time.sleep(self.sleep_s)
            self.slept = True
        return i


class SlowIndex(Counting):
    """Sample ``slow`` takes ``sleep_s``."""

    def __init__(self, n: int, slow: int, sleep_s: float) -> None:
        super().__init__(n)
        self.slow, self.sleep_s = slow, sleep_s

    def __getitem__(self, i):
        if i == self.slow:
            time.sleep(self.sleep_s)
        return i


class SlowIndexByWorker(SlowIndex):
    """``SlowIndex``'s samples as ``[i, the id of the worker that made it]``."""

    def __getitem__(self, i):
        return torch.tensor([super().__getitem__(i), get_worker_info().id])


class InitialSeed(Counting):
    """Sample i is the torch seed of the process that loads it."""

    def __getitem__(self, i):
        return torch.initial_seed()


def seed_12345(worker_id: int) -> None:
    torch.manual_seed(12345)


class WhichWorker(Counting):
    """Sample i is (the id of the worker that loads it, i)."""

    def __getitem__(self, i):
        return get_worker_info().id, i


class SetByInit(Counting):
    """Sample i is (what ``remember_worker`` set on this very object, i): torch's workers get
    the dataset and a worker_init_fn bound to it in one pickle (or one fork), so the method's
    ``self`` is the worker's copy of the dataset."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.worker_id = None

    def remember_worker(self, worker_id: int) -> None:
        self.worker_id = worker_id

    def __getitem__(self, i):
        return self.worker_id, i


class WorkerInfoProbe(Counting):
    """Sample i is what ``probe_worker_info`` found in its worker."""

    def __getitem__(self, i):
        return torch.tensor(self.value)


def probe_worker_info(worker_id: int) -> None:
    """torch's suite's checks of get_worker_info inside a worker, as one flag per check."""
    info = get_worker_info()
    checks = [worker_id == info.id, 0 <= worker_id < info.num_workers,
              info.seed == torch.initial_seed(), isinstance(info.dataset, WorkerInfoProbe),
              not hasattr(info.dataset, "value"),
              all(f"{k}=" in repr(info) for k in ("id", "num_workers", "seed", "dataset"))]
    for name in ("id", "a"):  # WorkerInfo is read-only (a RuntimeError in older torch, a
        try:                    # frozen dataclass's error in newer)
            setattr(info, name, 3999)
            checks.append(False)
        except Exception:  # noqa: BLE001
            checks.append(getattr(info, name, None) != 3999)
    info.dataset.value = [worker_id, os.getpid(), info.num_workers, *map(int, checks)]


class KeepsItsCopy(Counting):
    """The worker's copy must keep ``start == 0`` (set before the first epoch)."""

    def __getitem__(self, i):
        assert self.start == 0, f"the worker's dataset copy changed: start={self.start}"
        return i


class NumpyArrays(Counting):
    def __getitem__(self, i):
        return np.ones((2, 3, 4)) * i


class NumpyScalars(Counting):
    TYPES = (np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8,
             np.uint8)

    def __getitem__(self, i):
        return tuple(t(i) for t in self.TYPES)


class PythonScalars(Counting):
    def __getitem__(self, i):
        return i - 2, i * 1.1, bool(i % 2), "abc"[i % 3]


class Dicts(Counting):
    def __getitem__(self, i):
        return {"a_tensor": torch.empty(4, 2).fill_(i), "another_dict": {"a_number": i}}


Batch = collections.namedtuple("Batch", ["data", "label", "random_tensor"])
Data = collections.namedtuple("Data", ["positive", "negative"])


class NamedTuples(Counting):
    def __getitem__(self, i):
        return Batch(Data(i, -i), str(i), torch.randn(3))  # randn: the worker's seed


class Strings(Counting):
    def __getitem__(self, i):
        return "12345"[i], i


class CustomDict(dict):
    pass


class CustomList(list):
    pass


class CustomDicts(Counting):
    def __getitem__(self, i):
        return CustomDict(a=i, b=2 * i)


class CustomLists(Counting):
    def __getitem__(self, i):
        return CustomList([i, i + 1, i + 2])


class EmptyTensors(Counting):
    def __getitem__(self, i):
        return torch.empty(0)


class IndexLists(Counting):
    """__getitem__ takes a list of indices (bulk loading)."""

    def __getitem__(self, indices):
        assert isinstance(indices, (list, tuple))
        return torch.as_tensor(indices)


class ShuffledIndexLists(torch.utils.data.Sampler):
    """Lists of ``size`` indices, shuffled by torch's global RNG (in the trainer)."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size

    def __iter__(self):
        for chunk in torch.randperm(self.n).split(self.size):
            yield chunk.tolist()

    def __len__(self) -> int:
        return math.ceil(self.n / self.size)


class CustomBatch:
    """A collate_fn's own batch type."""

    def __init__(self, samples) -> None:
        inputs, targets = zip(*samples)
        self.inp, self.tgt = torch.stack(inputs), torch.stack(targets)

    def __eq__(self, other) -> bool:
        return (type(other) is CustomBatch and torch.equal(self.inp, other.inp)
                and torch.equal(self.tgt, other.tgt))


def collate_custom_batch(samples):
    return CustomBatch(samples)


def collate_packed_sequence(samples):
    data = torch.stack([s[0] for s in samples], 1)
    steps, batch = data.size()
    lengths = torch.randint(1, steps, size=(batch,), dtype=torch.int64)  # the worker's RNG
    return torch.nn.utils.rnn.pack_padded_sequence(data, lengths, enforce_sorted=False)


def collate_clone(samples):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "The PyTorch API of nested tensors is in prototype"
        return [x.clone() for x in samples]


class Conv(Dataset):
    """Runs a convolution in the trainer before any worker exists."""

    def __init__(self) -> None:
        self.x = torch.ones(1, 1, 2400)
        self[0]

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i):
        return torch.nn.functional.conv1d(self.x, torch.ones(1, 1, 2))


def nested_tensors(n: int = 4) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "The PyTorch API of nested tensors is in prototype"
        return [torch.nested.nested_tensor([torch.arange(5.0) + i]) for i in range(n)]


def shuffled_datapipe():
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(list(range(20))).shuffle(buffer_size=8).sharding_filter()
