"""Retention: finished tasks removed with their checkpoint and logs, by hand (rm, prune) or by age.

Only a finished task (DONE, FAILED, CANCELLED) whose worker has exited goes. Its record leaves the
table first (so nothing writes it again), then its files: `checkpoints/task-N.ckpt*` and
`logs/task-N.log*` in the state directory, regular files only, nothing else; then its row (one
transaction; the id is never given out again). Files first, because removing is how an operator frees
a full disk, and SQLite needs space to delete a row: the files' space lets the row go. A row that still
cannot be deleted puts the records back (shown as finished tasks whose files are gone) and the call
says so; removing them again deletes the rows. Space freed wakes what waits for the disk
(`on_freed`: the supervisor's `disk_freed`).

With a retention period (`--retention 7d`) the agent prunes at start and then on a timer set for
the next expiry, at most an hour away (the wall clock may jump); one log line per pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import stat
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from freeride.agent.domain.background import Background
from freeride.agent.domain.model import TERMINAL, TaskRecord, TaskState
from freeride.agent.domain.timers import CallLater, TimerHandle
from freeride.agent.engine.offload import ThreadOffload
from freeride.agent.engine.tasks import TaskTable
from freeride.agent.state.store import Store
from freeride.core.units import format_duration
from freeride.errors import InvalidSpecError, InvalidStateError

log = logging.getLogger("freeride.agent")

FINISHED = TERMINAL  # what rm and prune remove: DONE, FAILED, CANCELLED
_PASS_EVERY_S = 3600.0  # the longest wait between passes
_MIN_WAIT_S = 1.0  # (a task due now whose worker still exits is retried this soon, not in a busy loop)


def expired(records: Iterable[TaskRecord], now_unix_s: float, older_than_s: float,
            states: Collection[TaskState] = FINISHED) -> list[TaskRecord]:
    """The finished tasks in `states` whose last change is more than `older_than_s` before now, oldest first."""
    cutoff = now_unix_s - older_than_s
    due = [r for r in records if r.state in states and r.state in FINISHED and r.updated_unix_s < cutoff]
    return sorted(due, key=lambda r: (r.updated_unix_s, int(r.id)))


def next_pass_s(records: Iterable[TaskRecord], now_unix_s: float, keep_s: float) -> float:
    """How long until the next pass: the next finished task's expiry, and never more than `keep_s` (a task
    that finishes after this pass expires no sooner) or an hour."""
    wait = min(keep_s, _PASS_EVERY_S)
    for r in records:
        if r.state in FINISHED:
            wait = min(wait, r.updated_unix_s + keep_s - now_unix_s)
    return max(wait, _MIN_WAIT_S)


def task_files(state_dir: Path, task_id: str) -> list[Path]:
    """The task's own files: checkpoints/task-N.ckpt and logs/task-N.log, and their `.something` siblings
    (the checkpoint being written, rotated logs); never task-N0's."""
    out: list[Path] = []
    for folder, stem in (("checkpoints", f"task-{task_id}.ckpt"), ("logs", f"task-{task_id}.log")):
        try:
            names = [p for p in (state_dir / folder).iterdir() if p.name == stem or p.name.startswith(stem + ".")]
        except FileNotFoundError:
            continue
        out += sorted(names)
    return out


def regular_files(paths: Iterable[Path], unlink: bool = False) -> tuple[int, int]:
    """(count, bytes) of the regular files among `paths`, unlinked if told (a link or a folder someone put
    there stays)."""
    count = size = 0
    for path in paths:
        try:
            st = path.lstat()
            if not stat.S_ISREG(st.st_mode):
                continue
            if unlink:
                path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("could not remove %s: %s", path, exc)
            continue
        count, size = count + 1, size + st.st_size
    return count, size


@dataclass(frozen=True)
class Removal:
    """Tasks removed (or, in a dry run, that would be) and their files."""

    tasks: list[TaskRecord]
    files: int
    bytes: int
    dry_run: bool = False


class Retention:
    def __init__(self, table: TaskTable, store: Store, state_dir: Path, keep_s: float | None,
                 call_later: CallLater, wall_clock: Callable[[], float] = time.time,
                 exit_timeout_s: float = 15.0, on_freed: Callable[[], None] | None = None) -> None:
        """`keep_s`: the agent's retention period (None: keep forever, no timer); `exit_timeout_s`: how long
        `rm` waits for a just-cancelled task's worker to checkpoint and exit; `on_freed()`: files were removed."""
        self._on_freed = on_freed
        self._table = table
        self._store = store
        self._state_dir = state_dir
        self.keep_s = keep_s
        self._call_later = call_later
        self._wall_clock = wall_clock
        self._exit_timeout_s = exit_timeout_s
        self._timer: TimerHandle | None = None
        self._passes = Background("retention")
        self._closed = False
        # Deleting files in bulk (a prune loop) on a thread of its own at nice 19: training comes first. (Not
        # closed: a prune answered after close() may still need it; idle, it ends with the process.)
        self._files = ThreadOffload("freeride-prune", background=True)

    # -- by hand ---------------------------------------------------------------------------------
    async def remove(self, rec: TaskRecord) -> Removal:
        """`freeride rm`: a finished task, once its worker (checkpointing after a cancel) has exited."""
        if rec.state not in FINISHED:
            raise InvalidStateError(f"task {rec.id} is {rec.state.value}; cancel it first "
                                    f"(`freeride cancel {rec.id}`), then remove it")
        worker = self._table.worker(rec.id)
        if worker is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(worker.exited.wait(), timeout=self._exit_timeout_s)
        if rec.id in self._table.live:
            raise InvalidStateError(f"task {rec.id} is {rec.state.value} but its worker has not exited yet; "
                                    "remove it again in a moment")
        if self._table.records.get(rec.id) is not rec:  # removed by another call meanwhile
            raise InvalidStateError(f"task {rec.id} was removed meanwhile")
        return await self._remove([rec])

    async def prune(self, older_than_s: float, states: Collection[TaskState] = (), dry_run: bool = False) -> Removal:
        """`freeride prune`: the finished tasks (of `states`; empty: all three) last changed over
        `older_than_s` ago; a task whose worker is still exiting waits for the next prune."""
        if math.isnan(older_than_s) or older_than_s < 0:
            raise InvalidSpecError(f"older_than_s must be >= 0, got {older_than_s}")
        unfinished = sorted(s.value for s in set(states) - FINISHED)
        if unfinished:
            raise InvalidSpecError(f"prune removes finished tasks only (DONE, FAILED, CANCELLED), not "
                                   f"{', '.join(unfinished)}; cancel those first")
        due = [r for r in expired(self._table.records.values(), self._wall_clock(), older_than_s, states or FINISHED)
               if r.id not in self._table.live]
        if dry_run:
            paths = [p for r in due for p in task_files(self._state_dir, r.id)]
            files, size = await self._files.run(lambda: regular_files(paths))
            return Removal(due, files, size, dry_run=True)
        return await self._remove(due)

    async def _remove(self, recs: list[TaskRecord]) -> Removal:
        if not recs:
            return Removal([], 0, 0)
        for rec in recs:  # first out of the table: no write after this one brings them back
            del self._table.records[rec.id]
        try:
            paths = [p for r in recs for p in task_files(self._state_dir, r.id)]
            files, size = await self._files.run(lambda: regular_files(paths, True))
        except BaseException:
            self._table.records.update((r.id, r) for r in recs)
            raise
        if files and self._on_freed is not None:
            self._on_freed()
        try:
            await self._store.delete([r.id for r in recs])
        except InvalidStateError as exc:
            self._table.records.update((r.id, r) for r in recs)
            raise InvalidStateError(f"{exc} (their {files} file(s), {size} bytes, are removed already)") from None
        except BaseException:
            self._table.records.update((r.id, r) for r in recs)
            raise
        log.info("removed %d finished task(s) (%s) with %d file(s), %d bytes", len(recs),
                 ", ".join(r.id for r in recs), files, size)
        return Removal(recs, files, size)

    # -- by age ----------------------------------------------------------------------------------
    async def start(self) -> None:
        """With a retention period: the first pass now, then the timer."""
        if self.keep_s is not None:
            await self._pass()

    async def _pass(self) -> None:
        assert self.keep_s is not None
        try:
            removal = await self.prune(self.keep_s)
            log.info("retention pass: removed %d finished task(s) older than %s%s", len(removal.tasks),
                     format_duration(self.keep_s), f" ({', '.join(r.id for r in removal.tasks)})" if removal.tasks
                     else "")
        except InvalidStateError as exc:  # the database cannot be written now: the next pass tries again
            log.warning("retention pass failed: %s", exc)
        finally:
            self._arm()

    def _arm(self) -> None:
        if self._closed or self.keep_s is None:
            return
        wait_s = next_pass_s(self._table.records.values(), self._wall_clock(), self.keep_s)
        self._timer = self._call_later(wait_s, self._due)

    def _due(self) -> None:
        self._timer = None
        self._passes.spawn(self._pass())

    async def close(self) -> None:
        """Shutdown: no timer any more, and a pass under way ends (before the store closes)."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self._passes.wait()
