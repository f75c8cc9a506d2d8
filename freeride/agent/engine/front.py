"""The agent: one GPU's side tasks, behind the calls the servicers make.

A thin front over the engine, all on one asyncio loop (nothing here waits on a worker or a client,
and nothing needs a lock: the other threads, the database writer and the memory watchdog's reads,
hand their results back to the loop, which alone applies them):

  engine/tasks.py         the task table: every record, and each live task's runtime
  engine/supervisor.py    memory admission, worker start, restart and stop, the memory watchdog
  engine/trainers.py      the trainers: their streams, rings, rank claims, hellos, counters and listening
  control/scheduler.py    bubble edges in, windows granted and revoked, harvest accounted
  state/store.py          write-behind persistence of the records and the harvest ledger
  engine/pubsub.py        live-view events for the Watch RPC

Calls take and return domain objects (domain/model.py, events.py, views.py); the servicers convert.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, field

from freeride.agent.config import AgentConfig
from freeride.agent.control.histogram import Histogram
from freeride.agent.control.scheduler import Scheduler, SchedulerConfig
from freeride.agent.domain.events import (
    TaskChanged,
    TaskView,
    WindowAccounted,
    WindowRecord,
    WorkerMessage,
    WorkerSetup,
)
from freeride.agent.domain.model import Counters, TaskRecord, TaskSpec, TaskState
from freeride.agent.domain.timers import TimerHandle
from freeride.agent.domain.views import GpuMemory, GpuStats, History, Stats
from freeride.agent.engine.interpreter import pinned_python
from freeride.agent.engine.memory import MemoryGuard
from freeride.agent.engine.pubsub import Hub
from freeride.agent.engine.refcheck import RefChecks, pinned_ref, with_checked
from freeride.agent.engine.retention import Removal, Retention
from freeride.agent.engine.supervisor import Launcher, Supervisor
from freeride.agent.engine.tasks import Change, Outbox, TaskTable, copy_record
from freeride.agent.engine.trainers import Trainers
from freeride.agent.engine.validation import check_spec
from freeride.agent.procs.task_logs import TaskLogs
from freeride.agent.state.store import Database, Store
from freeride.core.private import private_dir
from freeride.core.stats import percentile
from freeride.errors import InvalidStateError, TaskNotFoundError
from freeride.gpu import MemoryProbe
from freeride.gpu.control import GpuControl, cpu_only

log = logging.getLogger("freeride.agent")


@dataclass(frozen=True, slots=True)
class MetricsView:
    """What a /metrics scrape shows, copied on the agent's loop (freeride.agent.edge.metrics renders it in the
    HTTP server's thread): a Stats answer and what only the metrics report."""

    stats: Stats  # its task views hold copies of the records
    bubble_lengths: Histogram  # a copy of the scheduler's
    memory_bytes: dict[str, int] = field(default_factory=dict)  # current, per task with a live worker
    start_time_unix_s: float = 0.0
    disk_warn_percent: int = 90
    bubble_refused_ns: int = 0  # bubble time trainers claimed past the time that had passed (control.idle)


class _Later:
    """The store's and the scheduler's calls into the parts built on the scheduler (the supervisor, the trainers):
    set once those exist, before the loop runs anything that calls them."""

    supervisor: Supervisor
    trainers: Trainers

    def hang(self, task_id: str, window_id: int) -> None:
        self.supervisor.hang(task_id, window_id)

    def fit(self, task_id: str, estimate_ns: int, longest_ns: int) -> None:
        self.supervisor.fit(task_id, estimate_ns, longest_ns)

    def demand(self, wanted: bool) -> None:
        self.trainers.demand(wanted)

    def ledger(self) -> Counters:
        """A copy of the GPU's ledger, training time included, for the store to write."""
        return dataclasses.replace(self.trainers.ledger())


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        registry: Database,
        launcher: Launcher,
        clock: Callable[[], int] = time.monotonic_ns,
        memory: MemoryProbe | None = None,
        gpu: GpuControl | None = None,
        logs: TaskLogs | None = None,
        check_env: Mapping[str, str] | None = None,
    ) -> None:
        """`check_env`: the workers' placement (Placement.to_env()), which each submit's reference check takes too."""
        self.config = config
        self.task_logs = logs  # the workers' output (None: the Logs call is refused)
        self.clock = clock  # CLOCK_MONOTONIC in ns: the clock trainers stamp bubble edges with
        gpu = gpu if gpu is not None else cpu_only()
        self.memory = MemoryGuard(gpu, memory if memory is not None else gpu.probe, config.gpu_layer.headroom_bytes)
        self._loop = asyncio.get_running_loop()
        self.events = Hub()
        self.table = TaskTable(self._changed)
        later = _Later()  # the supervisor and the trainers are built on the scheduler, which calls them
        self.store = Store(registry, config.gpu, config.state_dir, self.table.snapshot, later.ledger)
        self.started_ns = clock()
        self.scheduler = Scheduler(
            clock,
            self._call_at,
            SchedulerConfig.of(config.workers),
            on_account=self._on_account,
            on_hang=later.hang,
            on_fit=later.fit,
            on_demand=later.demand,
        )
        self.supervisor = Supervisor(config.workers, config.state_dir, self.table, self.memory, launcher,
                                     self.scheduler, memory_cap_restarts=config.gpu_layer.memory_cap_restarts)
        self.trainers = Trainers(clock, self.events, self.scheduler, self.table, self.store,
                                 self.supervisor.admit_waiting, self._loop.call_soon)
        later.supervisor, later.trainers = self.supervisor, self.trainers
        # the submits' reference checks, at the workers' placement, killed at shutdown
        self.checks = RefChecks(config.workers.check_timeout_s, placement_env=check_env)
        self.retention = Retention(self.table, self.store, config.state_dir, config.state.retention_s,
                                   self._loop.call_later, on_freed=self.supervisor.disk_freed)
        self._loaded = False  # the state was read: from then on, the final write must happen
        self._exit_code: int | None = None

    def _call_at(self, when_ns: int, fn: Callable[[], None]) -> TimerHandle:
        # asyncio's clock is time.monotonic, the same CLOCK_MONOTONIC the trainer stamps events with.
        return self._loop.call_at(when_ns / 1e9, fn)

    def _changed(self, rec: TaskRecord, change: Change) -> None:
        self.trainers.task_changed()  # before the change is published: whether edges still matter
        if change is Change.STATE:
            self.store.write(rec.id)
            if self.task_logs is not None:
                self.task_logs.poke(rec.id)  # a follower of its log ends once it is over
        elif change is Change.REASON:
            self.store.mark_dirty({rec.id}, delay_s=0)
        elif change is Change.WORKER:
            pass  # nothing stored changed: the pid is the runtime's
        else:
            self.store.mark_dirty({rec.id})
            return
        if self.events:
            self.events.publish(TaskChanged(self.clock(), self.info(copy_record(rec))))

    def info(self, rec: TaskRecord) -> TaskView:
        slot = self.scheduler.tasks.get(rec.id)
        rt = self.table.live.get(rec.id)
        worker = rt.worker if rt is not None else None
        return TaskView(rec, slot is not None and slot.window_id != 0, worker.pid if worker is not None else 0,
                        (rt.memory_bytes or 0) if rt is not None and worker is not None else 0,
                        self.log_path(rec.id))

    # -- start and stop --------------------------------------------------------------------------
    async def start(self) -> None:
        private_dir(self.supervisor.checkpoint_dir)
        records, self.scheduler.gpu = await self.store.load()
        self.table.records.update((r.id, r) for r in records)
        self._loaded = True
        await self.retention.start()  # (finished tasks only: nothing below starts them)
        resumed = [r for r in records if r.state.active or r.state is TaskState.SUBMITTED]
        for rec in resumed:
            await self.supervisor.start(rec, reason="agent restarted" if rec.state.active else "")
        log.info("agent for GPU %d ready: %d tasks known, %d resumed", self.config.gpu, len(self.table.records),
                 len(resumed))
        self.supervisor.watch_memory()

    async def shutdown(self) -> int:
        """Checkpoint and stop every worker (within the grace period), then write the final state.
        0 once it is written; 1 if it could not be. A call after the first one ended returns its answer."""
        if self._exit_code is None:
            await self.retention.close()
            self.checks.close()
            self.store.hold()
            await self.supervisor.shutdown()
            if self._loaded:
                saved = await self.store.close(set(self.table.records))
            else:  # the start failed before the state was read: writing now would overwrite it
                self.store.abandon()
                saved = True
            self.memory.close()
            self._exit_code = 0 if saved else 1
        return self._exit_code

    # -- management API --------------------------------------------------------------------------
    def get(self, task_id: str) -> TaskRecord:
        rec = self.table.records.get(task_id)
        if rec is None:
            raise TaskNotFoundError(f"no task with id {task_id!r} on GPU {self.config.gpu} (see `freeride ls`)")
        return rec

    async def submit(self, spec: TaskSpec) -> TaskRecord:
        if self.supervisor.stopping:
            raise InvalidStateError("the agent is shutting down; submit again once it is back")
        check_spec(spec, self.memory.device_total_bytes())
        # what is checked is what every start loads and runs it
        spec = dataclasses.replace(spec, ref=pinned_ref(spec.ref), python=pinned_python(spec.python))
        checked = await self.checks.check(spec)
        spec = with_checked(spec, checked)
        now = time.time()
        rec = TaskRecord(
            id="", spec=spec, state=TaskState.SUBMITTED, kind=str(checked["kind"]),
            created_unix_s=now, updated_unix_s=now,
        )
        rec.id = await self.store.insert(rec)
        self.table.records[rec.id] = rec
        log.info("task %s submitted: %s (%s)", rec.id, spec.name, spec.ref)
        await self.supervisor.start(rec)
        return rec

    async def pause(self, task_id: str) -> TaskRecord:
        rec = self.get(task_id)
        if rec.state is TaskState.PAUSED:
            return rec
        if rec.state.terminal:
            raise InvalidStateError(f"task {task_id} is {rec.state.value}; only a live task can be paused")
        self.supervisor.stop(rec, TaskState.PAUSED)
        self.table.set_state(rec, TaskState.PAUSED, "paused by user")
        await self._written()
        return rec

    async def cancel(self, task_id: str) -> TaskRecord:
        rec = self.get(task_id)
        if rec.state.terminal:
            raise InvalidStateError(f"task {task_id} is already {rec.state.value}")
        self.supervisor.stop(rec, TaskState.CANCELLED)
        self.table.set_state(rec, TaskState.CANCELLED, "cancelled by user")
        await self._written()
        return rec

    async def resume(self, task_id: str) -> TaskRecord:
        rec = self.get(task_id)
        if rec.state is not TaskState.PAUSED:
            raise InvalidStateError(f"task {task_id} is {rec.state.value}; only a PAUSED task can be resumed")
        worker = self.table.worker(task_id)
        if worker is not None:  # still checkpointing after the pause
            await asyncio.wait_for(worker.exited.wait(), timeout=self.config.shutdown_grace_s + 5)
        self.table.set_state(rec, TaskState.SUBMITTED, "resumed by user")
        await self.supervisor.start(rec)
        await self._written()
        return rec

    async def _written(self) -> None:
        """The user's change is on disk before the answer says it is done: a kill -9 right after `freeride cancel`
        must not bring the task back READY. (A write that fails is kept and retried by the store, which says so.)"""
        await self.store.flush()

    async def delete(self, task_id: str) -> Removal:
        """Remove a finished task with its checkpoint and logs (`freeride rm`)."""
        return await self.retention.remove(self.get(task_id))

    async def prune(self, older_than_s: float, states: set[TaskState], dry_run: bool) -> Removal:
        """Remove the finished tasks (of `states`; empty: all) last changed over `older_than_s` ago."""
        if self.supervisor.stopping:
            raise InvalidStateError("the agent is shutting down; prune again once it is back")
        return await self.retention.prune(older_than_s, states, dry_run)

    def read_log(self, task_id: str, tail_lines: int = 0, follow: bool = False) -> AsyncGenerator[bytes, None]:
        """The task's output (the last `tail_lines` lines; 0: all), then with `follow` what it writes next,
        until it is DONE, FAILED, CANCELLED or PAUSED and its worker is gone."""
        self.get(task_id)
        if self.task_logs is None:
            raise InvalidStateError("this agent keeps no task logs")
        return self.task_logs.read(task_id, tail_lines, follow, lambda: self.table.over(task_id))

    def log_path(self, task_id: str) -> str:
        """Where the task's output is stored, absolute ("" when this agent keeps no task logs): a relative
        --state-dir means the agent's working directory, which the reader of `show` does not share."""
        return str(self.task_logs.path(task_id).absolute()) if self.task_logs is not None else ""

    async def stats(self) -> Stats:
        pids = [w.pid for w in self.table.workers()]  # their memory is read off the loop (PSS: ms a process)
        read = await self.supervisor.watchdog.off_loop(functools.partial(self.memory.read_snapshot, pids))
        self.trainers.read()  # edges written before the call count in its answer
        memory = self.memory.telemetry(read, self.scheduler.trainer_free_memory_bytes, self.table.reserved_bytes,
                                       self.table.waiting_count())
        return Stats(_gpu_stats(self, memory), [self.info(r) for r in self.table.records.values()])

    async def metrics(self) -> MetricsView:
        """A Stats answer and what only /metrics reports, all copies: the scrape renders them off the loop."""
        stats = await self.stats()
        return MetricsView(
            Stats(stats.gpu, [view._replace(record=copy_record(view.record)) for view in stats.tasks]),
            self.scheduler.bubble_lengths.copy(),
            memory_bytes={i: rt.memory_bytes for i, rt in self.table.live.items()
                          if rt.worker is not None and rt.memory_bytes is not None},
            start_time_unix_s=time.time() - stats.gpu.uptime_ns / 1e9,
            disk_warn_percent=self.config.disk_warn_percent,
            bubble_refused_ns=self.scheduler.idle.cut_ns,
        )

    def history(self, since_ns: int) -> History:
        self.trainers.read()  # the bubbles written before the call are in its answer
        bubbles, windows = self.scheduler.history(since_ns)
        named = {share.task_id for w in windows for share in w.shares}
        tasks = [self.info(self.table.records[i]) for i in sorted(named) if i in self.table.records]
        return History(self.config.gpu, self.clock(), bubbles, windows, tasks, self.trainers.declarations())

    # -- accounting ------------------------------------------------------------------------------
    def _on_account(self, record: WindowRecord, per_task: dict[str, Counters], total: Counters) -> None:
        for task_id, c in per_task.items():
            rec = self.table.records.get(task_id)
            if rec is not None:
                rec.counters.add(c)
        self.store.mark_dirty(set(per_task), ledger=True)
        if self.events:
            self.events.publish(WindowAccounted(self.clock(), record))

    # -- workers ---------------------------------------------------------------------------------
    def attach(self, task_id: str, instance: int, outbox: Outbox) -> WorkerSetup:
        return self.supervisor.streams.attach(task_id, instance, outbox)

    def detach(self, task_id: str, instance: int) -> None:
        self.supervisor.streams.detach(task_id, instance)

    def on_worker_message(self, task_id: str, instance: int, msg: WorkerMessage) -> None:
        self.supervisor.streams.on_worker_message(task_id, instance, msg)


def _gpu_stats(agent: Agent, memory: GpuMemory) -> GpuStats:
    """The GPU's half of a Stats answer, from the agent's parts (on its loop)."""
    s, t = agent.scheduler, agent.trainers
    g = t.ledger()
    return GpuStats(
        gpu=agent.config.gpu, bubbles=g.bubbles, bubble_ns=g.bubble_ns, harvested_ns=g.harvested_ns,
        overrun_ns=g.overrun_ns, overrun_steps=g.overrun_steps, steps=g.steps, windows=g.windows,
        windows_granted=s.windows_granted, events=g.events,
        prediction_error_p50=percentile(s.prediction_errors, 0.5), uptime_ns=agent.clock() - agent.started_ns,
        dropped_events=agent.events.dropped, rejected_events=t.rejected_events,
        trainer_free_memory_bytes=s.trainer_free_memory_bytes, trainers=len(t.streams),
        trainer_streams=t.stream_copies(),
        event_delay_ns_p50=percentile(s.event_delays_ns, 0.5),
        event_delay_ns_p99=percentile(s.event_delays_ns, 0.99), memory=memory, training_ns=g.training_ns,
    )
