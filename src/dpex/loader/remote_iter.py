"""``_RayDataLoaderIter``: one pass over the loader's data, with workers as Ray actors.

NOTE [ dpex Actor Lifecycle and Recovery Protocol ]

Who owns what
  The iterator owns its worker actors (one ``WorkerSlot`` per worker id) while it runs, and
  the one object holding the dataset (``ray.put`` once per iterator). It takes each actor
  from this process's warm pool, or starts a new one (pool.py, its NOTE), and makes it a
  fresh worker with ``Worker.begin``. Nobody else holds the handles while the iterator runs.
  The iterator gives its actors back to the pool, or kills them (``ray.kill``) when they
  cannot be reused (tasks still in flight, ``reuse_processes=False``), at these points:
    * end of epoch without ``persistent_workers``;
    * the iterator is garbage collected (the user broke out of the loop, or deleted the
      loader, which holds a persistent iterator);
  and kills them at interpreter exit (``atexit``), before the embedded Ray stops, and when
  it fails (a start failure, a poison batch, no node left).

What is in flight where
  The sampler runs here, on the trainer. Task ``t`` (the t-th index batch of the epoch) goes to
  worker ``t mod num_workers`` (skipping workers whose IterableDataset replica is exhausted),
  which is exactly torch's assignment, so each worker sees the same tasks in the same order as
  the torch worker of the same id, and draws the same random numbers. A task lives in:
    0. ``slot.pending`` (assigned, not yet submitted: tasks go to a worker several to a
       call when they are cheap; dispatch.py, its NOTE, which also gives the read-ahead
       bound: ``prefetch_factor * num_workers`` tasks when each call carries one);
    1. ``slot.in_flight`` (submitted, result not received);
    2. ``self._results`` (received, not yet handed out: only when results come back out of
       order);
    3. the training loop (handed out). Nothing is kept after that.
  Every result carries the worker's RNG state right after it (and an IterableDataset's
  ``state_dict()``, if it has one); ``slot.position`` is that state after the last *received*
  result of that worker, ``loader._record`` the same after the last *handed-out* one (what
  ``state_dict()`` saves).

What happens on each kind of failure
  * The dataset or collate_fn raises: the worker catches it and returns a ``RemoteError``
    for that task; the worker lives on. The trainer re-raises it, same type, with the remote
    traceback and the sample indices, when that task's turn comes. Later tasks still work.
  * A worker actor dies (``ray.kill``, SIGKILL, OOM, its node removed): any ``ray.get`` on its
    calls raises ``RayActorError``. The slot is recovered: a new actor for the same worker id
    comes from the pool (an idle actor for that node) or is started on a node that is alive
    now, seeded as the original was and then restored to
    ``slot.position`` (an IterableDataset replica without ``state_dict`` cannot seek: it is
    rewound to the epoch start and replays the batches already received). The slot's lost tasks are resubmitted in their
    original order. The training loop sees nothing: no error, gap, duplicate or reordering,
    and the same bits, because every random draw happens from the same state.
  * The same task takes its worker down more than ``max_task_retries`` times (a poison
    sample): ``RuntimeError`` naming the task's sample indices.
  * A worker process does not start within ``start_timeout_s`` while another of the
    loader's processes has (its node starved by a busy process, say): it is killed and its
    logical workers are recovered onto a started process, as above, without counting a
    death (``_go_on_without``; noted in the stats' scaling events).
  * No node can host a worker (all eligible nodes gone) or no worker process starts within
    ``start_timeout_s`` (resources that the cluster cannot give): ``RuntimeError`` saying what
    was asked and what the cluster has. Nothing waits forever on Ray's scheduler.
  * ``timeout > 0`` and a batch takes longer: ``RuntimeError`` as torch raises. ``timeout=0``
    waits for slow batches forever, but the wait is sliced so deaths and start failures are
    still noticed.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid
import warnings
from collections import deque
from typing import TYPE_CHECKING, Any

import ray
import torch

from dpex import nested, process_ends, ray_session
from dpex.elastic.control import ElasticControl
from dpex.elastic.placement import NodePicker
from dpex.elastic.store_budget import StoreBudget
from dpex.epoch import state_format as fmt
from dpex.epoch.position import WorkerPosition
from dpex.epoch.record import EpochRecord
from dpex.epoch.resume import EpochStart, PendingResume, epoch_length, start_epoch
from dpex.epoch.sampler_cursor import IndexCursor
from dpex.epoch.seeding import draw_base_seed
from dpex.loader import resuming
from dpex.loader.dispatch import Dispatch
from dpex.loader.receive import Receive
from dpex.observe.node_names import HostNames
from dpex.ray_session import object_store_capacities, session_handles
from dpex.share.iterator_half import Sharing
from dpex.workers import transport, user_code
from dpex.workers.lifecycle import ProcessLifecycle, live_iterators
from dpex.workers.local_start import LocalStart, can_start_locally
from dpex.workers.local_workers import LOCAL_NODE
from dpex.workers.options import WorkerOptions
from dpex.workers.process_handle import ProcessHandle, WorkerSlot
from dpex.workers.worker import ERROR, DatasetMethod, TaskResult, WorkerConfig

if TYPE_CHECKING:  # dpex's loader, a torch DataLoader, which imports this module
    from torch.utils.data import DataLoader

# Taken at import: at interpreter shutdown the module's globals may already be None when an
# iterator kept in a module-level name is collected (torch's iterators guard the same way).
_getpid = os.getpid

class _RayDataLoaderIter(ProcessLifecycle, Dispatch, Receive, LocalStart, Sharing):
    """Iterates once over a ``dpex.DataLoader``, as specified by its sampler. See the NOTE."""

    def __init__(self, loader: DataLoader) -> None:
        self._created_in = os.getpid()
        process_ends.freeze_inherited_objects_in_children()  # before it holds Ray objects
        self._dataset = loader.dataset
        self._is_iterable = isinstance(loader.dataset, torch.utils.data.IterableDataset)
        self._auto_collation = loader.batch_sampler is not None
        self._index_sampler = loader.batch_sampler if self._auto_collation else loader.sampler
        self._sampler_len = self._read_ahead_length(self._index_sampler, self._is_iterable)
        self._num_workers = loader.num_workers
        self._prefetch_factor = loader.prefetch_factor
        if self._prefetch_factor <= 0:  # torch's check, in torch's multiprocessing iterator
            raise AssertionError(
                "prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter")
        self._in_order = loader.in_order
        self._timeout = loader.timeout
        self._persistent_workers = loader.persistent_workers
        self._options: WorkerOptions = loader.worker_options
        self._stats = loader._stats
        self._cache_sent = loader._cache_sent
        self._stats.host_of = HostNames(local=LOCAL_NODE)  # per_host (a copy came without)
        self._spilled_ask = None  # Ray's spilled bytes, asked at an epoch's end (receive.py)
        self._loader_metrics = loader._metrics
        self._timeline = loader._timeline
        # The object store's share for results in flight (NOTE [ dpex Object Store Budget ]).
        self._store = StoreBudget(sizes=loader._result_sizes)
        self._pin_memory = transport.pin_memory_enabled(loader.pin_memory, loader.pin_memory_device)
        self._IterableDataset_len_called = getattr(loader, "_IterableDataset_len_called", None)
        self._generator = loader.generator
        self._record: EpochRecord = loader._record
        resume: PendingResume | None = loader._take_pending_resume()
        loader._distributed, rest, resume = resuming.begin_epoch(loader, resume)
        self._record.start_epoch(
            self._generator, self._num_workers,
            base_seed_drawn=resume is None or resume.base_seed_drawn,
            carry_workers=resume is not None,
            length=epoch_length(self._index_sampler, self._is_iterable),
            iterable=self._is_iterable,
        )
        # Same order of draws as torch's iterator: the base seed, then the sampler.
        start: EpochStart = start_epoch(self._index_sampler, self._generator, resume,
                                        rest=rest, batch_size=loader.batch_size,
                                        drop_last=loader.drop_last, iterable=self._is_iterable)
        self._base_seed = (start.base_seed if resume is not None
                           else draw_base_seed(self._generator))
        self._shutdown = False
        self.session_ended = False  # its Ray session ended under it (session_handles.py)

        self._head_address = loader.head_address
        self._raw_config = WorkerConfig(
            num_workers=self._num_workers,
            base_seed=self._base_seed,
            is_iterable=self._is_iterable,
            auto_collation=self._auto_collation,
            collate_fn=loader.collate_fn,
            drop_last=loader.drop_last,
            worker_init_fn=DatasetMethod.of(loader.worker_init_fn, loader.dataset),
            cache=loader.cache,
        )
        self._dataset_ref = self._config = self._picker = None
        # A cold process begins on local processes while Ray starts (local_start.py).
        self._local_active = can_start_locally(loader, self._options, self._is_iterable)
        if not self._local_active:
            ray_session.connect(loader.head_address)  # under torch.distributed, the ranks share one Ray
            self._setup_ray()
        self._niceness = self._options.target_niceness()
        self._id = uuid.uuid4().hex[:8]
        self._init_sharing(loader, resumed=resume is not None)
        self._slots = [WorkerSlot(i) for i in range(self._num_workers)]
        if resume is not None:
            self._record.resume_at(
                resume, self._base_seed,
                None if resume.next_worker is None else resume.next_worker - 1)
            for slot, position in zip(self._slots, resume.workers):
                slot.position = position
        self._procs: list[ProcessHandle] = []
        self._proc_serial = 0
        self._elastic = ElasticControl(
            self, self._options, self._num_workers, start_count=self._stats.processes or None,
            growth=None if self._local_active else loader._cluster_growth(),
            moves=loader._move_policy)
        if self._local_active:
            self._start_locally(loader.dataset, self._raw_config,
                                self._elastic.initial_processes())
        else:
            self._elastic.wait_for_nodes()
            with self._picker.placement_round():  # one reading of the nodes for them all
                for _ in range(self._elastic.initial_processes()):
                    self._add_process(count=False)
        self._count_processes()
        for slot in self._slots:  # logical worker w on process w mod P: equal shares
            slot.epoch_start = slot.position
            slot.process = self._procs[slot.worker_id % len(self._procs)]
            self._begin_slot(slot)
            if resume is not None and resume.status == fmt.ENDED and slot.position.seekable:
                # The saved epoch ended: its replicas ran to their end (position.finish_epoch).
                self._reset_epoch(slot, finish=slot.position)
        live_iterators.add(self)
        self._drop = resume.fast_forward if resume is not None else 0
        self._reset(loader, first_iter=True, start=start,
                    skip=resume.skip if resume is not None else 0,
                    first_worker=resume.next_worker if resume is not None else None)

    def _setup_ray(self) -> None:
        """What the Ray processes need: the dataset in the object store (once), the config,
        with the user's own modules where they travel (see dpex.workers.user_code)."""
        session_handles.hold(self)
        self._adopt_ray_setup(self._ray_setup())

    def _ray_setup(self) -> tuple[Any, Any, list[dict]]:
        """The setup's calls to Ray, safe in another thread (a local start runs them beside
        the loop): the dataset's ref, the config, and a reading of the nodes."""
        code = user_code.bundle_for(self._options.ship_modules, embedded=ray_session.owns_ray_session())
        dataset_ref = ray.put(user_code.wrap(self._dataset, code))
        return dataset_ref, user_code.wrap(self._raw_config, code), ray.nodes()

    def _adopt_ray_setup(self, setup: tuple[Any, Any, list[dict]]) -> None:
        self._dataset_ref, self._config, nodes = setup
        self._picker = NodePicker(self._options, nodes=nodes)  # its first placement's reading
        self._store.trainer_node = self._picker.trainer_node_id
        self._store.capacities.update(object_store_capacities(nodes))

    def _control_step(self) -> None:
        """Between batches and while waiting: the local start's hand-over, else elastic."""
        if self._local_active:
            self._local_step()
        else:
            self._elastic.tick()

    # ----------------------------------------------------------------- epoch control

    def _reset(self, loader: DataLoader, first_iter: bool = False,
               start: EpochStart | None = None, skip: int = 0,
               first_worker: int | None = None) -> None:
        """Start an epoch; with persistent workers, called again for each later epoch.

        ``start``: the first epoch's base seed and index batches (resume.py). ``skip``: a
        resumed epoch continues after ``skip`` handed-out batches, the first of them made by
        ``first_worker`` (an iterable's, whose exhausted replicas the round skips), or by
        worker ``skip mod num_workers``.
        """
        if not first_iter:
            self._drain()
            self._share_next_epoch()
            loader._distributed, _, _ = resuming.begin_epoch(loader, None)
            self._record.start_epoch(self._generator, self._num_workers,
                                     base_seed_drawn=False, carry_workers=True,
                                     length=epoch_length(self._index_sampler, self._is_iterable),
                                     iterable=self._is_iterable)
            self._drop = 0
        if start is None:
            cursor = IndexCursor(self._index_sampler)
            start = EpochStart(None, cursor, cursor)
        self._sampler_iter, self._cursor = start.batches, start.cursor
        self._task_sampler_state: dict[int, Any] = {}  # a Stateful sampler's, after task t
        self._loader_name = loader.name  # its tag on Ray's metrics endpoint (ray_metrics)
        self._IterableDataset_len_called = getattr(loader, "_IterableDataset_len_called", None)
        self._num_yielded = 0
        self._send_idx = skip  # next task id to dispatch
        self._rcvd_idx = skip  # next task id to hand out (in order)
        self._task_worker: dict[int, int] = {}  # task id -> worker id, until handed out
        self._results: dict[int, TaskResult] = {}
        # How many tasks torch's iterator would have dispatched by now (dispatch.py's NOTE).
        self._torch_dispatched = skip + self._prefetch_factor * self._num_workers
        self._arrivals: deque[int] = deque()  # received task ids, in arrival order
        self._calls: dict[Any, tuple[WorkerSlot, list[int]]] = {}  # ref -> slot, task ids
        # Calls whose result was not seen on the trainer's node yet: ref -> (sent, process);
        # a call leaves it when it arrives, is collected, or is dropped by a recovery.
        # NOTE [ dpex Delivered Rate ] (delivery.py).
        self._unarrived: dict[Any, tuple[float, ProcessHandle]] = {}
        self._observed_at = float("-inf")  # the last poll for arrivals (receive.py)
        self._task_ref: dict[int, Any] = {}
        self._tasks_outstanding = 0
        # Task t goes to worker t mod N, also when a resumed epoch starts at t = skip.
        first = skip % self._num_workers if first_worker is None else first_worker
        self._worker_cycle = itertools.islice(
            itertools.cycle(range(self._num_workers)), first, None)
        self._record.delivered = skip
        self._stats.start_epoch()
        self._timeline.start_epoch()
        self._store.clear(time.monotonic())
        for slot in self._slots:
            slot.active = True
            slot.num_tasks = 0
            slot.handed_out = 0
            slot.epoch_calls = 0
            slot.replay_log = []
            slot.epoch_start = slot.position
            if not first_iter:
                # torch's _ResumeIteration: each replica restarts its iterator. The actor runs
                # this before the tasks submitted below (actor calls run in order).
                self._reset_epoch(slot)
        self._fill()

    def _drain(self) -> None:
        """Wait out the tasks of an epoch the user broke out of (torch waits likewise).

        The workers run them anyway; collecting them keeps each slot's RNG state exact, and
        a worker that ran further ahead than torch's would have is rewound (dispatch.py).
        """
        self._sampler_iter = iter(())  # a replica's END must not dispatch more of that epoch
        self._submit_for(None)  # torch's workers would run what dpex still holds back
        while self._calls:
            ref = next(iter(self._calls))
            task_ids = self._calls[ref][1]
            self._collect(ref, timeout=None)
            for task_id in task_ids:  # never handed out: only its RNG state is kept
                if task_id in self._results:
                    self._results[task_id].payload = None
                self._store.released(task_id)
            self._submit_for(None)  # what the object store's budget held back, as room frees
        self._rewind_read_ahead()

    def __iter__(self) -> _RayDataLoaderIter:
        return self

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __next__(self) -> Any:
        if self.session_ended:
            raise RuntimeError(
                "the Ray session this epoch ran on ended (ray.shutdown()), and its worker "
                "processes with it; start a new epoch with iter(loader)")
        started = time.perf_counter()
        self._stalled = 0.0
        while True:
            try:
                result, worker_id = self._next_result()
            except StopIteration:
                self._store_stats()
                self._loader_metrics.publish(self._loader_name, self._stats)
                raise
            slot = self._slots[worker_id]
            self._record.deliver(
                worker_id, WorkerPosition.of(result),
                None if self._is_iterable else result.task_id,
                self._task_sampler_state.pop(result.task_id, None))
            dropped = self._dropped(result)
            slot.num_tasks -= 1
            slot.handed_out += 1
            self._torch_dispatched += 1  # torch dispatches one task per batch handed out
            self._store.released(result.task_id)  # the loop has it: its bytes no longer count
            self._fill()
            if not dropped:
                break
        waited = time.perf_counter() - started
        self._timeline.delivered(result.task_id, time.time())
        self._stats.record_batch(waited, slot.worker_id, result.made_on, stalled_s=self._stalled)
        self._num_yielded += 1
        self._warn_if_past_reported_length()
        self._stats.set_in_flight(self._tasks_outstanding)
        self._store_stats()
        self._control_step()
        self._loader_metrics.tick(self._loader_name, self._stats)
        if result.kind == ERROR:
            result.payload.reraise()
        data = transport.from_wire(result.payload)
        return nested.pin_memory(data) if self._pin_memory else data

    def __del__(self) -> None:
        if _getpid is None or getattr(self, "_created_in", None) != _getpid():
            # Released in a forked child of the trainer (its collector does not visit the
            # trainer's objects: NOTE [ dpex How Each Process Ends ], but the child's code
            # may drop one): Ray is the trainer's, and a call to it from here would block
            # that child for ever. The trainer releases the processes.
            return
        try:
            self._shutdown_workers(reuse=True)
        except Exception:
            pass

    # ----------------------------------------------------------------- torch parity details

    def _warn_if_past_reported_length(self) -> None:
        if (
            self._is_iterable
            and self._IterableDataset_len_called is not None
            and self._num_yielded > self._IterableDataset_len_called
        ):
            warnings.warn(
                f"Length of IterableDataset {self._dataset} was reported to be "
                f"{self._IterableDataset_len_called}(when accessing len(dataloader)), but "
                f"{self._num_yielded} samples have been fetched. For multiprocessing data-loading, "
                "this could be caused by not properly configuring the IterableDataset replica at "
                "each worker. Please see "
                "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for "
                "examples.",
                stacklevel=3,
            )

    def __getstate__(self):
        raise NotImplementedError(f"{type(self).__name__} cannot be pickled")
