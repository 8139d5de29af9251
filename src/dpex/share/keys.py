"""What makes two loaders' batches the same bits: the stream's keys (pure; Ray only for its
cloudpickle, through fingerprint.py).

A batch of dpex is a pure function of the loader's configuration, its worker's RNG state
and the index batches that worker ran before it. Two loaders share a batch when:
* their *components* are equal: the dataset (its type, attributes, the files it names,
  the code its ``__getitem__`` reaches, the library versions), the logical worker count, how batches
  are made (``batch_size``, ``drop_last``, the code of ``collate_fn`` and
  ``worker_init_fn``) and the process group's rank and world size. The seed is one too,
  for the warning only: it is the base seed that counts;
* their epoch starts from the same base seed (``epoch_key``);
* the index batches dispatched before it, and its own, are equal (``task_key`` chains
  them, in task order).
A sampler that orders the indices differently, a resumed epoch, another seed: the keys
differ, and nothing is shared. A key names what it covers; it never decides exactness on
its own: the worker's RNG travels with every batch (NOTE [ dpex Shared Stream ]).
"""

from __future__ import annotations

import hashlib
import pickle
from typing import Any

import torch

from dpex.cache import fingerprint

# The components a warning names, in the words of torch's arguments.
COMPONENT_NAMES = {
    "dataset": "the dataset (its type, attributes, files or code)",
    "num_workers": "num_workers",
    "batching": "batch_size or drop_last",
    "collate_fn": "collate_fn",
    "worker_init_fn": "worker_init_fn",
    "rank": "the process group's rank or world size",
    "seed": "the seed (the loader's generator, or torch's global one)",
}


def components(dataset: Any, num_workers: int, batch_size: Any, drop_last: bool,
               collate_fn: Any, worker_init_fn: Any, generator: torch.Generator | None
               ) -> dict[str, str]:
    """A loader's components, each as a short digest (see the module docstring)."""
    dataset_digest = hashlib.blake2b(digest_size=16)
    dataset_digest.update(type(dataset).__qualname__.encode())
    dataset_digest.update(fingerprint.attributes_digest(dataset))
    for path, signature in fingerprint.files_of(dataset):
        dataset_digest.update(f"{path}\0{signature}\0".encode())
    getitem = getattr(type(dataset), "__getitem__", None)
    if getitem is not None:
        dataset_digest.update(fingerprint.code_digest(getitem, dataset))
    dataset_digest.update(fingerprint.versions().encode())
    seed = generator.initial_seed() if generator is not None else torch.initial_seed()
    return {
        "dataset": dataset_digest.hexdigest(),
        "num_workers": str(num_workers),
        "batching": f"{batch_size}/{drop_last}",
        "collate_fn": _callable_digest(collate_fn),
        "worker_init_fn": _callable_digest(worker_init_fn),
        "rank": _rank(),
        "seed": str(seed),
    }


def differences(mine: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """The components (by their names for a warning) in which two loaders differ."""
    return [COMPONENT_NAMES.get(name, name) for name in COMPONENT_NAMES
            if mine.get(name) != theirs.get(name)]


def epoch_key(parts: dict[str, str], base_seed: int) -> bytes:
    """The key of an epoch (of a new iterator: its workers are seeded from ``base_seed``)."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(parts):
        if name != "seed":  # the base seed is what the workers draw from
            digest.update(f"{name}={parts[name]}\0".encode())
    digest.update(f"base_seed={base_seed}".encode())
    return digest.digest()


def next_epoch(key: bytes) -> bytes:
    """A persistent iterator's next epoch: its workers go on from where they were."""
    return hashlib.blake2b(key + b"\0next epoch", digest_size=16).digest()


def task_key(previous: bytes, task_id: int, index: Any) -> bytes:
    """The key of task ``task_id`` after the task keyed ``previous`` (or the epoch's key)."""
    digest = hashlib.blake2b(previous, digest_size=16)
    digest.update(task_id.to_bytes(8, "little", signed=True))
    digest.update(pickle.dumps(index, protocol=4))
    return digest.digest()


def _callable_digest(fn: Any) -> str:
    if fn is None:
        return "none"
    if fn is torch.utils.data.default_collate:
        return "torch.default_collate"
    try:
        return fingerprint.code_digest(fn).hex()
    except Exception:  # noqa: BLE001 - a builtin, or a state that does not pickle
        return f"{type(fn).__module__}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def _rank() -> str:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return f"{dist.get_rank()}/{dist.get_world_size()}"
    return "0/1"
