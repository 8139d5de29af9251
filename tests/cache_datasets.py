"""Datasets with a ``dpex.cached`` stage, importable by Ray workers (tests/ is on their path).

Each counts its stage's runs in a file per process (``runs_in``), so a test can tell a
computed sample from one read back, across processes, without asking dpex."""

from __future__ import annotations

import os
import random
import socket
import time

import torch
from torch.utils.data import Dataset

import dpex


class RunLog:
    """Where a stage notes its runs: an object, not a path attribute, because a folder the
    dataset names is part of its fingerprint, and this one changes as processes write."""

    def __init__(self, folder: str) -> None:
        self._folder = folder

    def note(self, i: int) -> None:  # a process id is a host's own: named with the host's
        name = f"runs-{socket.gethostname()}-{os.getpid()}"
        with open(os.path.join(self._folder, name), "a") as f:
            f.write(f"{i}\n")


class Decoded(Dataset):
    """A "decode" that takes 5 ms (several times reading an entry back, so caching pays even
    on a loaded machine: at 2 ms a busy CI run once measured reads slow enough to decide
    "recompute") and returns a non-contiguous tensor, then a random augmentation from
    torch's and Python's generators, as a real pipeline draws them."""

    def __init__(self, n: int, count_dir: str | None = None, shape=(3, 32, 32)) -> None:
        self.n, self.shape = n, shape
        self.runs = RunLog(count_dir) if count_dir is not None else None

    def __len__(self) -> int:
        return self.n

    @dpex.cached
    def decode(self, i: int) -> torch.Tensor:
        if self.runs is not None:
            self.runs.note(i)
        time.sleep(0.005)
        g = torch.Generator().manual_seed(i)
        c, h, w = self.shape
        return torch.rand(h, w, c, generator=g).permute(2, 0, 1)  # HWC storage, CHW view

    def __getitem__(self, i: int):
        image = self.decode(i)
        flip = random.random() < 0.5
        image = image.flip(-1) if flip else image
        return image * (1 + 0.1 * torch.rand(1)), i


class DrawsInStage(Decoded):
    """The mistake the guard is for: a random draw inside the cached stage."""

    @dpex.cached
    def decode(self, i: int) -> torch.Tensor:
        return torch.full((4,), float(i)) + torch.rand(4)


def runs_in(count_dir: str) -> list[int]:
    """Every index the stage computed, over all processes."""
    out = []
    for name in os.listdir(count_dir):
        if name.startswith("runs-"):
            with open(os.path.join(count_dir, name)) as f:
                out += [int(line) for line in f if line.strip()]
    return out


class DiesOnce(Decoded):
    """Its worker process dies at index ``bad``, once (a marker file remembers it)."""

    def __init__(self, n: int, count_dir: str, bad: int) -> None:
        super().__init__(n, count_dir)
        self.bad, self.marker = bad, RunLog(count_dir)

    def __getitem__(self, i: int):
        marker = os.path.join(self.marker._folder, "died")
        if i == self.bad and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
        return super().__getitem__(i)


class ChangesItsDecode(Decoded):
    """A numpy "decode" whose caller changes the array in place (``out=``, ``+=``), as an
    augmentation may: the entry must keep what the stage returned, not what became of it."""

    @dpex.cached
    def decode(self, i: int):
        import numpy as np

        time.sleep(0.005)
        return np.full((8, 8), float(i), dtype=np.float32)

    def __getitem__(self, i: int):
        image = self.decode(i)
        image += float(torch.randint(1, 100, ()))
        return torch.from_numpy(image), i


class FolderImages(Decoded):
    """A folder and file names, as ImageFolder holds them: the stage builds each path and
    reads the file with Python's open()."""

    def __init__(self, root: str) -> None:
        super().__init__(len(os.listdir(root)))
        self.root, self.names = root, sorted(os.listdir(root))

    @dpex.cached
    def decode(self, i: int) -> torch.Tensor:
        with open(os.path.join(self.root, self.names[i]), "rb") as f:
            data = f.read()
        time.sleep(0.005)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).float().reshape(3, 4, 4)


class SlowDisk(Decoded):
    """``Decoded`` on a slow disk: each of its entries' file writes takes ``write_delay_s``
    longer, through ``slow_disk_writes`` (the loader's ``worker_init_fn``)."""

    write_delay_s = 0.02  # four times the stage's 5 ms: the writer thread falls behind


def warm_torch(worker_id: int) -> None:
    """A ``worker_init_fn`` that draws once from a generator of its own: torch's first draw
    in a process reads the CPU's description (14 read calls that dpex cannot see), which
    made the process's first computed entry one that is not kept (``unseen_reads``:
    docs/caching.md), and computed again later. A real stage sets its library up at import
    likewise. It leaves the process's generators as they were."""
    torch.rand(1, generator=torch.Generator())


def slow_disk_writes(worker_id: int) -> None:
    """A test double of the file write only (``dpex.cache.disk.write_file``): it sleeps
    first while the worker's dataset is a ``SlowDisk``. Installed once per process; inert
    for the other datasets a pooled process hosts later.

    It also sets torch up first (``warm_torch``)."""
    from dpex.cache import disk

    warm_torch(worker_id)

    if getattr(disk.write_file, "slow_double", False):
        return
    write = disk.write_file

    def slow_write_file(f, data: bytes) -> None:
        info = torch.utils.data.get_worker_info()
        time.sleep(getattr(info.dataset, "write_delay_s", 0.0) if info is not None else 0.0)
        write(f, data)

    slow_write_file.slow_double = True
    disk.write_file = slow_write_file
