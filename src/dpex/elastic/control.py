"""The elastic control of one iterator: how many processes, and which hosts which worker.

NOTE [ dpex Elastic Workers ]

Logical workers and processes
  ``num_workers`` keeps torch's meaning: N logical workers (``WorkerSlot``), task t to
  logical worker t mod N, torch's seeds, one replica and RNG stream each. Processes
  (``ProcessHandle``, pooled Ray actors) host one or more logical workers (worker.py swaps each
  one's RNG state in before its tasks). Which process hosts a logical worker never changes
  a bit of its batches: a move is the recovery protocol used on purpose.

A move (remote_iter.py: ``_move`` / ``_finish_move``)
  Only between two tasks of the logical worker: it drains first. While ``moving_to`` is
  set, the tasks torch's order assigns to it wait in ``slot.pending`` (they still count
  against the prefetch bound); when its last in-flight result is filed, the old process
  drops its replica, the new one makes a replica at the slot's position (RNG state, an
  IterableDataset's ``state_dict``) and the pending tasks are submitted there, in order.
  An IterableDataset replica without ``state_dict`` cannot seek: it never moves. If a
  process dies while one of its workers is leaving, that worker arrives at once; if the
  destination dies first, the worker stays. One round of moves at a time.

What decides (this module, on the training thread, at most once per window)
  * Autoscaling (``WorkerOptions(autoscale=Autoscale(...))``): ``scaling.AutoscalePolicy``
    reads the window (the loop's wait, batches, each process's measured speed) and picks a
    count. Up: new processes start *watched* (no worker moves to a process before it
    answers, so a move never waits on a cold start), then workers move onto them. Down:
    the slowest processes whose workers can all move retire: their workers move out, and
    each is given back to the warm pool once empty.
  * Rebalancing (``rebalance=True``, default): when the loop waited more than 5% of the
    window, ``scaling.plan_moves`` moves workers from slow processes to fast ones if the
    predicted throughput rises by 30% or more (the margin keeps noise from moving them).
    It balances nodes first, by their summed process speeds (a node's processes share its
    CPUs), at most what its CPUs give (less the trainer's use, over the CPU seconds a task
    costs: speeds read while its processes took turns add up to more), then within nodes.
    A process left with no workers keeps its last measured speed, drifting back toward the
    others' so it is tried again later (a busy node may have become free). What a planned
    move must pass first, and after, is below ("Moves that only help").
  * New nodes (fixed process count): when the loop waits and a node joined that placement
    by CPUs would use, one process moves there: a new one starts on it (watched), then the
    process on the most crowded node retires into it. A node where a process of this loader
    did not start within ``start_timeout_s`` (its CPU taken by another process) is not
    followed again, and a move waiting for such a process is called off.
  * Growing the cluster (``Autoscale(grow_cluster=True)`` on a cluster with an autoscaler):
    a count above what the eligible nodes can host is asked of the autoscaler, and
    processes start on the nodes as they join; see NOTE [ dpex Cluster Growth ].
  These two follow the nodes: they live in node_following.py (``NodeFollowing``, mixed
  into ``ElasticControl``).
  Every decision is logged in ``loader.stats()``: ``scaling_events`` and the process count
  over time (``process_timeline``), and what was asked of the autoscaler
  (``cluster_requests``).

Moves that only help (move_policy.py, ``MovePolicy``: the rules and their constants)
  A speed read over a few tasks can be wrong (under object-store pressure a node's
  processes read at a third of their speed, and a move onto the trainer's busy core made
  the loader slower), so the rebalancer's moves answer to the loader's own throughput:
  batches/s over the windows in which the loop stalled (when it does not wait, the loader is
  not the bottleneck), no move drained, and no epoch's ramp came (its first 2 batches per
  worker, torch's prefetch: replicas begin, the loop waits for the first batches; the
  processes' speeds are measured afresh after it). Such windows of one layout add up across
  epochs, so short epochs are judged over several. A move is planned only on two of them
  (20 batches); the same evidence of the layout it made, after its drain, judges it: lower
  by over 2%, it is undone once (the undo is not judged) and the next move waits 30 s,
  doubling with each failure in a row (at most 8 min); a move whose layout ended unjudged
  (a loader without persistent workers starts each epoch from the default layout) counts as
  a failure. One judgement at a time. A logical worker moves at most once a minute (no
  flip-flop between processes of about one speed), but for the undo of a bad move: waiting
  a minute on a layout measured slower is what the rules prevent.
  Moves the autoscaler and node following make (onto new processes, out of retiring ones,
  a new node's swap) are their own decisions: not judged here (the autoscaler judges its
  steps by the throughput: its ceiling), and not held back (a retire must empty its process
  whatever moved last); they count for the minute rule, and a layout they change starts its
  evidence afresh. The policy is the loader's (``DataLoader._move_policy``): it outlives the
  iterators of a loader without persistent workers.

Across epochs
  A loader without persistent workers makes a new iterator per epoch; with autoscaling it
  starts with the process count the last one ended with (``loader.stats().processes``), not
  from ``min_processes`` again.
"""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING, Any

from dpex.elastic.move_policy import MovePolicy, Verdict
from dpex.elastic.node_following import NodeFollowing
from dpex.elastic.scaling import (
    AutoscalePolicy,
    Window,
    median,
    node_limit,
    plan_moves,
    processes_for,
)
from dpex.observe.delivery import judged
from dpex.workers.options import NoEligibleNodeError, WorkerOptions, eligible_node_cpus

if TYPE_CHECKING:
    from dpex.elastic.cluster_growth import ClusterGrowth
    from dpex.workers.lifecycle import ProcessLifecycle
    from dpex.workers.process_handle import ProcessHandle

# Rebalance only when the loop waited more than this share of a window, and only for a
# predicted gain of at least this factor.
_STALLED = 0.05
_MIN_GAIN = 1.3
_WINDOW_S = 2.0  # without autoscaling
_MIN_SAMPLES = 5  # tasks a process must have run before its speed is trusted
_DRIFT = 0.05  # per window, how far an empty process's speed drifts toward the others'
_RAMP_BATCHES = 2  # per logical worker: an epoch's first batches (torch's prefetch) are its ramp


class ElasticControl(NodeFollowing):
    """Decides process counts and moves for one ``_RayDataLoaderIter``; see the NOTE.
    What follows the nodes (joins, the autoscaler) is in ``NodeFollowing``."""

    def __init__(self, it: ProcessLifecycle, options: WorkerOptions, num_workers: int,
                 start_count: int | None, growth: ClusterGrowth | None = None,
                 moves: MovePolicy | None = None) -> None:
        # ``it`` is the iterator (remote_iter.py), driven through its process half only.
        # A proxy, not a reference: the iterator must die when the user drops it (its
        # __del__ releases the processes), not wait for the cycle collector.
        self._it = weakref.proxy(it)
        self._options = options
        self._num_workers = num_workers
        autoscale = options.autoscale
        self._policy = AutoscalePolicy(autoscale, num_workers) if autoscale else None
        self._window_s = autoscale.window_s if autoscale else _WINDOW_S
        self._start_count = start_count
        # (time, stall_s, batches): the loop's data stalls, not its time in next() (which
        # includes the loader's own cost per batch, and would read as a stall that more
        # processes cannot cure).
        self._last: tuple[float, float, int] | None = None
        # The trainer's CPU time at the window's start; the CPUs it used in the last window.
        self._trainer_cpu_at = 0.0
        self._trainer_cpus = 0.0
        self._swap: tuple[ProcessHandle, ProcessHandle] | None = None  # (new, old) for a new node
        self._starved_nodes: set[str] = set()  # a process of this loader did not start there
        self._filling = False  # processes were added: move workers onto them once up
        self._growth = growth if self._policy is not None else None
        # The loader's: it outlives this iterator, so evidence and rests span epochs.
        self._moves = moves if moves is not None else MovePolicy()
        self._moves.layout_reset()  # this iterator's workers start on w mod P again
        self._unsettled = False  # a move drained during this window

    def initial_processes(self) -> int:
        if self._policy is None:
            return processes_for(self._num_workers, self._options.num_processes)
        if self._start_count is not None:
            return max(self._policy.min_processes,
                       min(self._start_count, self._policy.max_processes))
        return self._policy.initial()

    def note(self, reason: str) -> None:
        count = len(self._live())
        self._it._stats.record_scaling(count, count, reason)

    def tick(self) -> None:
        """Called by the iterator after each batch and while it waits; acts once a window."""
        stats = self._it._stats
        now = time.monotonic()
        self._unsettled = self._unsettled or self._moving()
        if self._filling and self._fill_new_processes():  # as soon as they answer
            return
        if self._growth is not None:
            self._growth.refresh()
            self._follow_growth()
        if self._last is None:
            # The first window starts at the epoch's first batch: waiting for processes to
            # start is not a stall that more processes would cure.
            if stats.epoch_batches > 0:
                self._last = (now, stats.stall_s, stats.batches)
                self._trainer_cpu_at = time.process_time()
            return
        started, wait0, batches0 = self._last
        if now - started < self._window_s:
            return
        self._last = (now, stats.stall_s, stats.batches)
        cpu = time.process_time()
        self._trainer_cpus = (cpu - self._trainer_cpu_at) / (now - started)
        self._trainer_cpu_at = cpu
        procs = self._live()
        if not procs:
            return
        window = Window(now - started, stats.stall_s - wait0, stats.batches - batches0,
                        tuple(p.speed() for p in procs))
        stalled = window.wait_s / window.elapsed_s > _STALLED
        settled, self._unsettled = not self._unsettled and not self._moving(), self._moving()
        # Part of an epoch's ramp: its first batches came in this window.
        ramp = stats.epoch_batches - window.batches < _RAMP_BATCHES * self._num_workers
        verdict = self._moves.window(now, self._layout(), window.elapsed_s, window.batches,
                                     stalled, settled, ramp)
        if verdict is not None:
            self._judged(verdict, now)
        if ramp:  # the ramp's tasks are not the processes' speed: measured afresh after it
            for proc in procs:
                if self._it._hosted(proc):
                    proc.restart_measurement()
        self._drift_idle_speeds(procs)
        if self._policy is not None:
            capacity = self._it._picker.capacity(len(procs))
            grow_to = self._growth.limit if self._growth is not None else 0
            decision = self._policy.decide(window, len(procs), capacity, grow_to)
            if decision is not None:
                self._scale(len(procs), decision.processes, decision.reason)
                return
            self._withdraw_unmet_ask(window, len(procs))
        if (stalled and self._options.rebalance and self._moves.may_move(now)
                and self._ready_to_move()):
            self._rebalance(_MIN_GAIN)
        if stalled and self._policy is None and self._swap is None:
            self._follow_new_nodes()

    # ----------------------------------------------------------------- decisions

    def _scale(self, current: int, target: int, reason: str) -> None:
        stats = self._it._stats
        if target > current:
            added = 0
            capacity = self._it._picker.capacity(current)
            if self._growth is not None and target > capacity:
                self._ask(target, reason)
            with self._it._picker.placement_round():  # one reading of the nodes for them all
                for _ in range(min(target, max(capacity, current)) - current):
                    try:
                        self._it._add_process(watch=True)
                        added += 1
                        self._filling = True
                    except NoEligibleNodeError:
                        break
            stats.record_scaling(current, current + added, reason)
        else:
            chosen = self._retirable()[:current - target]
            for proc in chosen:
                self._retire(proc)
            stats.record_scaling(current, current - len(chosen), reason)
            if self._growth is not None and self._growth.asked:
                self._ask(target if target > self._growth.base_capacity else 0, reason)

    def _fill_new_processes(self) -> bool:
        """Move workers onto processes that just started and host nothing yet."""
        procs = [p for p in self._live() if p.ready_ref is None]
        empty = [p for p in procs if not self._it._hosted(p)]
        starting = any(p.ready_ref is not None for p in self._live())
        if not any(p.samples == 0 for p in empty) and not starting and self._swap is None:
            self._filling = False
        if not empty or self._moving():
            return False
        if self._swap is not None and self._swap[0] in empty:
            new, old = self._swap
            self._swap = None
            self._retire(old, prefer=new)
            return True
        if any(p.samples == 0 for p in empty) and len(empty) < len(procs):
            return bool(self._rebalance(min_gain=1.0, why="onto new processes", judged=False))
        return False

    def _rebalance(self, min_gain: float, why: str = "toward faster processes",
                   judged: bool = True) -> int:
        """Plan and start moves. ``judged``: the rebalancer's own (workers that moved within
        the last minute stay, and the move is judged by the throughput after it); filling
        new processes is the autoscaler's decision, not judged here."""
        procs = [p for p in self._live() if p.ready_ref is None]
        hosted = [[s.worker_id for s in self._it._hosted(p)] for p in procs]
        now = time.monotonic()
        resting = self._moves.resting(now) if judged else set()
        movable = {s.worker_id for s in self._it._slots
                   if self._it._movable(s) and s.worker_id not in resting}
        planned = plan_moves([p.speed() for p in procs], hosted, movable, min_gain,
                             nodes=[p.node_id for p in procs], limits=self._node_limits(procs))
        moves = [(w, procs[s], procs[d]) for w, s, d in planned]
        for worker_id, _, dst in moves:
            self._it._move(self._it._slots[worker_id], dst)
        self._moves.moved(now, [(w, s.serial, d.serial) for w, s, d in moves], judged=judged)
        if moves:
            speeds = ", ".join(f"process {p.serial}: "
                               + (f"{p.speed():.1f}/s" if p.speed() > 0 else "new") for p in procs)
            count = len(self._live())
            self._it._stats.record_scaling(
                count, count, f"moved workers {sorted(w for w, _, _ in moves)} {why} ({speeds})")
        return len(moves)

    def _node_limits(self, procs: list[ProcessHandle]) -> dict[Any, float]:
        """Per node hosting workers, the most tasks/s its CPUs give (``scaling.node_limit``),
        from the median CPU seconds per task of its processes."""
        trainer = self._it._picker.trainer_node_id
        cpus = eligible_node_cpus(self._options, trainer)
        limits = {}
        for node in {p.node_id for p in procs if self._it._hosted(p)}:
            costs = [p.cpu_s for p in procs
                     if p.node_id == node and p.cpu_s and self._it._hosted(p)]
            limit = node_limit(cpus.get(node, 0.0), median(costs) if costs else None,
                               self._trainer_cpus if node == trainer else 0.0)
            if limit is not None:
                limits[node] = limit
        return limits

    def _judged(self, verdict: Verdict, now: float) -> None:
        """Log the verdict on the rebalancer's last move; undo it if it lowered the
        throughput (the workers still where it put them go back, if their process is up)."""
        workers = sorted(w for w, _, _ in verdict.moves)
        ready = {p.serial: p for p in self._live() if p.ready_ref is None}
        undone = []
        for worker, at, back in verdict.undo:
            slot = self._it._slots[worker]
            if (back in ready and slot.process is not None and slot.process.serial == at
                    and self._it._movable(slot)):
                self._it._move(slot, ready[back])
                undone.append((worker, at, back))
        self._moves.moved(now, undone, judged=False)
        if verdict.kept:
            return self.note(f"kept move of workers {workers}: {verdict.reason}")
        what = (f"undid move of workers {sorted(w for w, _, _ in undone)}" if verdict.undo
                else f"move of workers {workers} not judged")
        wait = max(0.0, self._moves.quiet_until() - now)
        self.note(f"{what}: {verdict.reason}; next move after {wait:.0f} s")

    def _layout(self) -> tuple:
        """Which process (and node) hosts each logical worker: what evidence is of."""
        return tuple((s.process.serial, s.process.node_id) if s.process is not None else None
                     for s in self._it._slots)

    # ----------------------------------------------------------------- helpers

    def _retire(self, proc: ProcessHandle, prefer: ProcessHandle | None = None) -> None:
        """Move ``proc``'s workers out (to ``prefer`` first, else by speed), then release it."""
        proc.retiring = True
        if self._added_node(proc):
            proc.keep_warm_s = 0.0
        self._it._count_processes()
        others = [p for p in self._live() if p.ready_ref is None]
        counts = {p: len(self._it._hosted(p)) for p in others}
        typical = median([p.speed() for p in others if p.speed() > 0]) if others else 0.0
        moved = []
        for slot in [s for s in self._it._slots if s.process is proc]:
            if prefer is not None and prefer in counts:
                dest = prefer
            else:
                dest = max(others, key=lambda p: ((p.speed() or typical) / (counts[p] + 1),
                                                  -p.serial))
            counts[dest] += 1
            self._it._move(slot, dest)
            moved.append((slot.worker_id, proc.serial, dest.serial))
        self._moves.moved(time.monotonic(), moved, judged=False)  # they rest, all the same
        if not self._it._hosted(proc):
            self._it._drop_process(proc, reuse=True)

    def _retirable(self) -> list[ProcessHandle]:
        """Processes that can give all their workers away, in the order to retire them:
        those still starting or hosting nothing, then the slowest. One that has started
        always stays, to take the others' workers."""
        procs = self._live()
        started = [p for p in procs if p.ready_ref is None]
        empty = [p for p in procs if not self._it._hosted(p)]
        # Processes on nodes that joined later first (they can then be given back).
        busy = sorted((p for p in started if p not in empty and all(
            self._it._movable(s) for s in self._it._hosted(p))),
            key=lambda p: (not self._added_node(p), p.speed()))
        keep = next((p for p in reversed(busy)), None) or next(iter(started), None)
        return [p for p in empty + busy if p is not keep]

    def _live(self) -> list[ProcessHandle]:
        return [p for p in self._it._procs if not p.dead and not p.retiring]

    def _moving(self) -> bool:
        return any(s.moving_to is not None for s in self._it._slots)

    def _ready_to_move(self) -> bool:
        """No move under way, and every process hosting workers is judged (``judged``):
        after _MIN_SAMPLES tasks, or sooner when a call of it is long overdue."""
        if self._moving() or self._it._store.held_within(time.monotonic(), self._window_s):
            return False  # a full object store is not a slow process (store_budget.py)
        hosted = [p for p in self._live() if self._it._hosted(p)]
        times = [p.seconds_per_task() for p in hosted if p.samples >= _MIN_SAMPLES]
        typical = median([t for t in times if t]) if any(times) else None
        out, now = self._oldest_calls_out(), time.time()  # the clock of sent and arrived
        return all(judged(p.samples, _MIN_SAMPLES,
                          p.delivery.overdue_s(now, *out.get(p, (None, 1))), typical)
                   for p in hosted)

    def _oldest_calls_out(self) -> dict[ProcessHandle, tuple[float, int]]:
        """Per process, its oldest call whose result has not arrived: (sent, tasks)."""
        oldest: dict[ProcessHandle, tuple[float, int]] = {}
        for ref, (sent, proc) in self._it._unarrived.items():
            call = self._it._calls.get(ref)
            if call is not None and (proc not in oldest or sent < oldest[proc][0]):
                oldest[proc] = (sent, len(call[1]))
        return oldest

    def _drift_idle_speeds(self, procs: list[Any]) -> None:
        busy = [p.seconds_per_task() for p in procs
                if p.seconds_per_task() and self._it._hosted(p)]
        if not busy:
            return
        typical = median(busy)
        for proc in procs:
            if proc.seconds_per_task() and not self._it._hosted(proc):
                proc.drift(typical, _DRIFT)
