"""What the trainer knows of each worker process (``ProcessHandle``) and of each logical
worker (``WorkerSlot``, torch's worker id): where it runs, what it owes, how fast it goes.
The iterator's process half (lifecycle.py) starts, recovers, moves and releases them.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from dpex.epoch.position import WorkerPosition
from dpex.observe.delivery import DeliveryRecord, slower_time, speed
from dpex.ray_session import session_handles


class ProcessHandle:
    """One worker process (a Ray actor, from the warm pool) and what the trainer knows of it."""

    def __init__(self, actor: Any, node_id: str | None, serial: int) -> None:
        self.actor = actor
        self.node_id = node_id
        self.serial = serial
        self.ready_ref = None  # set while a process added by the elastic control starts
        self.start_deadline = 0.0
        self.dead = False
        self.retiring = False  # its logical workers are moving out; released when empty
        # How long the pool may keep it idle once released; None: WorkerOptions.idle_timeout_s.
        # Shorter on nodes the autoscaler added (cluster_growth.py: an idle actor keeps its
        # node from being removed); 0 when it retires from such a node: killed.
        self.keep_warm_s: float | None = None
        self.busy_s: float | None = None  # moving average of its time per task
        self.cpu_s: float | None = None  # moving average of its CPU seconds per task
        self.samples = 0
        self.delivery = DeliveryRecord()  # its pace on the trainer's side (delivery.py)
        # Seconds its calls waited for the object store's budget before they were sent,
        # and when one last did (time.monotonic): store pressure, not its speed, which
        # counts from the sending (NOTE [ dpex Object Store Budget ]).
        self.store_held_s = 0.0
        self.store_held_at: float | None = None

    def record(self, busy_s: float, cpu_s: float = 0.0) -> None:
        self.samples += 1
        self.busy_s = busy_s if self.busy_s is None else 0.8 * self.busy_s + 0.2 * busy_s
        if cpu_s > 0:
            self.cpu_s = cpu_s if self.cpu_s is None else 0.8 * self.cpu_s + 0.2 * cpu_s

    def seconds_per_task(self) -> float | None:
        """The slower of its busy time per task and its delivered pace; None while unknown."""
        return slower_time(self.busy_s, self.delivery.seconds_per_task())

    def speed(self) -> float:
        """Tasks per second it delivers while it has work (``delivery.speed``); 0 while
        unknown."""
        return speed(self.busy_s, self.delivery.seconds_per_task())

    def restart_measurement(self) -> None:
        """An epoch's ramp is over: its first tasks (replicas beginning, the whole prefetch
        sent at once, the wait at the epoch's start) are not this process's speed. Its
        speed is measured afresh from here; its CPU seconds per task are kept."""
        self.busy_s = None
        self.samples = 0
        self.delivery = DeliveryRecord()

    def forget_session(self) -> None:
        """Its Ray session ended (NOTE [ dpex Handles Stay in Their Ray Session ])."""
        session_handles.keep(self.actor, self.ready_ref)
        self.dead = True

    def drift(self, toward_s: float, share: float) -> None:
        """While it hosts no worker: move its estimate ``share`` of the way toward
        ``toward_s`` per task, so it is tried again later. Its pace is folded into the
        estimate and started afresh: the next calls it gets are a new measurement."""
        current = self.seconds_per_task() or toward_s
        self.busy_s = current + (toward_s - current) * share
        self.delivery = DeliveryRecord()


class WorkerSlot:
    """One logical worker (torch's worker id): where it runs, and what it owes the trainer."""

    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id
        self.process: ProcessHandle | None = None
        self.moving_to: ProcessHandle | None = None  # set while it drains before a move
        # Assigned, not yet submitted: until a call's worth is pending (dispatch.py), or
        # while the worker moves.
        self.pending: deque[tuple[int, Any]] = deque()
        self.ready_ref = None  # set while its replica is being made (begin)
        self.start_deadline = 0.0
        self.active = True  # False once its IterableDataset replica is exhausted this epoch
        self.num_tasks = 0  # tasks dispatched and not yet handed out (torch's bookkeeping)
        self.handed_out = 0  # its batches handed out this epoch
        self.epoch_calls = 0  # calls submitted to it this epoch (dispatch.py ramps up)
        self.in_flight: dict[int, Any] = {}  # task id -> index, in submission order
        self.position = WorkerPosition()  # after the last received result
        self.epoch_start = WorkerPosition()  # position when this epoch began
        self.replay_log: list[Any] = []  # IterableDataset: indices received this epoch
        self.deaths_per_task: dict[int, int] = {}
        self.restarts = 0
        # A shared stream (NOTE [ dpex Shared Stream ]): the reference of its previous
        # task's batch while another worker made it (its own worker is one task behind),
        # the trainer's last call to its worker, and its replica's fence.
        self.after_ref: Any = None
        self.barrier: Any = None
        self.generation = 0

    @property
    def actor(self) -> Any:
        return self.process.actor if self.process is not None else None

    @property
    def node_id(self) -> str | None:
        return self.process.node_id if self.process is not None else None
