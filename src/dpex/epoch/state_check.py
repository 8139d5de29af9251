"""A loaded state checked whole before anything changes: its fields' types and ranges
against the loader's facts. Pure: no Ray.

A checkpoint is truncated, hand-edited, mixed up between jobs, or written by another
version. ``check`` reads a version-2 state (``state_format.upgrade`` gives one) in
O(fields), never O(dataset): each dpex field's type, and each count within what the loader
can have (the dataset's length, the epoch's batches, the worker count), each RNG state of
the right kind and size. The first field that is wrong raises a ``TypeError`` (a wrong
type) or a ``ValueError`` (a missing field, a value out of range) naming its path
(``workers[1].rng.numpy[2]``), the value found and what was expected. What the user's own
objects returned from ``state_dict()`` (a dataset's, an iterator's, a sampler's) is
theirs: only dpex's containers around it are checked. What needs the data itself (a
stream's units, from its Parquet footers) is checked where it is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpex.epoch import state_format as fmt
from dpex.epoch.field_check import (INT64, Said, field, is_int, missing, need_bool, need_dict,
                                    need_int, one_of, optional, optional_dict, out_of_range,
                                    rng_state, torch_state_text, wrong_type)

# Bounds that keep every derived list small: no real job has more, and more would make a
# resumed epoch's split loop for hours instead of raising.
MAX_RANKS = 1 << 16
MAX_WORKERS = 1 << 12
_STATUSES = (fmt.BEFORE, fmt.IN_PROGRESS, fmt.ENDED)


@dataclass(frozen=True)
class Facts:
    """What the loading loader is: what a state's counts are checked against.

    ``dataset_length``: ``len(dataset)`` (None: an IterableDataset, or no ``len``).
    ``batches``: its epoch's batches (None where the sampler does not say).
    ``dataset_stateful``/``sampler_stateful``: the dataset, the sampler (under torch's
    ``BatchSampler``, its inner one) has ``load_state_dict``, so a state of it is loaded.
    ``split_stream``: its dataset splits its epoch by the stream protocol (stream_split.py),
    which resumes on any ``num_workers``.
    """

    dataset_length: int | None
    batches: int | None
    batch_size: int | None
    drop_last: bool
    num_workers: int
    iterable: bool
    dataset_stateful: bool
    sampler_stateful: bool
    split_stream: bool = False


def check(state: dict[str, Any], facts: Facts) -> None:
    """Raise TypeError/ValueError naming the first field of ``state`` that is wrong."""
    need_dict(state, "(the whole state)")
    one_of(state, "version", (fmt.STATE_VERSION,))
    status = one_of(state, "epoch", _STATUSES)
    in_progress = status == fmt.IN_PROGRESS
    _generator(state)
    optional(state, "global_rng_at_save", torch_state_text)
    base = state.get("base_seed")
    if "base_seed" not in state:
        missing("base_seed", "an int or None")
    if base is not None:
        need_int(base, "base_seed", 0, INT64 - 1)
    need_bool(field(state, "base_seed_drawn", "a bool"), "base_seed_drawn")
    sampler = optional_dict(state, "sampler")
    limit = _batch_limit(facts, sampler)
    delivered = need_int(field(state, "batches_delivered", "an int"), "batches_delivered", 0,
                         INT64 - 1 if limit is None else limit)
    _delivered_after(field(state, "delivered_after", "a list"), delivered, limit,
                     in_progress)
    workers = field(state, "workers", "a list")
    if not isinstance(workers, list):
        wrong_type("workers", workers, "a list of each worker's position")
    if len(workers) > MAX_WORKERS:
        out_of_range("workers", Said(f"a list of {len(workers)} entries"),
                     f"at most {MAX_WORKERS} workers")
    if (facts.iterable and in_progress and not facts.split_stream
            and not (sampler or {}).get("stream") and len(workers) != facts.num_workers):
        raise ValueError(
            f"the state's field workers has {len(workers)} entries: it was saved mid-epoch "
            f"with num_workers={len(workers)} over an IterableDataset, whose replicas split "
            f"the data by worker; this loader has num_workers={facts.num_workers}. Resume it "
            f"with num_workers={len(workers)}, or from a state saved at an epoch's end.")
    handed = 0
    for i, worker in enumerate(workers):
        handed += _worker(worker, f"workers[{i}]", delivered, facts)
    if in_progress and handed > delivered:
        out_of_range("workers[*].handed_out", Said(f"{handed} batches in all"),
                     f"at most batches_delivered ({delivered})")
    next_worker = state.get("next_worker")
    if next_worker is not None and not is_int(next_worker):
        wrong_type("next_worker", next_worker, "an int or None")
    if next_worker is not None and not 0 <= next_worker < len(workers):
        out_of_range("next_worker", next_worker, f"one of the {len(workers)} workers the "
                     f"state's field workers holds (None where it holds none)")
    _main(state.get("main"), facts)
    _loader(state)
    if sampler is not None:
        _sampler(sampler, facts, delivered, in_progress)


# ----------------------------------------------------------------- the parts

def _generator(state: dict) -> None:
    source = one_of(state, "generator", ("loader", "global", None))
    plain = field(state, "generator_state", "a generator state or None")
    if source is None:
        if plain is not None:
            out_of_range("generator", None, "'loader' or 'global': the state has a "
                         "generator state")
        return
    if plain is None:
        wrong_type("generator_state", None, f"a torch generator state (generator is "
                   f"{source!r})")
    torch_state_text(plain, "generator_state")


def _batch_limit(facts: Facts, sampler: dict | None) -> int | None:
    """The most batches an epoch of this loader can have handed out (None: unknown). The
    state may be of another world size (a rank's batches are then fewer), so the whole
    dataset's batches bound it too."""
    bounds = [facts.batches] if facts.batches is not None else []
    if facts.dataset_length is not None:
        size = facts.batch_size or 1
        bounds.append(-(-facts.dataset_length // size))
    stream = (sampler or {}).get("stream")
    if isinstance(stream, dict) and is_int(stream.get("items")) and stream["items"] >= 0:
        bounds.append(stream["items"])  # a batch holds one item at least
    return max(bounds) if bounds else None


def _delivered_after(after: Any, delivered: int, limit: int | None,
                     in_progress: bool) -> None:
    if not isinstance(after, list):
        wrong_type("delivered_after", after, "a list of task ids")
    if after and not in_progress:
        out_of_range("delivered_after", after, "[] in a state saved outside an epoch")
    top = INT64 - 1 if limit is None else limit - 1
    for i, task in enumerate(after):
        need_int(task, f"delivered_after[{i}]", delivered, top)
    if len(set(after)) != len(after):
        out_of_range("delivered_after", after, "distinct task ids")


def _worker(worker: Any, path: str, delivered: int, facts: Facts) -> int:
    """Check one worker's position; returns its ``handed_out``."""
    need_dict(worker, path)
    rng_state(worker.get("rng"), f"{path}.rng")
    _users(worker, path, ("dataset_state",), facts.dataset_stateful, "dataset")
    ended = worker.get("ended", False)
    need_bool(ended, f"{path}.ended")
    handed = worker.get("handed_out", 0)
    need_int(handed, f"{path}.handed_out", 0, delivered)
    start = worker.get("epoch_start")
    if start is not None:
        need_dict(start, f"{path}.epoch_start")
        rng_state(start.get("rng"), f"{path}.epoch_start.rng")
        _users(start, f"{path}.epoch_start", ("dataset_state",), facts.dataset_stateful,
               "dataset")
    return handed


def _users(plain: dict, path: str, names: tuple[str, ...], stateful: bool, whose: str) -> None:
    """A user's own state (not checked inside) is only loaded into an object that loads one."""
    for name in names:
        if plain.get(name) is not None and not stateful:
            out_of_range(f"{path}.{name}", plain[name], f"None: this loader's {whose} has "
                         "no load_state_dict")


def _main(main: Any, facts: Facts) -> None:
    if main is None:
        return
    need_dict(main, "main")
    for name in main:
        if name not in ("dataset_state", "iterator_state"):
            out_of_range(f"main.{name}", main[name], "only 'dataset_state' and "
                         "'iterator_state' in main")
    _users(main, "main", ("dataset_state", "iterator_state"), facts.dataset_stateful, "dataset")


def _loader(state: dict) -> None:
    loader = state.get("loader")
    if loader is None:
        return
    need_dict(loader, "loader")
    saved = loader.get("generator")
    if saved is not None and state["generator"] is not None and saved != state["generator"]:
        out_of_range("generator", state["generator"], f"{saved!r}, as loader.generator says")


def _sampler(sampler: dict, facts: Facts, delivered: int, in_progress: bool) -> None:
    cursor = sampler.get("state")
    if cursor is not None:
        need_dict(cursor, "sampler.state")
        if set(cursor) - {"sampler", "iterator"} or all(v is None for v in cursor.values()):
            out_of_range("sampler.state", cursor, "None, or a dict of a Stateful "
                         "sampler's 'sampler' and 'iterator' states, one not None")
        _users(cursor, "sampler.state", ("sampler",), facts.sampler_stateful, "sampler")
    if "in_order" in sampler:
        need_bool(sampler["in_order"], "sampler.in_order")
    if "rank" in sampler:
        need_int(sampler["rank"], "sampler.rank", 0, MAX_RANKS - 1)
    ranks = sampler.get("pipeline_world_size")
    if ranks is not None:
        need_int(ranks, "sampler.pipeline_world_size", 1, MAX_RANKS)
    if sampler.get("distributed") is not None:
        _distributed(sampler["distributed"], facts)
    if sampler.get("stream") is not None:
        _stream(sampler["stream"], facts, delivered, in_progress)
    if sampler.get("shards") is not None:
        _shards(sampler["shards"], facts)


def _distributed(plain: Any, facts: Facts) -> None:
    path = "sampler.distributed"
    _versioned(plain, path)
    _same_length(plain, path, facts)
    need_int(field(plain, "seed", "an int", path), f"{path}.seed", -INT64, INT64 - 1)
    need_int(field(plain, "epoch", "an int", path), f"{path}.epoch", 0, INT64 - 1)
    for name in ("shuffle", "drop_last"):
        need_bool(field(plain, name, "a bool", path), f"{path}.{name}")
    _segments(plain, path, (("world size", 1, MAX_RANKS), ("samples per rank", 0, INT64 - 1)))
    # Each segment's count against its split: DistributedPosition's own check, as read.


def _stream(plain: Any, facts: Facts, delivered: int, in_progress: bool) -> None:
    path = "sampler.stream"
    _versioned(plain, path)
    need_int(field(plain, "epoch", "an int", path), f"{path}.epoch", 0, INT64 - 1)
    need_int(field(plain, "units", "an int", path), f"{path}.units", 0, INT64 - 1)
    items = need_int(field(plain, "items", "an int", path), f"{path}.items", 0, INT64 - 1)
    for name, now in (("batch_size", facts.batch_size), ("drop_last", facts.drop_last)):
        value = field(plain, name, repr(now), path)
        if value != now or type(value) is not type(now):
            out_of_range(f"{path}.{name}", value, f"{now!r}, this loader's")
    segments = _segments(plain, path, (("world size", 1, MAX_RANKS),
                                       ("workers", 0, MAX_WORKERS), ("batches", 0, items)))
    if in_progress and segments[-1][2] != delivered:
        out_of_range(f"{path}.segments[{len(segments) - 1}][2]", segments[-1][2],
                     f"batches_delivered ({delivered})")
    if "rank" in plain:
        need_int(plain["rank"], f"{path}.rank", 0, segments[-1][0] - 1)


def _shards(plain: Any, facts: Facts) -> None:
    path = "sampler.shards"
    _versioned(plain, path)
    length = _same_length(plain, path, facts)
    size = need_int(field(plain, "batch_size", "an int", path), f"{path}.batch_size", 1,
                    INT64 - 1)
    for name in ("drop_last", "even_batches"):
        need_bool(field(plain, name, "a bool", path), f"{path}.{name}")
    _segments(plain, path, (("processes", 1, MAX_RANKS),
                            ("batches a process", 0, -(-length // size))))


def _versioned(plain: Any, path: str) -> None:
    need_dict(plain, path)
    if field(plain, "version", "1", path) != 1:
        out_of_range(f"{path}.version", plain["version"], "1")


def _same_length(plain: dict, path: str, facts: Facts) -> int:
    length = need_int(field(plain, "dataset_len", "an int", path), f"{path}.dataset_len", 0,
                      INT64 - 1)
    if facts.dataset_length is not None and length != facts.dataset_length:
        out_of_range(f"{path}.dataset_len", length,
                     f"{facts.dataset_length}, this loader's dataset length")
    return length


def _segments(plain: dict, path: str, parts: tuple[tuple[str, int, int], ...]) -> list:
    segments = field(plain, "segments", "a list", path)
    what = f"[{', '.join(name for name, _, _ in parts)}]"
    if not isinstance(segments, list):
        wrong_type(f"{path}.segments", segments, f"a non-empty list of {what}")
    if not segments:
        out_of_range(f"{path}.segments", segments, f"a non-empty list of {what}")
    for k, segment in enumerate(segments):
        at = f"{path}.segments[{k}]"
        if not isinstance(segment, list) or len(segment) != len(parts):
            wrong_type(at, segment, f"a list {what}")
        for j, (name, low, high) in enumerate(parts):
            need_int(segment[j], f"{at}[{j}]", low, high)
    return segments
