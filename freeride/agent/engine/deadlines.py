"""Checkpoint deadlines: every checkpoint is bounded by --checkpoint-timeout-s, whoever asked for it.

One a stop asked for (pause, cancel: the worker checkpoints and exits) and one the worker began on its
own (its interval, its task's end) each have a timer; past it the worker is killed (a crash, restarted
from its previous checkpoint, which is kept), and the task's reason says why. A stop's deadline takes
over from a checkpoint's already under way. Every timer is kept and cancelled when its worker exits.
"""

from __future__ import annotations

import logging

from freeride.agent.domain.model import TaskState
from freeride.agent.domain.timers import CallLater, TimerHandle
from freeride.agent.engine.tasks import TaskTable, Worker

log = logging.getLogger("freeride.agent")


class CheckpointDeadlines:
    def __init__(self, timeout_s: float, table: TaskTable, call_later: CallLater) -> None:
        self._timeout_s = timeout_s
        self._table = table
        self._call_later = call_later
        self._stops: dict[str, TimerHandle] = {}  # task id -> when its asked-for checkpoint is overdue
        self._checkpoints: dict[str, TimerHandle] = {}  # task id -> when its running checkpoint is overdue

    def stop_asked(self, worker: Worker) -> None:
        """The worker was asked to checkpoint and exit (its task's runtime says what it should become)."""
        if worker.task_id in self._stops:
            return
        _cancel(self._checkpoints, worker.task_id)  # a checkpoint under way: this deadline bounds it now
        timeout_s = self._timeout_s
        self._stops[worker.task_id] = self._call_later(timeout_s, lambda: self._stop_overdue(worker, timeout_s))

    def checkpoint_began(self, worker: Worker) -> None:
        """The worker began a checkpoint nobody stopped it for (not during a stop or the agent's shutdown)."""
        if worker.task_id in self._checkpoints:
            return
        timeout_s = self._timeout_s
        self._checkpoints[worker.task_id] = self._call_later(
            timeout_s, lambda: self._checkpoint_too_long(worker, timeout_s))

    def checkpoint_ended(self, task_id: str) -> None:
        _cancel(self._checkpoints, task_id)

    def worker_gone(self, task_id: str) -> None:
        _cancel(self._stops, task_id)
        _cancel(self._checkpoints, task_id)

    def shutting_down(self) -> None:
        """The shutdown's grace period bounds every checkpoint from now on."""
        for task_id in list(self._checkpoints):
            _cancel(self._checkpoints, task_id)

    def cancel_all(self) -> None:
        for task_id in list(self._stops):
            _cancel(self._stops, task_id)
        self.shutting_down()

    def _stop_overdue(self, worker: Worker, timeout_s: float) -> None:
        """A worker asked to stop has not exited within --checkpoint-timeout-s: kill it, and say so in its reason
        (the stop asked for last: a pause turned into a cancel while it checkpointed is a cancel)."""
        self._stops.pop(worker.task_id, None)
        rt = self._table.live.get(worker.task_id)
        if self._table.worker(worker.task_id) is not worker or rt is None or rt.desired is None:
            return
        desired = rt.desired
        rec = self._table.records[worker.task_id]
        verb = "pause" if desired is TaskState.PAUSED else "cancel"
        why = (f"its checkpoint after {verb} did not finish within {timeout_s:g}s (--checkpoint-timeout-s); "
               "its worker was killed, its previous checkpoint is kept")
        log.warning("task %s: %s", rec.id, why)
        worker.kill(why)
        if rec.state is desired:
            self._table.set_reason(rec, f"{rec.reason}; {why}" if rec.reason else why)

    def _checkpoint_too_long(self, worker: Worker, timeout_s: float) -> None:
        """A checkpoint nobody stopped the task for ran past --checkpoint-timeout-s: kill the worker (a crash,
        restarted from its previous checkpoint), saying so."""
        self._checkpoints.pop(worker.task_id, None)
        if self._table.worker(worker.task_id) is not worker:
            return
        why = (f"its checkpoint did not finish within {timeout_s:g}s (--checkpoint-timeout-s); "
               "its worker was killed, its previous checkpoint is kept")
        log.warning("task %s: %s", worker.task_id, why)
        worker.kill(why)


def _cancel(timers: dict[str, TimerHandle], task_id: str) -> None:
    timer = timers.pop(task_id, None)
    if timer is not None:
        timer.cancel()
