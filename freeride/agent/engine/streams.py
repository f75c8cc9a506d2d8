"""The workers' streams, from the agent's side: a worker attaches, reports, and detaches.

Each message of a worker is folded into its task's record (progress, steps, estimates, peak memory)
and handed to whoever acts on it: the scheduler (steps, windows given back, checkpoints: no window
meanwhile), the task table (READY, DONE, a checkpoint to persist), the checkpoint deadlines. A
message from a stale worker (an instance replaced meanwhile) is dropped. The worker's lifecycle (start,
exit, restart, stop) is the supervisor's (freeride.agent.engine.supervisor).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from freeride.agent.config import WorkerConfig
from freeride.agent.control.scheduler import Scheduler, TaskSlot
from freeride.agent.domain.events import (
    Checkpointed,
    Checkpointing,
    Failed,
    Finished,
    IdleCpu,
    Ready,
    Steps,
    Waiting,
    WindowDone,
    WorkerMessage,
    WorkerSetup,
)
from freeride.agent.domain.model import TaskRecord, TaskState
from freeride.agent.engine.deadlines import CheckpointDeadlines
from freeride.agent.engine.tasks import STOP_CONTROL, Outbox, TaskTable, Worker
from freeride.errors import InvalidStateError

log = logging.getLogger("freeride.agent")

WAITING = "waiting: "  # the reason of a task that waits for a resource (it raised Unavailable)
BURNS = "uses CPU outside its windows"  # in the reason of a task whose threads kept running between windows
_MAX_WAITING_REASON = 200  # characters of the task's own words kept in its reason


class WorkerStreams:
    def __init__(self, workers: WorkerConfig, table: TaskTable, scheduler: Scheduler, deadlines: CheckpointDeadlines,
                 checkpoint_dir: Path, stopping: Callable[[], bool]) -> None:
        """`stopping`: whether the agent is shutting down (no task becomes a candidate for windows then).

        A task's peak memory is the watchdog's samples alone (freeride.agent.engine.watchdog), the measure its cap
        is compared to; the worker's own peak resident set (`StepReport.peak_memory_bytes`, VmHWM) is not: it
        counts shared libraries whole, so it read as peaks over caps the watchdog never saw passed (417.5 MiB
        over a 400 MiB cap in CPU mode, where the watchdog reads PSS or memory.current; ~600 MiB of CUDA
        libraries over a 256 MiB GPU cap, where it reads the device)."""
        self._cfg = workers
        self._table = table
        self._scheduler = scheduler
        self._deadlines = deadlines
        self._checkpoint_dir = checkpoint_dir
        self._stopping = stopping

    def attach(self, task_id: str, instance: int, outbox: Outbox) -> WorkerSetup:
        rt = self._table.live.get(task_id)
        worker = rt.worker if rt is not None else None
        if rt is None or worker is None or worker.instance != instance:
            raise InvalidStateError(f"no worker instance {instance} is expected for task {task_id}")
        rec = self._table.records[task_id]
        rt.outbox = outbox
        if rt.desired is not None:  # stopped before it attached (and its kill is still on its way)
            rt.send(STOP_CONTROL[rt.desired])
        return WorkerSetup(
            task_ref=rec.spec.ref,
            args=rec.spec.args,
            checkpoint_path=str(self._checkpoint_dir / f"task-{task_id}.ckpt"),
            checkpoint_interval_s=rec.spec.checkpoint_interval_s or self._cfg.checkpoint_interval_s,
            mem_limit_bytes=rec.spec.mem_limit_bytes,
        )

    def detach(self, task_id: str, instance: int) -> None:
        rt = self._table.live.get(task_id)
        if rt is not None and rt.worker is not None and rt.worker.instance == instance:
            rt.outbox = None
            self._scheduler.remove_task(task_id)

    def on_worker_message(self, task_id: str, instance: int, msg: WorkerMessage) -> None:
        worker = self._table.worker(task_id)
        if worker is None or worker.instance != instance:
            return
        rec = self._table.records[task_id]
        if isinstance(msg, Steps):
            self._scheduler.on_steps(task_id, msg)
            if msg.progress:
                rec.progress.update(msg.progress)
        elif isinstance(msg, WindowDone):
            self._scheduler.on_window_done(task_id, msg)
            if msg.step_estimate_ns:
                rec.step_estimate_ns = msg.step_estimate_ns
        elif isinstance(msg, Ready):
            rec.kind = msg.kind
            rec.progress.update(msg.progress)
            # The checkpoint it resumed from: after a kill -9 of the agent, the worker's last checkpoint
            # (taken when it lost the agent) never reached the ledger as a Checkpointed message.
            rec.checkpoint_steps = msg.resumed_steps
            # Nor did the steps before it (the ledger is written behind, a lost window is never accounted):
            # the task ran at least as many steps as it resumes from.
            rec.counters.steps = max(rec.counters.steps, msg.resumed_steps)
            if rec.state is TaskState.STARTING:
                # Keep why this worker was (re)started visible: a crash, an agent restart.
                self._table.set_state(rec, TaskState.READY, rec.reason)
                self._schedule(rec, worker)
        elif isinstance(msg, Checkpointed):
            rec.checkpoint_steps = msg.steps
            rec.progress.update(msg.progress)
            self._table.checkpointed(rec)
        elif isinstance(msg, Finished):
            rec.progress.update(msg.progress)
            self._scheduler.remove_task(task_id)
            if not rec.state.terminal:
                self._table.set_state(rec, TaskState.DONE)
        elif isinstance(msg, Failed):
            worker.failure = msg.reason
            worker.retryable = msg.retryable
            rt = self._table.live.get(task_id)
            if rt is not None and rt.desired is not None and rec.state is rt.desired:
                # Its checkpoint on pause or cancel failed: its exit is no crash, yet the user must hear of it.
                self._table.set_reason(rec, f"{rec.reason}; its checkpoint failed: {msg.reason}")
        elif isinstance(msg, Waiting):
            self._on_waiting(rec, worker, msg)
        elif isinstance(msg, Checkpointing):
            self._on_checkpointing(rec, worker, msg.active)
        elif isinstance(msg, IdleCpu):
            self._on_idle_cpu(rec, msg)

    def _on_idle_cpu(self, rec: TaskRecord, msg: IdleCpu) -> None:
        """Its worker used CPU while it held no window: training paid for it. Said once per worker (it sends
        this once) in the log, and in the task's reason (kept beside a reason it has; not twice)."""
        words = (f"{BURNS} ({100 * msg.cpu_ns / msg.idle_ns:.0f}% of a core over {msg.idle_ns / 1e9:.1f} s "
                 "without a window): a thread or process it starts keeps running after step() returns; stop it there")
        log.warning("task %s %s", rec.id, words)
        if BURNS not in rec.reason and not rec.state.terminal:
            self._table.set_reason(rec, f"{rec.reason}; {words}" if rec.reason else words)

    def _schedule(self, rec: TaskRecord, worker: Worker) -> None:
        """Make the task a candidate for windows: its worker is ready, or the resource it waited for is back
        (not once it was asked to stop: the agent shutting down, or the task paused or cancelled)."""
        rt = self._table.live.get(rec.id)
        if self._stopping() or rt is None or rt.desired is not None:
            return
        self._scheduler.add_task(TaskSlot(
            task_id=rec.id, priority=rec.spec.priority, port=worker.window, counters=rec.counters,
            step_estimate_ns=rec.step_estimate_ns or None,
        ))

    def _on_waiting(self, rec: TaskRecord, worker: Worker, msg: Waiting) -> None:
        """A task that waits for a resource holds no window and is no candidate; its reason says what it waits for.

        Its WindowDone came first on the same stream, so the window it gave back was released (and handed
        on) as usual. It stays READY: pause, cancel and shutdown reach its worker as they reach any other,
        and with no window it has no step that could hang.
        """
        if msg.waiting:
            self._scheduler.remove_task(rec.id)  # a window granted before this message is handed on
            reason = WAITING + " ".join(msg.reason.split())[:_MAX_WAITING_REASON]
            if rec.state is TaskState.READY and rec.reason != reason:
                log.info("task %s %s", rec.id, reason)
                self._table.set_reason(rec, reason)
        elif rec.state is TaskState.READY and rec.id not in self._scheduler.tasks:
            log.info("task %s: what it waited for is back", rec.id)
            if rec.reason.startswith(WAITING):
                self._table.set_reason(rec, "")
            self._schedule(rec, worker)

    def _on_checkpointing(self, rec: TaskRecord, worker: Worker, active: bool) -> None:
        """A checkpoint began or ended, whoever asked for it (the interval, the task's end, a stop): it is no step.

        The scheduler grants the task nothing meanwhile and arms no hang timer; `--checkpoint-timeout-s`
        bounds it instead. One asked for by pause, cancel or shutdown has that deadline already (from the stop).
        """
        self._scheduler.checkpointing(rec.id, active)
        if not active:
            self._deadlines.checkpoint_ended(rec.id)
            return
        rt = self._table.live.get(rec.id)
        if not (self._stopping() or rt is None or rt.desired is not None):
            self._deadlines.checkpoint_began(worker)
