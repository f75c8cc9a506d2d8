"""The task table: every task's record and, while the task is live, its runtime, one entry each.

A TaskRecord is what outlives the agent (the store persists it). A TaskRuntime is what exists
only in this process, from the moment the task is to be started until its worker exits: why it
waits for memory, its admitted reservation, its worker process, the stream to it, what it should
become once stopped, its last memory sample. A worker's exit removes the runtime in one step,
so nothing of a dead worker is left behind. (The scheduler keeps its own slot per resident task.)

Every state change goes through `set_state`: the one place that checks the state machine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from freeride.agent.control.slots import WindowPort
from freeride.agent.domain.events import Control
from freeride.agent.domain.model import TaskRecord, TaskState, check_transition

log = logging.getLogger("freeride.agent")

Outbox = asyncio.Queue[Control | None]  # commands to one attached worker; None ends its stream
STOP_CONTROL = {TaskState.PAUSED: Control.PAUSE, TaskState.CANCELLED: Control.CANCEL}  # a stop, as asked of a worker


class Change(enum.Enum):
    """What changed in a task record, which says how soon it is written and whether watchers hear of it."""

    STATE = "state"  # written now, announced
    REASON = "reason"  # written at once (the next write), announced
    PROGRESS = "progress"  # a checkpoint: written with the next batch, not announced
    WORKER = "worker"  # its worker exited with no new state (paused, finished): nothing to write, announced


class Worker(Protocol):
    """A worker process as the engine sees it (freeride.agent.procs.workers.WorkerProcess; fakes in tests)."""

    kill_reason: str  # why the agent killed it, once it did
    failure: str  # what the worker said when it failed
    retryable: bool
    before_kill: Callable[[int], Awaitable[None]] | None

    @property
    def task_id(self) -> str: ...
    @property
    def instance(self) -> int: ...
    @property
    def pid(self) -> int: ...
    @property
    def log_path(self) -> Path: ...
    @property
    def window(self) -> WindowPort: ...  # its window word (freeride.core.window.WindowWriter)
    @property
    def exited(self) -> asyncio.Event: ...
    def kill(self, reason: str) -> None: ...


@dataclass(slots=True)
class TaskRuntime:
    """What exists of a live task only in this process."""

    waiting: str | None = None  # while it waits for memory: why it was being started
    reserved_bytes: int | None = None  # its admitted cap, held until its worker exits; None: not admitted
    spawning: bool = False  # its worker process is being created
    worker: Worker | None = None
    outbox: Outbox | None = None  # the stream to its worker, once the worker has attached
    desired: TaskState | None = None  # PAUSED or CANCELLED: asked of the worker, which checkpoints and exits
    memory_bytes: int | None = None  # the worker's memory at the watchdog's latest sample

    def send(self, control: Control) -> bool:
        """Put `control` on the stream to its worker; False when no worker is attached."""
        if self.outbox is None:
            return False
        self.outbox.put_nowait(control)
        return True


def copy_record(rec: TaskRecord) -> TaskRecord:
    """A copy that later changes to `rec` do not reach (for the database thread and for watchers)."""
    return dataclasses.replace(rec, counters=dataclasses.replace(rec.counters), progress=dict(rec.progress))


class TaskTable:
    def __init__(self, on_change: Callable[[TaskRecord, Change], None],
                 wall_clock: Callable[[], float] = time.time) -> None:
        """`on_change(rec, change)` runs after every change to a record that must reach the database."""
        self.records: dict[str, TaskRecord] = {}
        self.live: dict[str, TaskRuntime] = {}
        self._on_change = on_change
        self._wall_clock = wall_clock

    def runtime(self, task_id: str) -> TaskRuntime:
        """The task's runtime, created if the task has none yet."""
        rt = self.live.get(task_id)
        if rt is None:
            rt = self.live[task_id] = TaskRuntime()
        return rt

    def worker(self, task_id: str) -> Worker | None:
        rt = self.live.get(task_id)
        return rt.worker if rt is not None else None

    def workers(self) -> list[Worker]:
        return [rt.worker for rt in self.live.values() if rt.worker is not None]

    def waiting(self) -> list[TaskRecord]:
        """The tasks that wait for memory, highest priority first (then oldest)."""
        ids = [i for i, rt in self.live.items() if rt.waiting is not None]
        return sorted((self.records[i] for i in ids), key=lambda r: (-r.spec.priority, int(r.id)))

    def over(self, task_id: str) -> bool:
        """Nothing of the task runs or will run: it is gone, or over (or PAUSED) with its worker exited."""
        rec = self.records.get(task_id)
        return rec is None or ((rec.state.terminal or rec.state is TaskState.PAUSED) and self.worker(task_id) is None)

    def waiting_count(self) -> int:
        return sum(1 for rt in self.live.values() if rt.waiting is not None)

    @property
    def reserved_bytes(self) -> int:
        return sum(rt.reserved_bytes for rt in self.live.values() if rt.reserved_bytes is not None)

    def worker_exited(self, worker: Worker) -> bool:
        """Drop the task's runtime if `worker` is its current worker; False for a stale one."""
        rt = self.live.get(worker.task_id)
        if rt is None or rt.worker is not worker:
            return False
        del self.live[worker.task_id]
        return True

    def set_state(self, rec: TaskRecord, new: TaskState, reason: str = "") -> None:
        check_transition(rec.state, new)
        if new.terminal or new is TaskState.PAUSED:
            rt = self.live.get(rec.id)
            if rt is not None and rt.worker is None and not rt.spawning:
                del self.live[rec.id]  # nothing runs: its wait and its reservation end here
            elif rt is not None:
                rt.waiting = None  # its worker's exit ends the rest
        old, rec.state, rec.reason = rec.state, new, reason
        rec.updated_unix_s = self._wall_clock()
        log.info("task %s %s -> %s%s", rec.id, old.value, new.value, f" ({reason})" if reason else "")
        self._on_change(rec, Change.STATE)

    def set_reason(self, rec: TaskRecord, reason: str) -> None:
        """A new reason without a new state (why it waits for memory, and how much is free)."""
        rec.reason = reason
        rec.updated_unix_s = self._wall_clock()
        self._on_change(rec, Change.REASON)

    def worker_gone(self, rec: TaskRecord) -> None:
        """Its worker exited after the state had already changed (pause, cancel): watchers see the pid go."""
        self._on_change(rec, Change.WORKER)

    def checkpointed(self, rec: TaskRecord) -> None:
        """The task's checkpoint (steps, progress) moved on: persist it with the next batch."""
        self._on_change(rec, Change.PROGRESS)

    def snapshot(self, ids: set[str]) -> list[TaskRecord]:
        return [copy_record(self.records[i]) for i in ids if i in self.records]
