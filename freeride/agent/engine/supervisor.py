"""The supervisor: memory admission, worker start, restart with backoff, the waits for a full disk, stop.

Runs on the agent's loop. Every background task it creates is owned (`Background`) and every
timer it sets is kept and cancelled at shutdown; a failure in either is logged and acted on: a
worker that cannot be started counts as a crash (restarted with backoff, FAILED after the task's
restarts). It owns the parts beside the lifecycle, each with one job: the workers' streams
(streams.py: what each worker says), the checkpoint deadlines (deadlines.py) and the memory
watchdog on its own thread (watchdog.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from freeride.agent.config import WorkerConfig
from freeride.agent.control.scheduler import Scheduler
from freeride.agent.domain.background import Background
from freeride.agent.domain.events import Control
from freeride.agent.domain.model import TaskRecord, TaskState
from freeride.agent.domain.timers import CallLater, TimerHandle
from freeride.agent.engine.admission import admit, worker_slot
from freeride.agent.engine.crashes import RestartTimers, after_crash
from freeride.agent.engine.deadlines import CheckpointDeadlines
from freeride.agent.engine.memory import MemoryGuard
from freeride.agent.engine.offload import Offload, ThreadOffload
from freeride.agent.engine.poison import ItemCrashes
from freeride.agent.engine.space import SpaceWatch
from freeride.agent.engine.streams import WAITING, WorkerStreams
from freeride.agent.engine.tasks import STOP_CONTROL, TaskRuntime, TaskTable, Worker
from freeride.agent.engine.watchdog import MemoryWatchdog, TreeScan
from freeride.agent.procs.workers import describe_exit, last_log_line, said_reason
from freeride.core import disk
from freeride.core.exits import NO_RESTART
from freeride.core.units import format_seconds

log = logging.getLogger("freeride.agent")

_FITS_NONE = WAITING + "its steps"  # the reason of a task whose steps fit no bubble seen
_DISK_FULL = WAITING + disk.WAIT_PREFIX  # the reason of a task that waits for space on a full disk


class Launcher(Protocol):
    """Starts worker processes (freeride.agent.procs.workers.WorkerLauncher; a fake in tests)."""

    async def spawn(self, task_id: str, instance: int, on_exit: Callable[[Worker, int], None],
                    env: dict[str, str] | None = None, python: str = "") -> Worker: ...

    async def settle(self) -> None: ...

    def tracking(self) -> TreeScan: ...


def _fits_none(estimate_ns: int, longest_ns: int) -> str:
    return (f"{_FITS_NONE} (p95 {format_seconds(estimate_ns / 1e9)}) do not fit any bubble "
            f"(longest {format_seconds(longest_ns / 1e9)})")


class Supervisor:
    def __init__(self, workers: WorkerConfig, state_dir: Path, table: TaskTable, memory: MemoryGuard,
                 launcher: Launcher, scheduler: Scheduler, call_later: CallLater | None = None,
                 offload: Offload | None = None, free_bytes: Callable[[], int] | None = None,
                 memory_cap_restarts: int = 0) -> None:
        """`offload`: where the watchdog's blocking reads run (None: a thread of its own, released by `shutdown`);
        `free_bytes()`: `state_dir`'s free space (default: its file system's)."""
        self._cfg, self._state_dir = workers, state_dir  # its own settings (AgentConfig.workers), where its files go
        self._table = table
        self._memory = memory
        self._launcher = launcher
        self._scheduler = scheduler
        self._call_later: CallLater = call_later or asyncio.get_running_loop().call_later
        self._restarts = RestartTimers(self._call_later)  # each task's pending restart (or start after a full disk)
        self._background = Background("supervisor")  # worker starts after a wait for memory or a backoff
        self._disk_waits: dict[str, int] = {}  # task id -> starts in a row that found the disk full
        self._item_crashes = ItemCrashes(state_dir / "checkpoints")  # crashes inside pool items (poison.py)
        self._admission_pass: TimerHandle | None = None  # set after a worker's exit freed memory
        self._instance = 0  # spawn counter: a stale worker process cannot attach
        self.checkpoint_dir = state_dir / "checkpoints"
        self.stopping = False
        self._deadlines = CheckpointDeadlines(workers.checkpoint_timeout_s, table, self._call_later)
        self.streams = WorkerStreams(workers, table, scheduler, self._deadlines, self.checkpoint_dir,
                                     lambda: self.stopping)
        self.watchdog = MemoryWatchdog(workers, table, memory, scheduler, launcher.tracking, self.admit_waiting,
                                       self._call_later, offload or ThreadOffload("freeride-sample"),
                                       SpaceWatch(free_bytes or (lambda: disk.usage(state_dir).free_bytes),
                                                  self._waits_for_disk, self.disk_freed), memory_cap_restarts)

    # -- memory admission ------------------------------------------------------------------------
    def usable_bytes(self) -> int | None:
        """What the resident side tasks may reserve in all (None: unbounded)."""
        return self._memory.usable_bytes([w.pid for w in self._table.workers()],
                                         self._scheduler.trainer_free_memory_bytes)

    def _admit(self, rec: TaskRecord, rt: TaskRuntime, start_reason: str,
               usable: Callable[[], int | None] | None = None) -> bool:
        """Take a worker slot and reserve the task's cap, or park it with the reason visible in `freeride show`."""
        if rt.reserved_bytes is None:
            why = worker_slot(self._resident(), self._cfg.max_workers) or admit(
                rec.spec.mem_limit_bytes, self._table.reserved_bytes, usable or self.usable_bytes)
            if why:
                first = rt.waiting is None
                rt.waiting = start_reason
                if rec.state.active and rec.state is not TaskState.STARTING:
                    self._table.set_state(rec, TaskState.STARTING, why)
                elif rec.reason != why:
                    self._table.set_reason(rec, why)
                if first:
                    log.info("task %s %s", rec.id, why)
                return False
            rt.reserved_bytes = rec.spec.mem_limit_bytes
        rt.waiting = None
        return True

    def _resident(self) -> int:
        """Admitted tasks whose worker has not exited yet (being created, or running)."""
        return sum(1 for rt in self._table.live.values() if rt.reserved_bytes is not None)

    def _admit_after_exit(self) -> None:
        self._admission_pass = None
        try:
            self.admit_waiting()
        except Exception:  # a timer callback: nobody else would see it; the watchdog's pass tries again
            log.exception("admitting waiting tasks after a worker's exit failed")

    def admit_waiting(self, usable: Callable[[], int | None] | None = None) -> None:
        """A worker slot or memory may have freed up: start the waiting tasks that fit now, highest priority
        first, then oldest. `usable`: the budget as just measured (None: measured here, once if needed)."""
        if self.stopping or self._resident() >= self._cfg.max_workers:
            return
        # One GPU query for the whole pass: workers start later (owned tasks), so the device is unchanged.
        usable = usable or functools.cache(self.usable_bytes)
        for rec in self._table.waiting():
            rt = self._table.live[rec.id]
            start_reason = rt.waiting or ""
            if self._admit(rec, rt, start_reason, usable):
                self._start_soon(rec, start_reason)

    # -- start, crash, restart -------------------------------------------------------------------
    async def start(self, rec: TaskRecord, reason: str = "") -> None:
        """Admit the task and start its worker. A task that does not fit waits (admit_waiting starts it);
        a worker that cannot be started is a crash: restarted with backoff, then FAILED."""
        try:
            await self._start(rec, reason)
        except Exception as exc:  # nothing else would ever report on this start
            full = ""
            if isinstance(exc, OSError) and disk.is_full(exc) and self._table.worker(rec.id) is None:
                # whose space it is: a statvfs and a walk of the state directory, off the loop
                full = await self.watchdog.off_loop(functools.partial(
                    disk.wait_reason, "its worker's files cannot be created in", self._state_dir, exc,
                    self._state_dir))
            self._start_failed(rec, exc, full)

    async def _start(self, rec: TaskRecord, reason: str) -> None:
        if self.stopping or rec.state.terminal or rec.state is TaskState.PAUSED:
            return
        rt = self._table.runtime(rec.id)
        if rt.worker is not None or rt.spawning:
            return
        if self._admission_pass is not None and rt.reserved_bytes is None and rt.waiting is None:
            rt.waiting = reason  # a worker exited and its admission pass is due: it admits in order, this one too
            return
        if not self._admit(rec, rt, reason):
            return
        self._table.set_state(rec, TaskState.STARTING, reason)
        self._instance += 1
        rt.spawning = True
        try:
            env = self._memory.client_env(rec.spec.mem_limit_bytes, rec.spec.no_mps)
            rt.worker = await self._launcher.spawn(rec.id, self._instance, self._on_exit, env=env,
                                                   python=rec.spec.python)
        finally:
            rt.spawning = False
        if self._disk_waits.pop(rec.id, None) is not None and rec.state is TaskState.STARTING:
            self._table.set_reason(rec, "started after the disk was full")
        worker = rt.worker
        if self._memory.client_started(worker.pid, rec.spec.no_mps):
            worker.before_kill = self._memory.terminate_client
        if self.stopping:  # the agent began to shut down while the process was being created
            self._stop(rt, worker, TaskState.PAUSED)
        elif rec.state is TaskState.SUBMITTED:  # paused and resumed while its process was being created
            self._table.set_state(rec, TaskState.STARTING, reason)
        elif rec.state in STOP_CONTROL:  # paused or cancelled meanwhile
            self._stop(rt, worker, rec.state)

    def _start_soon(self, rec: TaskRecord, reason: str) -> None:
        self._background.spawn(self.start(rec, reason))  # (start() acts on its own failures)

    def _start_failed(self, rec: TaskRecord, exc: Exception, full: str = "") -> None:
        """`full`: the disk is full, and this is what the task waits for (disk.wait_reason)."""
        worker = self._table.worker(rec.id)
        if worker is None and full:
            self._wait_for_disk(rec, full)
            return
        log.error("task %s: could not start its worker: %r", rec.id, exc, exc_info=exc)
        if worker is not None:  # it failed after the spawn: the worker's exit is the crash
            worker.kill(f"could not start its worker: {exc}")
            return
        self._table.live.pop(rec.id, None)  # its wait or its reservation goes with it
        if not self.stopping and (rec.state is TaskState.SUBMITTED or rec.state.active):
            self._crashed(rec, f"could not start its worker: {exc}", retryable=True, log_path=None)

    def _wait_for_disk(self, rec: TaskRecord, full: str) -> None:
        """Its worker's files could not be created, the disk is full: not the task's fault, so no restart is
        charged. It waits STARTING with the reason, and is started again with backoff, or at once when the agent
        frees space (`disk_freed`)."""
        self._table.live.pop(rec.id, None)  # its reservation goes; admission runs again on the next start
        if self.stopping or not (rec.state is TaskState.SUBMITTED or rec.state.active):
            return
        tries = self._disk_waits.get(rec.id, 0)
        self._disk_waits[rec.id] = tries + 1
        delay = min(disk.RETRY_S * 2 ** tries, disk.MAX_RETRY_S)
        reason = WAITING + full
        if not rec.reason.startswith(_DISK_FULL):
            log.warning("task %s %s; starting it again in %.0fs", rec.id, reason, delay)
        self._table.set_state(rec, TaskState.STARTING, reason)
        self._restart_in(rec, delay)

    def _waits_for_disk(self) -> bool:
        """A task waits for space: to start (its worker's files), or READY for its checkpoint to be written."""
        return bool(self._disk_waits) or any(
            rec.reason.startswith(_DISK_FULL) for i in self._table.live if (rec := self._table.records.get(i)))

    def disk_freed(self) -> None:
        """Space was freed (rm, prune, retention): what waits for the disk tries again now, not at its next
        backoff: a task not started starts, a worker whose checkpoint failed is asked for one."""
        for task_id in self._restarts.pending():
            rec = self._table.records.get(task_id)
            if rec is not None and task_id in self._disk_waits and rec.reason.startswith(_DISK_FULL):
                self._restarts.cancel(task_id)
                self._restart(rec)
        for task_id, rt in list(self._table.live.items()):
            rec = self._table.records.get(task_id)
            if (rec is not None and rec.state is TaskState.READY and rt.desired is None
                    and rec.reason.startswith(_DISK_FULL)):
                rt.send(Control.CHECKPOINT)

    def _on_exit(self, worker: Worker, code: int) -> None:
        if not self._table.worker_exited(worker):  # one removal: its runtime, reservation and sample go
            return
        self._scheduler.remove_task(worker.task_id)
        self._deadlines.worker_gone(worker.task_id)
        rec = self._table.records[worker.task_id]
        log.info("task %s: %s", rec.id, describe_exit(code))
        if self._table.waiting_count() and self._admission_pass is None:
            self._admission_pass = self._call_later(0, self._admit_after_exit)  # after this exit's own state change
        # A worker stopped by pause or cancel ends here: the state changed when the stop was asked.
        if self.stopping or rec.state.terminal or rec.state is TaskState.PAUSED:
            self._table.worker_gone(rec)
            return
        reason = worker.kill_reason or worker.failure or describe_exit(code)
        said = code == NO_RESTART and not worker.kill_reason and not worker.failure
        tail = ""
        if said:  # the worker could not send its reason (freeride.core.exits): it wrote it there, marked
            tail = said_reason(worker.log_path) or last_log_line(worker.log_path)
        elif not (worker.failure or worker.kill_reason):
            tail = last_log_line(worker.log_path)
        if said and tail:
            reason = tail
        elif tail and tail not in reason:
            reason = f"{reason}: {tail}"
        retryable = worker.retryable and not said
        item = self._item_crashes.charge(rec.id) if retryable and not worker.kill_reason else ""
        self._crashed(rec, reason, retryable, worker.log_path, item)

    def _crashed(self, rec: TaskRecord, reason: str, retryable: bool, log_path: Path | None, item: str = "") -> None:
        """Restart with backoff, or FAILED once the task has had all its restarts (crashes.py decides)."""
        limit = rec.spec.max_restarts if rec.spec.max_restarts >= 0 else self._cfg.max_restarts
        v = after_crash(rec.restarts, limit, self._cfg.restart_backoff_s, reason, retryable, log_path, item)
        rec.restarts += v.spends_restart
        self._table.set_state(rec, v.state, v.reason)
        if v.state is TaskState.STARTING:
            self._restart_in(rec, v.delay_s)

    def _restart_in(self, rec: TaskRecord, delay: float) -> None:
        self._restarts.set(rec.id, delay, lambda: self._restart(rec))

    def _restart(self, rec: TaskRecord) -> None:
        self._restarts.fired(rec.id)
        if rec.state is TaskState.STARTING:
            self._start_soon(rec, rec.reason)  # (a wait for the disk keeps its reason while it tries again)

    async def settle(self) -> None:
        """Until the worker starts in flight (after a wait for memory or a backoff) have ended."""
        await self._background.wait()

    # -- stop ------------------------------------------------------------------------------------
    def stop(self, rec: TaskRecord, desired: TaskState) -> None:
        """Ask the task's worker to checkpoint and exit, to become `desired` (PAUSED or CANCELLED)."""
        self._restarts.cancel(rec.id)
        self._disk_waits.pop(rec.id, None)
        rt = self._table.live.get(rec.id)
        if rt is not None and rt.worker is not None:
            self._stop(rt, rt.worker, desired)

    def _stop(self, rt: TaskRuntime, worker: Worker, desired: TaskState) -> None:
        rt.desired = desired
        self._scheduler.stop_granting(worker.task_id)  # what follows its step is a checkpoint, not a step
        if not rt.send(STOP_CONTROL[desired]):
            worker.kill(f"{desired.value.lower()} before it attached")
            return
        self._deadlines.stop_asked(worker)

    def fit(self, task_id: str, estimate_ns: int, longest_ns: int) -> None:
        """The scheduler found the task's steps too long for every bubble seen (estimate_ns > 0), or granted it a
        window it fits again (0): say so in its reason, or clear what was said."""
        rec = self._table.records.get(task_id)
        if rec is None or rec.state is not TaskState.READY:
            return
        if estimate_ns:
            why = _fits_none(estimate_ns, longest_ns)
            log.info("task %s %s", task_id, why)
            self._table.set_reason(rec, why)
        elif rec.reason.startswith(_FITS_NONE):
            log.info("task %s: its steps fit a bubble again", task_id)
            self._table.set_reason(rec, "")

    def hang(self, task_id: str, window_id: int) -> None:
        worker = self._table.worker(task_id)
        if worker is not None:
            log.warning("task %s: step still running long after window %d closed; killing it", task_id, window_id)
            worker.kill("a step hung past its window and was killed")

    async def shutdown(self) -> None:
        """Ask every worker to checkpoint and exit; kill those that do not within the grace period."""
        self.stopping = True
        for task_id in self._restarts.pending():
            self._restarts.cancel(task_id)
        self._deadlines.shutting_down()  # the grace period bounds every checkpoint from now on
        self.watchdog.stop()
        if self._admission_pass is not None:
            self._admission_pass.cancel()
        await self.watchdog.watched()  # a sample in flight ends (milliseconds) and is not applied
        await self.settle()  # (a spawn takes milliseconds)
        for rt in list(self._table.live.values()):
            if rt.worker is None:
                continue
            self._scheduler.stop_granting(rt.worker.task_id)
            if not rt.send(Control.PAUSE):
                rt.worker.kill("agent shutting down")
        exits = {asyncio.ensure_future(w.exited.wait()) for w in self._table.workers()}
        grace_s = min(self._cfg.shutdown_grace_s, self._cfg.checkpoint_timeout_s)
        try:
            if exits:
                _, late = await asyncio.wait(exits, timeout=grace_s)
                if late:
                    for w in self._table.workers():
                        w.kill(f"its checkpoint did not finish within the shutdown grace period ({grace_s:g}s)")
                    await asyncio.wait(late, timeout=5)
        finally:
            for f in exits:
                f.cancel()
            self._deadlines.cancel_all()
            self.watchdog.close()
        await self._launcher.settle()

    def watch_memory(self) -> None:
        """Start the memory watchdog (freeride.agent.engine.watchdog)."""
        self.watchdog.watch()
