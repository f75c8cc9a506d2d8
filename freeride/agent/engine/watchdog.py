"""The memory watchdog: every --memory-check-s, each worker's memory against its cap, on a thread of its own.

A worker above its cap is stopped (a crash, restarted while the task has --memory-cap-restarts left);
training and other tasks are not touched. The reads block for milliseconds (each worker's memory, its
process tree): they run on the watchdog's thread (`Offload`, freeride.agent.engine.offload), and only their
results are applied on the loop, to the workers still alive. At most one check is in flight: the next
is set once the previous one has ended; a failed check is logged and retried at the next interval.
While a task waits for a full disk, the same tick reads the state disk's free space (freeride.agent.engine.space).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol, TypeVar

from freeride.agent.config import WorkerConfig
from freeride.agent.control.scheduler import Scheduler
from freeride.agent.domain.background import Background
from freeride.agent.domain.timers import CallLater, TimerHandle
from freeride.agent.engine.memory import MemoryGuard
from freeride.agent.engine.offload import Offload
from freeride.agent.engine.space import SpaceWatch
from freeride.agent.engine.tasks import TaskTable

log = logging.getLogger("freeride.agent")

T = TypeVar("T")


class TreeScan(Protocol):
    """A watchdog tick's scan of the workers' process trees (freeride.agent.procs.workers.TreeScan)."""

    def read(self) -> None:
        """Blocking, in the watchdog's thread: look at the trees."""

    def apply(self) -> None:
        """On the loop: write down what was found (a worker gone meanwhile is skipped)."""


class MemoryWatchdog:
    def __init__(self, workers: WorkerConfig, table: TaskTable, memory: MemoryGuard, scheduler: Scheduler,
                 tracking: Callable[[], TreeScan], admit: Callable[[Callable[[], int | None]], None],
                 call_later: CallLater, offload: Offload, space: SpaceWatch | None = None,
                 memory_cap_restarts: int = 0) -> None:
        """`tracking`: a new scan of the workers' trees per tick; `admit(usable)`: start the waiting tasks that
        fit the budget just measured (the device's free memory may have grown without any event); `space`: the
        state disk's free space, read on the same tick while a task waits for it (it too grows without an event);
        `memory_cap_restarts`: restarts after memory_cap_exceeded before FAILED (--memory-cap-restarts)."""
        self._cfg = workers
        self._memory_cap_restarts = memory_cap_restarts
        self._table = table
        self._memory = memory
        self._scheduler = scheduler
        self._tracking = tracking
        self._admit = admit
        self._call_later = call_later
        self._offload = offload
        self._space = space
        self._timer: TimerHandle | None = None  # the next check (set once the previous one ended)
        self._checks = Background("memory watchdog")  # the check in flight (one at most)
        self._stopped = False

    def watch(self) -> None:
        """Check every --memory-check-s; the next check is set once the previous one has ended, so two
        samples are never in flight."""
        self._timer = self._call_later(self._cfg.memory_check_s, self._check_soon)

    def stop(self) -> None:
        """No check from now on; one in flight ends (`watched`) and is not applied."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()

    def close(self) -> None:
        """Once no check is in flight: release the thread."""
        self._offload.close()

    async def off_loop(self, fn: Callable[[], T]) -> T:
        """`fn()` on the watchdog's thread (after the reads queued before it); on the loop once that is closed."""
        if self._stopped:
            return fn()
        return await self._offload.run(fn)

    def _check_soon(self) -> None:
        self._timer = None
        self._checks.spawn(self._check_then_watch())

    async def _check_then_watch(self) -> None:
        try:
            await self.check()
        finally:
            if not self._stopped:
                self.watch()

    async def watched(self) -> None:
        """Until the check in flight (if any) has ended and been applied."""
        await self._checks.wait()

    async def check(self) -> None:
        """A worker above its cap is stopped; training and other tasks are not touched. The reads run on the
        watchdog's thread; what they found is applied here, to the workers still alive."""
        if self._stopped:
            return
        try:
            await self._check_caps()
        except Exception:  # the watchdog never stops watching
            log.exception("memory watchdog: the check failed; checking again in %.2fs", self._cfg.memory_check_s)

    async def _check_caps(self) -> None:
        live = {task_id: rt.worker for task_id, rt in self._table.live.items() if rt.worker is not None}
        pids = {task_id: worker.pid for task_id, worker in live.items()}
        scan = self._tracking()  # (the same tick writes down what each uncontained worker's tree holds)
        trainer_free = self._scheduler.trainer_free_memory_bytes
        admitting = self._table.waiting_count() > 0  # the device's free memory may have grown without any event
        space = self._space if self._space is not None and self._space.wanted() else None

        def read() -> tuple[dict[str, int], int | None, int | None]:  # in the watchdog's thread, not the loop's
            sampled = self._memory.sample(pids)
            scan.read()
            usable = self._memory.usable_bytes(pids.values(), trainer_free) if admitting else None
            return sampled, usable, space.read() if space is not None else None

        sampled, usable, free = await self._offload.run(read)
        if self._stopped:
            return
        if space is not None:
            space.apply(free)
        scan.apply()
        for task_id, used in sampled.items():
            worker, rt = live[task_id], self._table.live.get(task_id)
            if rt is None or rt.worker is not worker or worker.exited.is_set():
                continue  # it exited while its sample was read
            rec = self._table.records[task_id]
            rt.memory_bytes = used
            rec.peak_memory_bytes = max(rec.peak_memory_bytes, used)
            cap = rec.spec.mem_limit_bytes
            if cap and used > cap and not worker.kill_reason:
                reason = f"memory_cap_exceeded: {used / 2**20:.0f} MiB in use, cap {cap / 2**20:.0f} MiB"
                log.warning("task %s: %s; stopping its worker", task_id, reason)
                worker.retryable = rec.restarts < self._memory_cap_restarts
                worker.kill(reason)
        if admitting and self._table.waiting_count():
            self._admit(lambda: usable)
