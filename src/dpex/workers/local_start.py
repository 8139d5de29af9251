"""A cold process's first loader begins on local processes, and moves to Ray once it is up.

NOTE [ dpex Local Start ]

When
  A distributed iterator in a process that has no Ray session, that would start the
  embedded Ray (no cluster to join; ``ray_session.would_start_embedded``), or that joined
  the embedded Ray before any of its worker processes answered (a later epoch, another
  loader, while the first hand-over is still starting its Ray processes), outside a
  multi-rank ``torch.distributed`` job, with workers that may run on the trainer's node
  (no ``avoid_trainer_node``, custom resources, labels, GPUs or ``ray_options``).
  ``WorkerOptions(local_start=False)`` turns it off.

  Logical workers that cannot move (an ``IterableDataset`` without ``state_dict``: its
  replica's place in the stream lives only in its process) stay on their local processes
  for the iterator's life, as torch's workers would, and no head is started for them (steps
  2 to 4 do not happen): they could never use it, and a stream's first batch would wait
  for Ray's start (16 s against torch's 0.1 s on 2 cores). In the embedded Ray they start
  locally also after other loaders' Ray processes answered: a new Ray process takes
  seconds. Only a local process that dies is replaced, by a Ray process (below).

What happens
  1. The iterator forks its processes from the trainer (``LocalActor``: torch's own
     mechanism, milliseconds, the dataset inherited) and each hosts its logical workers
     exactly as a Ray process would: same seeds, same tasks, RNG state with every result.
  2. Then the embedded head starts in a helper process (ray_session/embedded.py, its NOTE),
     which begins Ray's start 5 s later: a run that ends first never starts Ray. The
     trainer itself holds no Ray state yet, so later iterators of the same process can fork
     local processes too.
  3. Between batches, and while the loop waits, ``_local_step`` checks the head. Once it is
     up the trainer joins it (about 0.1 s). A thread of the trainer puts the dataset in the
     object store and reads the nodes: those calls wait on the head's daemons, still at
     the lowest priority, and the loop goes on meanwhile (the process's first such setup
     starts a second after the join, ``SETUP_AFTER_JOIN_S``). Then the iterator starts
     one Ray process per local one, watched: none takes a worker before it answers.
  4. As each answers, the logical workers of its local twin move to it with the move
     protocol (elastic.py's NOTE: drain, then continue from the RNG state of the last
     result), and the local process ends once empty. Until the last one has, the head's
     processes (Ray's daemons, and the Ray processes importing torch and the dataset)
     run at the lowest priority, on what the loop leaves of the cores (NOTE [ dpex
     Embedded Head Priority ]). The batches are torch's bits
     throughout. The elastic control (autoscaling, rebalancing) waits until every worker
     is on Ray. An iterator that ends first gives its Ray processes, started or still
     starting, to the warm pool (pool.py), and the next one takes them.

Failures
  A local process that dies is recovered as a dead Ray process is, onto a Ray process
  (joining the head first, waiting for it if need be). If it dies while its workers are
  moving, they arrive on their Ray process at once; if the Ray process dies first, they
  stay local and a new Ray process is started for them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ray
import torch

from dpex import ray_session
from dpex.ray_session import session_handles
from dpex.workers.local_workers import LOCAL_NODE, LocalActor, wait
from dpex.workers.pool import POOL

if TYPE_CHECKING:
    from dpex.workers.options import WorkerOptions
    from dpex.workers.process_handle import ProcessHandle


def workers_cannot_move(dataset: Any, is_iterable: bool) -> bool:
    """An ``IterableDataset`` without ``state_dict``: the NOTE's workers that stay local."""
    return is_iterable and not callable(getattr(dataset, "state_dict", None))


def can_start_locally(loader: Any, options: WorkerOptions, is_iterable: bool) -> bool:
    """The conditions of the NOTE's "When"."""
    # dpex's embedded Ray, before any of its processes answered, still starts locally; and
    # workers that cannot move always do there (a Ray process would take seconds to start).
    cold_embedded_ray = ray_session.owns_ray_session() and (
        not POOL.answered or workers_cannot_move(loader.dataset, is_iterable))
    if not options.local_start or (ray.is_initialized() and not cold_embedded_ray):
        return False
    if (options.avoid_trainer_node or options.resources or options.labels
            or options.num_gpus or options.ray_options):
        return False
    if (torch.distributed.is_available() and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1):
        return False
    if cold_embedded_ray:
        return True
    try:
        return ray_session.would_start_embedded(loader.head_address)
    except Exception:  # a Ray without the pieces this needs: start as before
        return False


# The process's first setup after it joined costs the trainer about 0.15 CPU-s of Ray's own
# imports (its serialization context), as the join does: a second apart, they fall in two
# epochs of a loop with short epochs, not in one.
SETUP_AFTER_JOIN_S = 1.0


class BesideTheLoop:
    """A call run in a daemon thread of the trainer; its result (or its exception) taken
    once done."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, args=(call,), daemon=True,
                         name="dpex-ray-setup").start()

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            self._result = call()
        except BaseException as exc:  # noqa: BLE001 - raised where the result is taken
            self._error = exc
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._result


class LocalStart:
    """The local-start half of ``_RayDataLoaderIter`` (which sets the attributes used here)."""

    def _start_locally(self, dataset: Any, config: Any, count: int) -> None:
        """Fork ``count`` local processes (the NOTE's step 1), then start the head (2)."""
        from dpex.workers.process_handle import ProcessHandle

        for _ in range(count):
            self._proc_serial += 1
            self._procs.append(ProcessHandle(LocalActor(dataset, config), LOCAL_NODE,
                                             self._proc_serial))
        self._local_twins: dict[ProcessHandle, ProcessHandle] = {}  # Ray process -> local
        self._pending_setup: BesideTheLoop | None = None  # step 3's setup, while it runs
        # Workers that cannot move stay local (the NOTE's "When"): no head for them.
        self._stay_local = workers_cannot_move(dataset, self._is_iterable)
        if self._stay_local:
            return
        ray_session.start_embedded()
        if self._share_on:  # its stream shares nothing before Ray is up: no lowest priority
            ray_session.full_priority()

    def _local_procs(self) -> list[ProcessHandle]:
        return [p for p in self._procs if isinstance(p.actor, LocalActor) and not p.dead]

    def _local_step(self) -> None:
        """Steps 3 and 4 of the NOTE, as far as they can go now."""
        if not self._local_active or self._stay_local:
            return
        if self._dataset_ref is None:
            if not ray_session.joined_if_up() or not self._set_up_beside_the_loop():
                return
            self._elastic.note("Ray is up: a Ray process for each local one, started or from the "
                               "warm pool")
        with self._picker.placement_round():  # one reading of the nodes for them all
            for local in self._local_procs():  # step 3, and again if a Ray twin died
                if (self._hosted(local) and not local.retiring
                        and local not in self._local_twins.values()):
                    self._local_twins[self._add_process(watch=True)] = local
        starting = [p.ready_ref for p in self._local_twins if p.ready_ref is not None]
        if starting:
            ready, _ = wait(starting, num_returns=len(starting), timeout=0)
            for proc in [p for p in self._local_twins if p.ready_ref in ready]:
                self._on_started(proc)
        for proc, local in list(self._local_twins.items()):
            if proc.dead or local.dead or not self._hosted(local):
                del self._local_twins[proc]
            elif proc.ready_ref is None:  # step 4: it answered
                del self._local_twins[proc]
                local.retiring = True
                for slot in [s for s in self._slots if s.process is local]:
                    if slot.moving_to is None:
                        self._move(slot, proc)
                if not self._hosted(local):
                    self._drop_process(local, reuse=False)
        if not self._local_procs():
            self._local_active = False
            self._elastic.note("every logical worker is on a Ray process")
            ray_session.full_priority()  # the head back at the trainer's priority

    def _set_up_beside_the_loop(self) -> bool:
        """Step 3's setup in a thread (``_ray_setup``); True once its result is adopted."""
        if self._pending_setup is None:
            since_join = ray_session.seconds_since_join()
            if since_join is not None and since_join < SETUP_AFTER_JOIN_S:
                return False
            session_handles.hold(self)
            self._pending_setup = BesideTheLoop(self._ray_setup)
            return False
        if not self._pending_setup.done():
            return False
        self._adopt_pending_setup()
        return True

    def _adopt_pending_setup(self) -> None:
        """The thread's setup, once it is done (waiting for it if need be)."""
        self._adopt_ray_setup(self._pending_setup.result())
        self._pending_setup = None

    def _ensure_ray(self) -> None:
        """Join the head now, waiting for it if need be (a recovery needs a Ray process)."""
        if self._dataset_ref is None:
            ray_session.connect(self._head_address)
            if self._pending_setup is not None:  # wait for the one running
                self._adopt_pending_setup()
            else:
                self._setup_ray()
