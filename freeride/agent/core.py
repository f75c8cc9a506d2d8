"""The agent's engine: task lifecycle, worker supervision, persistence, and the scheduler's glue.

Runs on one asyncio loop; the only other thread is the database writer, so the scheduler and
the task table need no locks. Nothing here waits on a worker or a client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import re
import sys
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from freeride.agent.config import AgentConfig
from freeride.agent.convert import task_to_pb
from freeride.agent.limits import check_spec
from freeride.agent.memory import MemoryGuard
from freeride.agent.model import Counters, TaskRecord, TaskSpec, TaskState, check_transition
from freeride.agent.registry import Registry, RegistryWriteError
from freeride.agent.scheduler import Scheduler, SchedulerConfig, TaskSlot, TimerHandle
from freeride.agent.workers import WorkerLauncher, WorkerProcess, describe_exit, last_log_line
from freeride.core.stats import percentile
from freeride.errors import InvalidSpecError, InvalidStateError, TaskNotFoundError, TaskRefError
from freeride.gpu import MemoryProbe
from freeride.gpu.control import GpuControl, cpu_only
from freeride.v1 import tasks_pb2, trainer_pb2, worker_pb2

log = logging.getLogger("freeride.agent")

T = TypeVar("T")
_ARG_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MAX_MEM_BYTES = 1 << 50  # 1 PiB: anything above is a typo, not a GPU
_COUNTER_FLUSH_S = 0.1  # a kill -9 loses at most this much accounting
_DB_RETRY_S = 1.0  # while the state database cannot be written (disk full): retry this often
_DB_ERROR_LOG_EVERY_S = 60.0
_FINAL_WRITE_ATTEMPTS = 3
_CHECK_TIMEOUT_S = 60.0


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        registry: Registry,
        launcher: WorkerLauncher,
        clock: Callable[[], int] = time.monotonic_ns,
        memory: MemoryProbe | None = None,
        gpu: GpuControl | None = None,
    ) -> None:
        self.config = config
        self._registry = registry
        self._launcher = launcher
        self._clock = clock
        self.clock = clock
        gpu = gpu if gpu is not None else cpu_only()
        self.memory = MemoryGuard(gpu, memory if memory is not None else gpu.probe, config.headroom_bytes)
        self._waiting: dict[str, str] = {}  # task id -> why it was being started, while it waits for memory
        self._loop = asyncio.get_running_loop()
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="freeride-db")
        self._db_closed = False  # set once the final write is done: nothing may be scheduled on _db after
        self.records: dict[str, TaskRecord] = {}
        self.workers: dict[str, WorkerProcess] = {}
        self._outboxes: dict[str, asyncio.Queue[worker_pb2.AgentCommand | None]] = {}
        self._desired: dict[str, TaskState] = {}
        self._instance = 0
        self._dirty: set[str] = set()
        self._ledger_dirty = False
        self._flush_handle: asyncio.TimerHandle | None = None
        self._subscribers: set[asyncio.Queue[tasks_pb2.AgentEvent]] = set()
        self.recent_windows: deque[tasks_pb2.WindowRecord] = deque(maxlen=1024)
        self.trainers = 0
        self.dropped_events = 0
        self.rejected_events = 0
        self.shutting_down = False
        self.db_error = ""  # why the state database cannot be written right now; empty when it can
        self._db_failures = 0
        self._db_error_logged_at = 0.0
        self.started_ns = clock()
        self.ckpt_dir = config.state_dir / "checkpoints"
        self.scheduler = Scheduler(
            clock,
            self._call_at,
            SchedulerConfig(
                margin_ns=int(config.margin_ms * 1e6),
                hang_timeout_ns=int(config.hang_timeout_s * 1e9),
            ),
            on_account=self._on_account,
            on_hang=self._on_hang,
        )

    # -- plumbing --------------------------------------------------------------------------------
    def _call_at(self, when_ns: int, fn: Callable[[], None]) -> TimerHandle:
        # asyncio's clock is time.monotonic, the same CLOCK_MONOTONIC the trainer stamps events with.
        return self._loop.call_at(when_ns / 1e9, fn)

    async def _in_db(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._loop.run_in_executor(self._db, fn, *args)

    def _snapshot(self, ids: set[str]) -> list[TaskRecord]:
        return [
            dataclasses.replace(r, counters=dataclasses.replace(r.counters), progress=dict(r.progress))
            for r in (self.records[i] for i in ids if i in self.records)
        ]

    def _flush(self) -> asyncio.Future[bool]:
        """Write dirty records and the ledger now (ordered behind earlier writes); resolves to success."""
        self._flush_handle = None
        if self._db_closed:  # after the final write (a late state change while stopping): kept in memory only
            done: asyncio.Future[bool] = self._loop.create_future()
            done.set_result(False)
            return done
        recs = self._snapshot(self._dirty)
        self._dirty.clear()
        ledger = dataclasses.replace(self.scheduler.gpu) if self._ledger_dirty else None
        self._ledger_dirty = False
        return self._loop.run_in_executor(self._db, self._save, recs, ledger)

    def _save(self, recs: list[TaskRecord], ledger: Counters | None) -> bool:
        """Database thread. A failed write loses nothing: the records are marked dirty again and retried."""
        try:
            self._registry.save(recs, self.config.gpu if ledger else None, ledger)
        except Exception as exc:  # RegistryWriteError (disk full, I/O error), or anything else: never drop it
            error = str(exc) if isinstance(exc, RegistryWriteError) else f"writing the state failed: {exc!r}"
            self._loop.call_soon_threadsafe(self._save_failed, {r.id for r in recs}, ledger is not None, error)
            return False
        if self.db_error:
            self._loop.call_soon_threadsafe(self._save_recovered)
        return True

    def _save_failed(self, ids: set[str], ledger: bool, error: str) -> None:
        """Log loudly (once, then every minute), keep everything in memory, retry every second."""
        self._db_failures += 1
        now = time.monotonic()
        if not self.db_error or now - self._db_error_logged_at >= _DB_ERROR_LOG_EVERY_S:
            self._db_error_logged_at = now
            log.error(
                "%s (%d failed writes so far). Tasks and the harvest ledger are kept in memory and written again "
                "every %.0fs; new submissions are refused until a write succeeds. Free space or fix %s.",
                error, self._db_failures, _DB_RETRY_S, self.config.state_dir,
            )
        self.db_error = error
        if self.shutting_down:  # shutdown() retries on its own; no timer may outlive the database thread
            self._dirty |= ids
            self._ledger_dirty |= ledger
            return
        self._mark_dirty(ids, ledger, delay_s=_DB_RETRY_S)

    def _save_recovered(self) -> None:
        log.warning("state database writable again after %d failed writes; nothing was lost", self._db_failures)
        self.db_error = ""
        self._db_failures = 0

    def _mark_dirty(self, ids: set[str], ledger: bool, delay_s: float = _COUNTER_FLUSH_S) -> None:
        self._dirty |= ids
        self._ledger_dirty |= ledger
        if self.shutting_down:  # shutdown() writes everything last; no timer may outlive the database thread
            return
        if self._flush_handle is None:
            delay_s = max(delay_s, _DB_RETRY_S) if self.db_error else delay_s
            self._flush_handle = self._loop.call_later(delay_s, self._flush)

    def trainer_changed(self, connected: bool, peer: str) -> None:
        """Count trainer streams and say so to watchers (`top`, tests): no poll needed to see one go."""
        self.trainers += 1 if connected else -1
        change = tasks_pb2.TrainerChange(connected=connected, peer=peer, trainers=self.trainers)
        self._publish(tasks_pb2.AgentEvent(time_ns=self._clock(), trainer=change))

    def _publish(self, event: tasks_pb2.AgentEvent) -> None:
        for q in self._subscribers:
            if q.full():
                self.dropped_events += 1
            else:
                q.put_nowait(event)

    def subscribe(self) -> asyncio.Queue[tasks_pb2.AgentEvent]:
        q: asyncio.Queue[tasks_pb2.AgentEvent] = asyncio.Queue(maxsize=4096)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[tasks_pb2.AgentEvent]) -> None:
        self._subscribers.discard(q)

    def info(self, rec: TaskRecord) -> tasks_pb2.TaskInfo:
        slot = self.scheduler.tasks.get(rec.id)
        return task_to_pb(rec, running=slot is not None and slot.window_id != 0)

    def _set_state(self, rec: TaskRecord, new: TaskState, reason: str = "") -> None:
        check_transition(rec.state, new)
        if new.terminal or new is TaskState.PAUSED:
            self._waiting.pop(rec.id, None)
            if rec.id not in self.workers:
                self.memory.admission.release(rec.id)
        old, rec.state, rec.reason = rec.state, new, reason
        rec.updated_unix_s = time.time()
        log.info("task %s %s -> %s%s", rec.id, old.value, new.value, f" ({reason})" if reason else "")
        self._dirty.add(rec.id)
        self._flush()
        self._publish(tasks_pb2.AgentEvent(time_ns=self._clock(), task=self.info(rec)))

    # -- start and stop --------------------------------------------------------------------------
    async def start(self) -> None:
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        for rec in await self._in_db(self._registry.load):
            self.records[rec.id] = rec
        self.scheduler.gpu = await self._in_db(self._registry.load_ledger, self.config.gpu)
        resumed = [r for r in self.records.values() if r.state.active or r.state is TaskState.SUBMITTED]
        for rec in resumed:
            await self._start_worker(rec, reason="agent restarted" if rec.state.active else "")
        log.info("agent for GPU %d ready: %d tasks known, %d resumed", self.config.gpu, len(self.records), len(resumed))
        self._loop.call_later(self.config.memory_check_s, self._check_memory)

    def _check_memory(self) -> None:
        """The memory watchdog: a worker above its cap is stopped; training and other tasks are not touched."""
        if self.shutting_down:
            return
        for task_id, used in self.memory.sample({t: w.pid for t, w in self.workers.items()}).items():
            rec, worker = self.records[task_id], self.workers[task_id]
            rec.memory_bytes = used
            rec.peak_memory_bytes = max(rec.peak_memory_bytes, used)
            cap = rec.spec.mem_limit_bytes
            if cap and used > cap and not worker.kill_reason:
                reason = f"memory_cap_exceeded: {used / 2**20:.0f} MiB in use, cap {cap / 2**20:.0f} MiB"
                log.warning("task %s: %s; stopping its worker", task_id, reason)
                worker.retryable = rec.restarts < self.config.memory_cap_restarts
                worker.kill(reason)
        if self._waiting:
            self._admit_waiting()  # the device's free memory may have grown without any event
        self._loop.call_later(self.config.memory_check_s, self._check_memory)

    # -- memory admission ------------------------------------------------------------------------
    def usable_bytes(self) -> int | None:
        """What the resident side tasks may reserve in all (None: unbounded)."""
        return self.memory.usable_bytes([w.pid for w in self.workers.values()],
                                        self.scheduler.trainer_free_memory_bytes)

    def _admit(self, rec: TaskRecord, start_reason: str,
               usable: Callable[[], int | None] | None = None) -> bool:
        """Reserve the task's cap, or park it with the reason visible in `freeride show`."""
        why = self.memory.admission.admit(rec.id, rec.spec.mem_limit_bytes, usable or self.usable_bytes)
        if not why:
            self._waiting.pop(rec.id, None)
            return True
        first = rec.id not in self._waiting
        self._waiting[rec.id] = start_reason
        if rec.state.active and rec.state is not TaskState.STARTING:
            self._set_state(rec, TaskState.STARTING, why)
        elif rec.reason != why:
            rec.reason = why
            rec.updated_unix_s = time.time()
            self._mark_dirty({rec.id}, ledger=False, delay_s=0)
            self._publish(tasks_pb2.AgentEvent(time_ns=self._clock(), task=self.info(rec)))
        if first:
            log.info("task %s %s", rec.id, why)
        return False

    def _admit_waiting(self) -> None:
        """Memory may have freed up: start the waiting tasks that fit now, highest priority first."""
        # One GPU query for the whole pass: workers start later (create_task), so the device is unchanged.
        usable = functools.cache(self.usable_bytes)
        for task_id in sorted(self._waiting, key=lambda i: (-self.records[i].spec.priority, int(i))):
            rec = self.records[task_id]
            start_reason = self._waiting[task_id]
            if self._admit(rec, start_reason, usable):
                self._loop.create_task(self._start_worker(rec, start_reason))

    async def shutdown(self) -> int:
        """Ask every worker to checkpoint and exit; kill those that do not within the grace period."""
        self.shutting_down = True
        for task_id, worker in list(self.workers.items()):
            if not self._send_control(task_id, worker_pb2.CONTROL_ACTION_PAUSE):
                worker.kill("agent shutting down")
        pending = [asyncio.ensure_future(w.exited.wait()) for w in self.workers.values()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=self.config.shutdown_grace_s)
            if late:
                for w in list(self.workers.values()):
                    w.kill("did not stop within the shutdown grace period")
                await asyncio.wait(late, timeout=5)
        await self._launcher.settle()
        if self._flush_handle is not None:  # the final flush below writes everything
            self._flush_handle.cancel()
        self._dirty |= set(self.records)
        self._ledger_dirty = True
        saved = await self._flush()
        for _ in range(_FINAL_WRITE_ATTEMPTS - 1):
            if saved:
                break
            await asyncio.sleep(_DB_RETRY_S)  # a retry back-off while stopping, not a control-path wait
            saved = await self._flush()
        self._db_closed = True
        self._db.shutdown(wait=True)
        self.memory.close()
        if not saved:
            log.error(
                "could not write the final state to %s (%s): task states and harvest since the last successful "
                "write are lost; exiting with an error", self.config.state_dir, self.db_error,
            )
            return 1
        return 0

    # -- management API --------------------------------------------------------------------------
    def get(self, task_id: str) -> TaskRecord:
        rec = self.records.get(task_id)
        if rec is None:
            raise TaskNotFoundError(f"no task with id {task_id!r} on GPU {self.config.gpu} (see `freeride ls`)")
        return rec

    async def submit(self, spec: TaskSpec) -> TaskRecord:
        if self.shutting_down:
            raise InvalidStateError("the agent is shutting down; submit again once it is back")
        _validate(spec)
        check_spec(spec, self.memory.device_total_bytes())
        checked = await _check_ref(spec)
        if spec.priority == 0 and checked.get("priority"):
            spec = dataclasses.replace(spec, priority=int(checked["priority"]))
        if spec.mem_limit_bytes == 0 and checked.get("mem_limit_bytes"):
            spec = dataclasses.replace(spec, mem_limit_bytes=int(checked["mem_limit_bytes"]))
        if not spec.name:
            spec = dataclasses.replace(spec, name=str(checked.get("name", "task")))
        now = time.time()
        rec = TaskRecord(
            id="", spec=spec, state=TaskState.SUBMITTED, kind=str(checked["kind"]),
            created_unix_s=now, updated_unix_s=now,
        )
        if self.db_error:
            raise InvalidStateError(self._db_refusal(self.db_error))
        try:
            rec.id = await self._in_db(self._registry.insert, rec)
        except RegistryWriteError as exc:
            raise InvalidStateError(self._db_refusal(str(exc))) from None
        self.records[rec.id] = rec
        log.info("task %s submitted: %s (%s)", rec.id, spec.name, spec.ref)
        await self._start_worker(rec)
        return rec

    def _db_refusal(self, error: str) -> str:
        return (f"the state database cannot be written ({error}); free space or fix {self.config.state_dir}, "
                "then submit again (running tasks and their harvest are kept)")

    async def pause(self, task_id: str) -> TaskRecord:
        rec = self.get(task_id)
        if rec.state is TaskState.PAUSED:
            return rec
        if rec.state.terminal:
            raise InvalidStateError(f"task {task_id} is {rec.state.value}; only a live task can be paused")
        self._stop_worker(rec, TaskState.PAUSED)
        self._set_state(rec, TaskState.PAUSED, "paused by user")
        return rec

    async def cancel(self, task_id: str) -> TaskRecord:
        rec = self.get(task_id)
        if rec.state.terminal:
            raise InvalidStateError(f"task {task_id} is already {rec.state.value}")
        self._stop_worker(rec, TaskState.CANCELLED)
        self._set_state(rec, TaskState.CANCELLED, "cancelled by user")
        return rec

    async def resume(self, task_id: str) -> TaskRecord:
        rec = self.get(task_id)
        if rec.state is not TaskState.PAUSED:
            raise InvalidStateError(f"task {task_id} is {rec.state.value}; only a PAUSED task can be resumed")
        worker = self.workers.get(task_id)
        if worker is not None:  # still checkpointing after the pause
            await asyncio.wait_for(worker.exited.wait(), timeout=self.config.shutdown_grace_s + 5)
        self._set_state(rec, TaskState.SUBMITTED, "resumed by user")
        await self._start_worker(rec)
        return rec

    def _stop_worker(self, rec: TaskRecord, desired: TaskState) -> None:
        worker = self.workers.get(rec.id)
        if worker is None:
            return
        self._desired[rec.id] = desired
        action = worker_pb2.CONTROL_ACTION_PAUSE if desired is TaskState.PAUSED else worker_pb2.CONTROL_ACTION_CANCEL
        if not self._send_control(rec.id, action):
            worker.kill(f"{desired.value.lower()} before it attached")

    def _send_control(self, task_id: str, action: worker_pb2.ControlAction) -> bool:
        outbox = self._outboxes.get(task_id)
        if outbox is None:
            return False
        outbox.put_nowait(worker_pb2.AgentCommand(control=worker_pb2.Control(action=action)))
        return True

    def stats(self) -> tasks_pb2.StatsResponse:
        g = self.scheduler.gpu
        delays = self.scheduler.event_delays_ns
        return tasks_pb2.StatsResponse(
            gpu=tasks_pb2.GpuStats(
                gpu=self.config.gpu,
                bubbles=g.bubbles,
                bubble_s=g.bubble_ns / 1e9,
                harvested_s=g.harvested_ns / 1e9,
                overrun_s=g.overrun_ns / 1e9,
                overrun_steps=g.overrun_steps,
                steps=g.steps,
                windows=g.windows,
                windows_granted=self.scheduler.windows_granted,
                events=g.events,
                prediction_error_p50=percentile(self.scheduler.prediction_errors, 0.5),
                uptime_s=(self._clock() - self.started_ns) / 1e9,
                dropped_events=self.dropped_events,
                rejected_events=self.rejected_events,
                trainer_free_memory_bytes=self.scheduler.trainer_free_memory_bytes,
                trainers=self.trainers,
                event_delay_us_p50=percentile(delays, 0.5) / 1e3,
                event_delay_us_p99=percentile(delays, 0.99) / 1e3,
                memory=self.gpu_memory(),
            ),
            tasks=[self.info(r) for r in self.records.values()],
        )

    def gpu_memory(self) -> tasks_pb2.GpuMemory:
        return self.memory.telemetry([w.pid for w in self.workers.values()],
                                     self.scheduler.trainer_free_memory_bytes, len(self._waiting))

    def timeline(self, since_ns: int) -> tasks_pb2.TimelineResponse:
        bubbles, windows = self.scheduler.timeline(since_ns)
        named = {share.task_id for w in windows for share in w.shares}
        return tasks_pb2.TimelineResponse(
            gpu=self.config.gpu, now_ns=self._clock(), bubbles=bubbles, windows=windows,
            tasks=[self.info(self.records[i]) for i in sorted(named) if i in self.records],
        )

    # -- trainer side ----------------------------------------------------------------------------
    def on_bubble(self, ev: trainer_pb2.BubbleEvent) -> None:
        hint = self.scheduler.trainer_free_memory_bytes
        self.scheduler.on_bubble(ev)
        if self._waiting and self.scheduler.trainer_free_memory_bytes != hint:
            self._admit_waiting()

    def _on_account(self, record: tasks_pb2.WindowRecord, per_task: dict[str, Counters], total: Counters) -> None:
        for task_id, c in per_task.items():
            rec = self.records.get(task_id)
            if rec is not None:
                rec.counters.add(c)
        self.recent_windows.append(record)
        self._mark_dirty(set(per_task), ledger=True)
        if self._subscribers:
            self._publish(tasks_pb2.AgentEvent(time_ns=self._clock(), window=record))

    def _on_hang(self, task_id: str, window_id: int) -> None:
        worker = self.workers.get(task_id)
        if worker is not None:
            log.warning("task %s: step still running long after window %d closed; killing it", task_id, window_id)
            worker.kill("a step hung past its window and was killed")

    # -- workers ---------------------------------------------------------------------------------
    async def _start_worker(self, rec: TaskRecord, reason: str = "") -> None:
        if self.shutting_down or rec.state.terminal or rec.state is TaskState.PAUSED or rec.id in self.workers:
            return
        if not self._admit(rec, reason):
            return
        self._set_state(rec, TaskState.STARTING, reason)
        self._instance += 1
        env = self.memory.client_env(rec.spec.mem_limit_bytes, rec.spec.no_mps)
        worker = await self._launcher.spawn(rec.id, self._instance, self._on_worker_exit, env=env)
        self.workers[rec.id] = worker
        rec.pid = worker.pid
        if self.memory.client_started(worker.pid, rec.spec.no_mps):
            worker.before_kill = self.memory.terminate_client

    def attach(
        self, task_id: str, instance: int, outbox: asyncio.Queue[worker_pb2.AgentCommand | None]
    ) -> worker_pb2.WorkerSetup:
        worker = self.workers.get(task_id)
        if worker is None or worker.instance != instance:
            raise InvalidStateError(f"no worker instance {instance} is expected for task {task_id}")
        rec = self.records[task_id]
        self._outboxes[task_id] = outbox
        desired = self._desired.get(task_id)
        if desired is not None:
            self._send_control(task_id, worker_pb2.CONTROL_ACTION_PAUSE)
        return worker_pb2.WorkerSetup(
            task_ref=rec.spec.ref,
            args=rec.spec.args,
            checkpoint_path=str(self.ckpt_dir / f"task-{task_id}.ckpt"),
            checkpoint_interval_s=rec.spec.checkpoint_interval_s or self.config.checkpoint_interval_s,
            mem_limit_bytes=rec.spec.mem_limit_bytes,
            window_file=str(worker.window.path),
        )

    def detach(self, task_id: str, instance: int) -> None:
        worker = self.workers.get(task_id)
        if worker is not None and worker.instance == instance:
            self._outboxes.pop(task_id, None)
            self.scheduler.remove_task(task_id)

    def on_worker_message(self, task_id: str, instance: int, msg: worker_pb2.WorkerMessage) -> None:
        worker = self.workers.get(task_id)
        if worker is None or worker.instance != instance:
            return
        rec = self.records[task_id]
        which = msg.WhichOneof("body")
        if which == "steps":
            self.scheduler.on_steps(task_id, msg.steps)
            if msg.steps.progress:
                rec.progress.update(msg.steps.progress)
            rec.peak_memory_bytes = max(rec.peak_memory_bytes, msg.steps.peak_memory_bytes)
        elif which == "window_done":
            self.scheduler.on_window_done(task_id, msg.window_done)
            if msg.window_done.step_estimate_ns:
                rec.step_estimate_ns = msg.window_done.step_estimate_ns
        elif which == "ready":
            rec.kind = msg.ready.kind
            rec.progress.update(msg.ready.progress)
            # The checkpoint it resumed from: after a kill -9 of the agent, the worker's last checkpoint
            # (taken when it lost the agent) never reached the ledger as a Checkpointed message.
            rec.checkpoint_steps = msg.ready.resumed_steps
            if rec.state is TaskState.STARTING:
                # Keep why this worker was (re)started visible: a crash, an agent restart.
                self._set_state(rec, TaskState.READY, rec.reason)
                self.scheduler.add_task(
                    TaskSlot(
                        task_id=task_id,
                        priority=rec.spec.priority,
                        port=worker.window,
                        counters=rec.counters,
                        step_estimate_ns=rec.step_estimate_ns or None,
                    )
                )
        elif which == "checkpointed":
            rec.checkpoint_steps = msg.checkpointed.steps
            rec.progress.update(msg.checkpointed.progress)
            self._mark_dirty({task_id}, ledger=False)
        elif which == "finished":
            rec.progress.update(msg.finished.progress)
            self.scheduler.remove_task(task_id)
            if not rec.state.terminal:
                self._set_state(rec, TaskState.DONE)
        elif which == "failed":
            worker.failure = msg.failed.reason
            worker.retryable = msg.failed.retryable

    def _on_worker_exit(self, worker: WorkerProcess, code: int) -> None:
        if self.workers.get(worker.task_id) is not worker:
            return
        del self.workers[worker.task_id]
        self.memory.forget(worker.task_id)
        self._outboxes.pop(worker.task_id, None)
        self.scheduler.remove_task(worker.task_id)
        rec = self.records[worker.task_id]
        rec.pid = 0
        rec.memory_bytes = 0
        desired = self._desired.pop(worker.task_id, None)
        log.info("task %s: %s", rec.id, describe_exit(code))
        if self._waiting:
            self._loop.call_soon(self._admit_waiting)  # after this exit's own state change
        if self.shutting_down or rec.state.terminal or rec.state is TaskState.PAUSED:
            return
        if desired is not None:
            self._set_state(rec, desired)
            return
        reason = worker.kill_reason or worker.failure or describe_exit(code)
        tail = last_log_line(worker.log_path) if not (worker.failure or worker.kill_reason) else ""
        if tail and tail not in reason:
            reason = f"{reason}: {tail}"
        limit = rec.spec.max_restarts if rec.spec.max_restarts >= 0 else self.config.max_restarts
        if not worker.retryable:
            self._set_state(rec, TaskState.FAILED, reason)
            return
        rec.restarts += 1
        if rec.restarts > limit:
            self._set_state(rec, TaskState.FAILED, f"{reason} (gave up after {limit} restarts; log: {worker.log_path})")
            return
        delay = self.config.restart_backoff_s * 2 ** (rec.restarts - 1)
        self._set_state(rec, TaskState.STARTING, f"restart {rec.restarts}/{limit} in {delay:.1f}s after: {reason}")
        self._loop.call_later(delay, lambda: self._loop.create_task(self._restart(rec)))

    async def _restart(self, rec: TaskRecord) -> None:
        if rec.state is TaskState.STARTING and rec.id not in self.workers:
            await self._start_worker(rec, rec.reason)


def _validate(spec: TaskSpec) -> None:
    if not spec.ref.strip():
        raise InvalidSpecError("the task reference is empty: give 'package.module:Class' or 'file.py:Class'")
    if len(spec.name) > 128:
        raise InvalidSpecError("task name is longer than 128 characters")
    if not 0 <= spec.priority <= 100:
        raise InvalidSpecError(f"priority must be between 0 and 100, got {spec.priority}")
    if not 0 <= spec.mem_limit_bytes <= _MAX_MEM_BYTES:
        raise InvalidSpecError(f"memory limit must be between 0 and 1 PiB, got {spec.mem_limit_bytes} bytes")
    if not -1 <= spec.max_restarts <= 1000:
        raise InvalidSpecError(f"max_restarts must be between -1 (agent default) and 1000, got {spec.max_restarts}")
    if not 0 <= spec.checkpoint_interval_s <= 86400 * 7:
        raise InvalidSpecError(f"checkpoint interval must be between 0 and 7 days, got {spec.checkpoint_interval_s}")
    for key in spec.args:
        if not _ARG_KEY.match(key):
            raise InvalidSpecError(f"argument name {key!r} is not a Python identifier")


async def _check_ref(spec: TaskSpec) -> dict[str, Any]:
    """Validate the reference in a throwaway process: user code never runs inside the agent."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "freeride.sdk.check",
        spec.ref,
        *(f"{k}={v}" for k, v in spec.args.items()),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=_CHECK_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise TaskRefError(
            f"importing {spec.ref!r} took over {_CHECK_TIMEOUT_S:.0f}s; make the import cheaper"
        ) from None
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        detail = err.decode(errors="replace").strip().splitlines()
        raise TaskRefError(f"checking {spec.ref!r} failed: {detail[-1] if detail else 'no output'}") from None
    if not result.get("ok"):
        raise TaskRefError(str(result.get("error")))
    return result
