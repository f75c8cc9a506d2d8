"""Specification of the write-behind store: coalesced writes, at-once writes for state changes, a database
that fails (disk full) loses nothing and is retried, submissions are refused meanwhile, the final write.

Timers are manual; a write is awaited through `flush()`, whose future resolves after every earlier
write (one database thread, in order) and after what the loop was told about them.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from support.engine_fakes import ManualTimers, in_loop

from freeride.agent.domain.model import Counters, TaskRecord, TaskSpec, TaskState
from freeride.agent.engine.tasks import TaskTable
from freeride.agent.state.registry import RegistryWriteError
from freeride.agent.state.store import Store
from freeride.errors import InvalidStateError

DISK_FULL = "writing /state/freeride.db failed: database or disk is full"


class FakeDatabase:
    """A registry that keeps what it is given and fails while told to (used from the store's thread)."""

    def __init__(self) -> None:
        self.failing = False
        self.fail_next = 0  # this many writes fail, then they succeed
        self.attempts = 0
        self.writes: list[tuple[list[str], bool]] = []  # (task ids, with the ledger) of each non-empty write
        self.saved: dict[str, TaskRecord] = {}
        self.ledger: Counters | None = None

    def _check(self) -> None:
        self.attempts += 1
        if self.failing or self.fail_next > 0:
            self.fail_next = max(0, self.fail_next - 1)
            raise RegistryWriteError(DISK_FULL)

    def save(self, recs: list[TaskRecord], gpu: int | None = None, gpu_counters: Counters | None = None) -> None:
        self._check()
        if recs or gpu_counters is not None:
            self.writes.append((sorted(r.id for r in recs), gpu_counters is not None))
        self.saved.update((r.id, r) for r in recs)
        if gpu_counters is not None:
            self.ledger = gpu_counters

    def insert(self, rec: TaskRecord) -> str:
        return str(len(self.saved) + 100)  # (an insert may still fit where a larger write does not)

    def load(self) -> list[TaskRecord]:
        return list(self.saved.values())

    def load_ledger(self, gpu: int) -> Counters:
        return self.ledger or Counters()


class Rig:
    def __init__(self, retry_s: float = 1.0) -> None:
        self.db = FakeDatabase()
        self.timers = ManualTimers()
        self.table = TaskTable(lambda rec, change: None)
        for task_id in ("1", "2"):
            self.table.records[task_id] = TaskRecord(task_id, TaskSpec(f"t{task_id}", "m:T"), TaskState.READY)
        self.gpu = Counters()
        self.clock_s = 0.0
        self.store = Store(self.db, 0, Path("/state"), self.table.snapshot, lambda: Counters(**vars(self.gpu)),
                           call_later=self.timers.call_later, clock=lambda: self.clock_s, retry_s=retry_s)

    async def fire(self) -> None:
        """Fire the pending timer and wait until its write is done."""
        self.timers.fire_next()
        await self.store.flush()


def _new_task() -> TaskRecord:
    return TaskRecord("", TaskSpec("new", "m:T"), TaskState.SUBMITTED)


@in_loop
async def test_changes_within_the_flush_delay_are_written_together_once() -> None:
    rig = Rig()
    rig.store.mark_dirty({"1"})
    rig.store.mark_dirty({"2"}, ledger=True)
    rig.store.mark_dirty({"1"})
    (timer,) = rig.timers.pending()
    assert timer.at == 0.1  # a kill -9 loses at most 0.1 s of accounting
    await rig.fire()
    assert rig.db.writes == [(["1", "2"], True)]


@in_loop
async def test_a_state_change_is_written_at_once_and_takes_the_pending_timers_work_with_it() -> None:
    rig = Rig()
    rig.store.mark_dirty({"1"}, ledger=True)
    (timer,) = rig.timers.pending()
    assert await rig.store.write("2")
    assert timer.cancelled  # the timer's work is done: it is cancelled, not left to fire an empty write
    assert rig.db.writes == [(["1", "2"], True)]
    rig.store.mark_dirty({"1"})
    assert len(rig.timers.pending()) == 1  # and a new change sets a new timer


@in_loop
async def test_a_failing_database_loses_nothing_is_retried_every_second_and_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig = Rig()
    rig.db.failing = True
    rig.table.records["1"].counters.steps = 5
    rig.gpu.steps = 5
    rig.store.mark_dirty({"1"}, ledger=True)
    await rig.fire()
    assert rig.store.error == DISK_FULL
    (retry,) = rig.timers.pending()
    assert retry.at - rig.timers.now == 1.0
    failed = rig.store.write("2")  # a state change is tried at once (and fails again)...
    rig.store.mark_dirty({"1"})  # ...while accounting goes on: no retry more often than every second
    (retry,) = rig.timers.pending()
    assert retry.at - rig.timers.now == 1.0
    assert not await failed
    with pytest.raises(InvalidStateError, match=r"the state database cannot be written .*disk is full"):
        await rig.store.insert(_new_task())  # new submissions are refused meanwhile (though one might fit)

    rig.table.records["1"].counters.steps = 7  # the accounting goes on in memory
    rig.gpu.steps = 7
    rig.db.failing = False
    with caplog.at_level(logging.WARNING, logger="freeride.agent"):
        await rig.fire()
    assert rig.store.error == ""
    assert rig.db.saved["1"].counters.steps == 7 and rig.db.ledger == Counters(steps=7)  # nothing lost
    assert "writable again after 3 failed writes; nothing was lost" in caplog.text
    assert rig.timers.pending() == []
    assert await rig.store.insert(_new_task())  # and submissions are taken again


@in_loop
async def test_the_write_error_is_logged_once_then_every_minute(caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig()
    rig.db.failing = True
    with caplog.at_level(logging.ERROR, logger="freeride.agent"):
        for rig.clock_s in (0.0, 1.0, 30.0, 59.9, 60.0, 61.0):
            rig.store.mark_dirty({"1"})
            await rig.store.flush()
    logged = [r for r in caplog.records if "failed writes so far" in r.getMessage()]
    assert [r.getMessage().split(" (")[1].split(" ")[0] for r in logged] == ["1", "5"]


@in_loop
async def test_the_final_write_is_retried() -> None:
    rig = Rig(retry_s=0)
    rig.db.fail_next = 2
    rig.gpu.windows = 3
    assert await rig.store.close({"1", "2"})
    assert rig.db.attempts == 3
    assert rig.db.writes == [(["1", "2"], True)] and rig.db.ledger == Counters(windows=3)


@in_loop
async def test_a_final_write_that_keeps_failing_says_so_and_sets_no_timer(caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig(retry_s=0)
    rig.db.failing = True
    with caplog.at_level(logging.ERROR, logger="freeride.agent"):
        assert not await rig.store.close({"1"})
    assert rig.db.attempts == 3
    assert "could not write the final state" in caplog.text
    assert rig.timers.pending() == []  # no timer may outlive the database thread
    assert not await rig.store.flush()  # after the final write: kept in memory only


@in_loop
async def test_once_shutdown_has_begun_changes_set_no_timer() -> None:
    rig = Rig()
    rig.store.hold()
    rig.store.mark_dirty({"1"}, ledger=True)
    assert rig.timers.pending() == []
    assert await rig.store.close(set())
    assert rig.db.writes == [(["1"], True)]  # the final write took it
