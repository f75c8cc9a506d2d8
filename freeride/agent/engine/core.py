"""The agent: one GPU's side tasks, behind the calls the servicers make.

A thin front over the engine, all on one asyncio loop (nothing here waits on a worker or a client,
and nothing needs a lock: the other threads, the database writer and the memory watchdog's reads,
hand their results back to the loop, which alone applies them):

  tasks.py       the task table: every record, and each live task's runtime
  supervisor.py  memory admission, worker start, restart and stop, the memory watchdog
  scheduler.py   bubble edges in, windows granted and revoked, harvest accounted
  store.py       write-behind persistence of the records and the harvest ledger
  pubsub.py      live-view events for the Watch RPC

Calls take and return domain objects (model.py, events.py, views.py); the servicers convert.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Mapping

from freeride.agent.config import AgentConfig
from freeride.agent.control.scheduler import Scheduler, SchedulerConfig
from freeride.agent.control.training import TrainingTime
from freeride.agent.domain.events import (
    Edge,
    TaskChanged,
    TaskView,
    TrainerChanged,
    TrainerDeclaration,
    WindowAccounted,
    WindowRecord,
    WorkerMessage,
    WorkerSetup,
)
from freeride.agent.domain.model import Counters, TaskRecord, TaskSpec, TaskState
from freeride.agent.domain.timers import TimerHandle
from freeride.agent.domain.trainers import RankClaims, RingPort, TrainerStream
from freeride.agent.domain.views import GpuMemory, GpuStats, History, Stats
from freeride.agent.engine.interpreter import pinned_python
from freeride.agent.engine.memory import MemoryGuard
from freeride.agent.engine.pubsub import Hub
from freeride.agent.engine.refcheck import RefChecks, pinned_ref, with_checked
from freeride.agent.engine.retention import Removal, Retention
from freeride.agent.engine.supervisor import Launcher, Supervisor
from freeride.agent.engine.tasks import Change, Outbox, TaskTable, copy_record
from freeride.agent.engine.validation import check_spec
from freeride.agent.procs.task_logs import TaskLogs
from freeride.agent.state.store import Database, Store
from freeride.core.private import private_dir
from freeride.core.stats import percentile
from freeride.errors import InvalidStateError, TaskNotFoundError
from freeride.gpu import MemoryProbe
from freeride.gpu.control import GpuControl, cpu_only

log = logging.getLogger("freeride.agent")

_MAX_DECLARED = 1024  # ranks whose hello is kept


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
        self.memory = MemoryGuard(gpu, memory if memory is not None else gpu.probe, config.headroom_bytes)
        self._loop = asyncio.get_running_loop()
        self.events = Hub()
        self.table = TaskTable(self._changed)
        self.streams: list[TrainerStream] = []  # one per trainer stream open now
        self._rings: dict[int, RingPort] = {}  # the attached rings, by id() of their stream
        # Each rank's last hello, kept after its stream ends so that `freeride profile` of a finished job
        # knows the schedule of the bubbles still in the history (bounded: the oldest rank is forgotten).
        self.declared: OrderedDict[int, TrainerDeclaration] = OrderedDict()
        self._ranks = RankClaims()  # which of them reports each rank
        # Whether the trainers' rings wake the agent per edge: only while the edges can lead to a grant (a task
        # could take a window or holds one) or to an admission (a task waits for the trainer's free memory).
        # Else the agent is quiet: the edges wait in the rings for the profile (see freeride.agent.edge.ring).
        self.listening = False
        self.rejected_events = 0  # bubble edges refused at the edge (counted by the servicer)
        self.started_ns = clock()
        self.training = TrainingTime(clock)  # time with a trainer stream open, into the ledger
        self.scheduler = Scheduler(
            clock,
            self._call_at,
            SchedulerConfig(
                margin_ns=int(config.margin_ms * 1e6),
                hang_timeout_ns=int(config.hang_timeout_s * 1e9),
            ),
            on_account=self._on_account,
            on_hang=lambda task_id, window_id: self.supervisor.hang(task_id, window_id),
            on_fit=lambda task_id, estimate_ns, longest_ns: self.supervisor.fit(task_id, estimate_ns, longest_ns),
            on_demand=lambda wanted: self._listen(wanted or self._admission_waits()),
        )
        self.store = Store(registry, config.gpu, config.state_dir, self.table.snapshot,
                           lambda: dataclasses.replace(self.training.fold(self.scheduler.gpu)))
        self.supervisor = Supervisor(config, self.table, self.memory, launcher, self.scheduler)
        # the submits' reference checks, at the workers' placement, killed at shutdown
        self.checks = RefChecks(config.check_timeout_s, placement_env=check_env)
        self.retention = Retention(self.table, self.store, config.state_dir, config.retention_s, self._loop.call_later,
                                   on_freed=self.supervisor.disk_freed)
        self._loaded = False  # the state was read: from then on, the final write must happen
        self._exit_code: int | None = None

    def _call_at(self, when_ns: int, fn: Callable[[], None]) -> TimerHandle:
        # asyncio's clock is time.monotonic, the same CLOCK_MONOTONIC the trainer stamps events with.
        return self._loop.call_at(when_ns / 1e9, fn)

    def _listen(self, wanted: bool) -> None:
        """Wake per edge from now (True) or be quiet (False); each ring reads what it holds on the way."""
        if wanted == self.listening:
            return
        self.listening = wanted
        for ring in list(self._rings.values()):
            ring.listen(wanted)

    def _read_rings(self) -> None:
        """Take what the trainers wrote and the agent has not read yet (a quiet agent reads late)."""
        for ring in list(self._rings.values()):
            ring.pump()

    def _admission_waits(self) -> bool:
        """A task waits for memory or a worker slot: the trainer's free-memory hint (START edges) may admit it."""
        return self.table.waiting_count() > 0

    def _relisten(self) -> None:
        self._listen(self.scheduler.wants_edges or self._admission_waits())

    def _changed(self, rec: TaskRecord, change: Change) -> None:
        if (wanted := self.scheduler.wants_edges or self._admission_waits()) != self.listening:
            # Quiet at once (nothing is read), before the change is published; listening the next turn: the
            # rings are read first, and that would nest in a state change.
            if wanted:
                self._loop.call_soon(self._relisten)
            else:
                self._listen(False)
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
        return rec

    async def cancel(self, task_id: str) -> TaskRecord:
        rec = self.get(task_id)
        if rec.state.terminal:
            raise InvalidStateError(f"task {task_id} is already {rec.state.value}")
        self.supervisor.stop(rec, TaskState.CANCELLED)
        self.table.set_state(rec, TaskState.CANCELLED, "cancelled by user")
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
        return rec

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
        self._read_rings()  # edges written before the call count in its answer
        memory = self.memory.telemetry(read, self.scheduler.trainer_free_memory_bytes, self.table.reserved_bytes,
                                       self.table.waiting_count())
        return Stats(_gpu_stats(self, memory), [self.info(r) for r in self.table.records.values()])

    def history(self, since_ns: int) -> History:
        self._read_rings()  # the bubbles written before the call are in its answer
        bubbles, windows = self.scheduler.history(since_ns)
        named = {share.task_id for w in windows for share in w.shares}
        tasks = [self.info(self.table.records[i]) for i in sorted(named) if i in self.table.records]
        return History(self.config.gpu, self.clock(), bubbles, windows, tasks, list(self.declared.values()))

    # -- trainers --------------------------------------------------------------------------------
    def trainer_opened(self, stream: TrainerStream) -> None:
        """Keep the stream's record and say so to watchers (`top`, tests): no poll needed to see one come."""
        self.streams.append(stream)
        self.training.opened()
        self.events.publish(TrainerChanged(self.clock(), True, stream.peer, len(self.streams), stream.path))

    def trainer_declared(self, declaration: TrainerDeclaration) -> None:
        """A rank said hello: keep what it declared of its pipeline (the newest hello of a rank wins)."""
        self.declared.pop(declaration.rank, None)
        self.declared[declaration.rank] = declaration
        if len(self.declared) > _MAX_DECLARED:
            self.declared.popitem(last=False)

    def trainer_hello(self, stream: TrainerStream) -> str:
        """The stream said who it is: "" when its rank is its own now, else why it is refused."""
        return self._ranks.claim(stream)

    def trainer_moved(self, stream: TrainerStream, ring: RingPort) -> None:
        """The stream's edges changed road: its ring was attached, which the agent reads and wakes from now."""
        self._rings[id(stream)] = ring
        self.events.publish(TrainerChanged(self.clock(), True, stream.peer, len(self.streams), stream.path))

    def trainer_ring_closing(self, stream: TrainerStream) -> None:
        """The stream's ring is being closed: no more reads or wake-ups of it from here."""
        self._rings.pop(id(stream), None)

    def trainer_closed(self, stream: TrainerStream) -> None:
        self._rings.pop(id(stream), None)
        self._ranks.release(stream)
        self.streams.remove(stream)
        self.training.closed(self.scheduler.gpu)
        self.store.mark_dirty(set(), ledger=True)
        self.events.publish(TrainerChanged(self.clock(), False, stream.peer, len(self.streams), stream.path))

    def on_bubble(self, edge: Edge) -> None:
        hint = self.scheduler.trainer_free_memory_bytes
        self.scheduler.on_bubble(edge)
        if self.scheduler.trainer_free_memory_bytes != hint and self.table.waiting_count():
            self.supervisor.admit_waiting()

    def trainer_gone(self, rank: int) -> None:
        self.scheduler.trainer_gone(rank)

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
    s, g = agent.scheduler, agent.training.fold(agent.scheduler.gpu)
    return GpuStats(
        gpu=agent.config.gpu, bubbles=g.bubbles, bubble_ns=g.bubble_ns, harvested_ns=g.harvested_ns,
        overrun_ns=g.overrun_ns, overrun_steps=g.overrun_steps, steps=g.steps, windows=g.windows,
        windows_granted=s.windows_granted, events=g.events,
        prediction_error_p50=percentile(s.prediction_errors, 0.5), uptime_ns=agent.clock() - agent.started_ns,
        dropped_events=agent.events.dropped, rejected_events=agent.rejected_events,
        trainer_free_memory_bytes=s.trainer_free_memory_bytes, trainers=len(agent.streams),
        trainer_streams=tuple(dataclasses.replace(t) for t in agent.streams),
        event_delay_ns_p50=percentile(s.event_delays_ns, 0.5),
        event_delay_ns_p99=percentile(s.event_delays_ns, 0.99), memory=memory, training_ns=g.training_ns,
    )
