"""Write-behind persistence of the task records and the GPU's harvest ledger.

Changes mark tasks dirty; a timer writes them in one transaction (a kill -9 loses at most
`_COUNTER_FLUSH_S` of accounting). Writes run on one database thread, in order, so the loop never
waits on the disk. A failed write (disk full) loses nothing: what it held is marked dirty again,
retried every `_DB_RETRY_S`, logged once and then every minute, and new submissions are refused
until a write succeeds. The final write on shutdown is retried a few times.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

from freeride.agent.domain.model import Counters, TaskRecord
from freeride.agent.domain.timers import CallLater, TimerHandle
from freeride.agent.state.registry import RegistryWriteError
from freeride.core.cpu import lower_this_thread
from freeride.errors import InvalidStateError

log = logging.getLogger("freeride.agent")

T = TypeVar("T")
_COUNTER_FLUSH_S = 0.1  # a kill -9 loses at most this much accounting
_DB_RETRY_S = 1.0  # while the state database cannot be written (disk full): retry this often
_DB_ERROR_LOG_EVERY_S = 60.0
_FINAL_WRITE_ATTEMPTS = 3



class Database(Protocol):
    """What the store needs of the registry (freeride.agent.state.registry.Registry); used from its thread only."""

    def load(self) -> list[TaskRecord]: ...
    def load_ledger(self, gpu: int) -> Counters: ...
    def insert(self, rec: TaskRecord) -> str: ...
    def save(self, recs: list[TaskRecord], gpu: int | None = None, gpu_counters: Counters | None = None) -> None: ...
    def delete(self, ids: list[str]) -> None: ...


class Store:
    def __init__(
        self,
        db: Database,
        gpu: int,
        state_dir: Path,
        snapshot: Callable[[set[str]], list[TaskRecord]],
        ledger: Callable[[], Counters],
        *,
        call_later: CallLater | None = None,
        clock: Callable[[], float] = time.monotonic,
        retry_s: float = _DB_RETRY_S,
    ) -> None:
        """`snapshot(ids)` copies those records and `ledger()` reads the GPU's counters, both on the loop."""
        self._db = db
        self._gpu = gpu
        self._state_dir = state_dir
        self._snapshot = snapshot
        self._ledger = ledger
        self._loop = asyncio.get_running_loop()
        self._call_later: CallLater = call_later or self._loop.call_later
        self._clock = clock
        self._retry_s = retry_s
        # Bursty (a submit burst, a prune) and awaited by no bubble edge: at nice 19, so training comes first.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="freeride-db",
                                          initializer=lower_this_thread)
        self._dirty: set[str] = set()
        self._ledger_dirty = False
        self._timer: TimerHandle | None = None
        self._holding = False  # stopping: the final write takes everything; no timer may outlive the thread
        self._closed = False  # the final write is done: nothing may be scheduled on the thread after
        self.error = ""  # why the state database cannot be written right now; empty when it can
        self._failures = 0
        self._error_logged_at: float | None = None

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._loop.run_in_executor(self._thread, fn, *args)

    async def load(self) -> tuple[list[TaskRecord], Counters]:
        return await self._run(self._db.load), await self._run(self._db.load_ledger, self._gpu)

    async def insert(self, rec: TaskRecord) -> str:
        """A new task's id; InvalidStateError (with what to do) while the database cannot be written."""
        if self.error:
            raise InvalidStateError(self._refusal(self.error))
        try:
            return await self._run(self._db.insert, rec)
        except RegistryWriteError as exc:
            raise InvalidStateError(self._refusal(str(exc))) from None

    async def delete(self, ids: list[str]) -> None:
        """Remove these tasks' rows, after every earlier write; InvalidStateError (with what to do) if it fails.
        The caller has dropped their records already, so no later write brings them back."""
        self._dirty.difference_update(ids)
        if self._closed:
            raise InvalidStateError("the agent is shutting down; remove the tasks once it is back")
        try:
            await self._run(self._db.delete, ids)
        except RegistryWriteError as exc:
            raise InvalidStateError(f"the state database cannot be written ({exc}); free space or fix "
                                    f"{self._state_dir}, then remove the tasks again") from None

    def _refusal(self, error: str) -> str:
        return (f"the state database cannot be written ({error}); free space or fix {self._state_dir}, "
                "then submit again (running tasks and their harvest are kept)")

    # -- writing ---------------------------------------------------------------------------------
    def mark_dirty(self, ids: set[str], ledger: bool = False, delay_s: float = _COUNTER_FLUSH_S) -> None:
        """Write these records (and the ledger) within `delay_s`, together with whatever else is dirty then."""
        self._dirty |= ids
        self._ledger_dirty |= ledger
        if self._holding:
            return
        if self._timer is None:
            delay_s = max(delay_s, self._retry_s) if self.error else delay_s
            self._timer = self._call_later(delay_s, self._on_timer)

    def write(self, task_id: str) -> asyncio.Future[bool]:
        """Write this record now (a state change), with everything else dirty."""
        self._dirty.add(task_id)
        return self.flush()

    def _on_timer(self) -> None:
        self._timer = None
        self.flush()

    def flush(self) -> asyncio.Future[bool]:
        """Write what is dirty now (ordered behind earlier writes); resolves to success."""
        if self._timer is not None:  # this write takes what the timer was for
            self._timer.cancel()
            self._timer = None
        if self._closed:  # after the final write (a late state change while stopping): kept in memory only
            done: asyncio.Future[bool] = self._loop.create_future()
            done.set_result(False)
            return done
        recs = self._snapshot(self._dirty)
        self._dirty.clear()
        ledger = self._ledger() if self._ledger_dirty else None
        self._ledger_dirty = False
        return self._loop.run_in_executor(self._thread, self._save, recs, ledger)

    def _save(self, recs: list[TaskRecord], ledger: Counters | None) -> bool:
        """Database thread. A failed write loses nothing: the records are marked dirty again and retried."""
        try:
            self._db.save(recs, self._gpu if ledger else None, ledger)
        except Exception as exc:  # RegistryWriteError (disk full, I/O error), or anything else: never drop it
            error = str(exc) if isinstance(exc, RegistryWriteError) else f"writing the state failed: {exc!r}"
            self._loop.call_soon_threadsafe(self._failed, {r.id for r in recs}, ledger is not None, error)
            return False
        if self.error:
            self._loop.call_soon_threadsafe(self._recovered)
        return True

    def _failed(self, ids: set[str], ledger: bool, error: str) -> None:
        """Log loudly (once, then every minute), keep everything in memory, retry every `_DB_RETRY_S`."""
        self._failures += 1
        now = self._clock()
        if not self.error or self._error_logged_at is None or now - self._error_logged_at >= _DB_ERROR_LOG_EVERY_S:
            self._error_logged_at = now
            log.error(
                "%s (%d failed writes so far). Tasks and the harvest ledger are kept in memory and written again "
                "every %.0fs; new submissions are refused until a write succeeds. Free space or fix %s.",
                error, self._failures, self._retry_s, self._state_dir,
            )
        self.error = error
        self.mark_dirty(ids, ledger, delay_s=self._retry_s)  # (no timer while holding: close() retries)

    def _recovered(self) -> None:
        log.warning("state database writable again after %d failed writes; nothing was lost", self._failures)
        self.error = ""
        self._failures = 0

    # -- closing ---------------------------------------------------------------------------------
    def hold(self) -> None:
        """Shutdown has begun: changes still write now, but no timer is set any more (close writes the rest)."""
        self._holding = True

    async def close(self, ids: set[str]) -> bool:
        """The final write of these records and the ledger, retried; then the database thread ends."""
        self._holding = True
        self._dirty |= ids
        self._ledger_dirty = True
        saved = await self.flush()
        for _ in range(_FINAL_WRITE_ATTEMPTS - 1):
            if saved:
                break
            await asyncio.sleep(self._retry_s)  # a retry back-off while stopping, not a control-path wait
            saved = await self.flush()
        self._closed = True
        self._thread.shutdown(wait=True)
        if not saved:
            log.error(
                "could not write the final state to %s (%s): task states and harvest since the last successful "
                "write are lost; exiting with an error", self._state_dir, self.error,
            )
        return saved

    def abandon(self) -> None:
        """The agent never loaded its state (a failed start): end the thread without writing anything."""
        self._closed = self._holding = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._thread.shutdown(wait=True)
