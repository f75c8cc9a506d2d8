"""Fakes for driving the agent's engine in-process: manual timers, a launcher of fake workers, a memory probe.

Nothing here sleeps: time moves when a test fires a timer, a worker exits when a test says so.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from freeride.agent.config import AgentConfig
from freeride.agent.control.scheduler import Scheduler, SchedulerConfig
from freeride.agent.domain.model import TaskRecord, TaskSpec, TaskState
from freeride.agent.engine.memory import MemoryGuard
from freeride.agent.engine.offload import Offload
from freeride.agent.engine.supervisor import Supervisor
from freeride.agent.engine.tasks import Change, TaskTable
from freeride.gpu.control import cpu_only

MiB = 2**20
T = TypeVar("T")


def in_loop(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test on a fresh event loop (the engine needs a running loop; no plugin needed)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return run


@dataclass
class Timer:
    at: float
    fn: Callable[[], None]
    cancelled: bool = False
    fired: bool = False

    def cancel(self) -> None:
        self.cancelled = True

    @property
    def pending(self) -> bool:
        return not (self.cancelled or self.fired)


class ManualTimers:
    """call_later that only records; a test fires what is due by hand."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[Timer] = []

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Timer:
        t = Timer(self.now + delay_s, fn)
        self.timers.append(t)
        return t

    def pending(self) -> list[Timer]:
        return [t for t in self.timers if t.pending]

    def fire_next(self) -> Timer:
        t = min(self.pending(), key=lambda t: t.at)
        self.now = max(self.now, t.at)
        t.fired = True
        t.fn()
        return t


@dataclass
class FakeWindow:
    calls: list[tuple[object, ...]] = field(default_factory=list)

    def grant(self, window_id: int, until_ns: int) -> None:
        self.calls.append(("grant", window_id, until_ns))

    def revoke(self, window_id: int, until_ns: int) -> None:
        self.calls.append(("revoke", window_id, until_ns))


_pids = itertools.count(40_000)


@dataclass
class FakeWorker:
    task_id: str
    instance: int
    on_exit: Callable[[Any, int], None]
    pid: int = field(default_factory=lambda: next(_pids))
    log_path: Path = Path("/nonexistent/task.log")
    window: FakeWindow = field(default_factory=FakeWindow)
    kill_reason: str = ""
    failure: str = ""
    retryable: bool = True
    before_kill: Callable[[int], Awaitable[None]] | None = None
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    kills: list[str] = field(default_factory=list)
    killed: asyncio.Event = field(default_factory=asyncio.Event)

    def kill(self, reason: str) -> None:
        """Recorded; the process 'dies' only when the test calls exit()."""
        if not self.kill_reason:
            self.kill_reason = reason
        self.kills.append(reason)
        self.killed.set()

    def exit(self, code: int) -> None:
        self.exited.set()
        self.on_exit(self, code)


class FakeLauncher:
    def __init__(self) -> None:
        self.workers: list[FakeWorker] = []
        self.fail: Exception | None = None  # raised by the next spawn
        self.gate: asyncio.Event | None = None  # when given: spawn waits for it (a spawn in flight)
        self.spawning = asyncio.Event()  # set once a spawn waits at the gate
        self.scans: list[FakeScan] = []  # one per watchdog tick: its look at the workers' process trees

    async def spawn(self, task_id: str, instance: int, on_exit: Callable[[Any, int], None],
                    env: dict[str, str] | None = None, python: str = "") -> FakeWorker:
        if self.gate is not None:
            self.spawning.set()
            await self.gate.wait()
        if self.fail is not None:
            exc, self.fail = self.fail, None
            raise exc
        worker = FakeWorker(task_id, instance, on_exit)
        self.workers.append(worker)
        return worker

    async def settle(self) -> None:
        pass

    def tracking(self) -> FakeScan:
        self.scans.append(FakeScan())
        return self.scans[-1]

    def of(self, task_id: str) -> list[FakeWorker]:
        return [w for w in self.workers if w.task_id == task_id]


@dataclass
class FakeScan:
    """Records where each half of a tree scan ran: the read off the loop, the apply on it."""

    read_in: str = ""  # the thread's name
    applied_in: str = ""

    def read(self) -> None:
        self.read_in = threading.current_thread().name

    def apply(self) -> None:
        self.applied_in = threading.current_thread().name


class InlineOffload:
    """Runs the watchdog's reads on the loop itself, at once: a check is over when its await returns."""

    closed = False

    async def run(self, fn: Callable[[], T]) -> T:
        return fn()

    def close(self) -> None:
        self.closed = True


class FakeProbe:
    """Memory per pid, as a test sets it."""

    def __init__(self) -> None:
        self.bytes: dict[int, int] = {}

    def usage(self, pids: list[int]) -> dict[int, int]:
        return {p: self.bytes[p] for p in pids if p in self.bytes}


class Rig:
    """A supervisor with its task table and scheduler, a fake launcher and probe, and manual timers."""

    def __init__(self, state_dir: Path, offload: Offload | None = None, free_bytes: Callable[[], int] | None = None,
                 **config: Any) -> None:
        """`offload`: where the watchdog's reads run (default: inline, on the loop); `free_bytes()`: the state
        disk's free space (default: `state_dir`'s file system's)."""
        self.timers = ManualTimers()
        self.changes: list[tuple[str, TaskState, Change]] = []
        self.table = TaskTable(lambda rec, change: self.changes.append((rec.id, rec.state, change)))
        self.probe = FakeProbe()
        self.memory = MemoryGuard(cpu_only(), self.probe, headroom_bytes=0)
        self.launcher = FakeLauncher()
        self.hangs: list[tuple[str, int]] = []
        self.scheduler = Scheduler(lambda: 0, lambda at, fn: Timer(at, fn), SchedulerConfig(),
                                   on_account=lambda *a: None, on_hang=lambda *a: None)
        defaults: dict[str, Any] = {"state_dir": state_dir, "max_restarts": 3, "restart_backoff_s": 1.0}
        self.config = AgentConfig(**{**defaults, **config})
        self.sup = Supervisor(self.config.workers, self.config.state_dir, self.table, self.memory, self.launcher,
                              self.scheduler, call_later=self.timers.call_later, offload=offload or InlineOffload(),
                              free_bytes=free_bytes, memory_cap_restarts=self.config.memory_cap_restarts)
        self.streams = self.sup.streams  # what the workers say (their streams' messages)
        self.watchdog = self.sup.watchdog
        self._ids = itertools.count(1)

    def task(self, cap_bytes: int = 0, priority: int = 0, max_restarts: int = -1) -> TaskRecord:
        task_id = str(next(self._ids))
        rec = TaskRecord(task_id, TaskSpec(f"t{task_id}", "pkg.mod:Task", priority=priority,
                                           mem_limit_bytes=cap_bytes, max_restarts=max_restarts),
                         TaskState.SUBMITTED)
        self.table.records[task_id] = rec
        return rec

    def ask_stop(self, rec: TaskRecord, desired: TaskState, reason: str | None = None) -> None:
        """`freeride pause` or `cancel`, as the agent does it: the stop asked of the worker, then the new state."""
        self.sup.stop(rec, desired)
        self.table.set_state(rec, desired, f"{desired.value.lower()} by user" if reason is None else reason)

    def worker(self, rec: TaskRecord) -> FakeWorker:
        """The task's live worker."""
        w = self.table.worker(rec.id)
        assert isinstance(w, FakeWorker), f"task {rec.id} has no worker"
        return w
