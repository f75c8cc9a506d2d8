"""Specification of the task table: a live task's runtime is one entry, gone in one step when its worker exits;
every state change goes through the state machine and says what changed."""

from __future__ import annotations

import asyncio

import pytest
from support.engine_fakes import FakeWorker, MiB, in_loop

from freeride.agent.domain.events import Control
from freeride.agent.domain.model import TaskRecord, TaskSpec, TaskState
from freeride.agent.engine.tasks import Change, TaskTable
from freeride.errors import InvalidStateError


def _table() -> tuple[TaskTable, list[tuple[str, TaskState, Change]]]:
    changes: list[tuple[str, TaskState, Change]] = []
    return TaskTable(lambda rec, change: changes.append((rec.id, rec.state, change)), wall_clock=lambda: 7.0), changes


def _add(table: TaskTable, task_id: str, priority: int = 0, state: TaskState = TaskState.SUBMITTED) -> TaskRecord:
    rec = TaskRecord(task_id, TaskSpec(f"t{task_id}", "pkg.mod:Task", priority=priority), state)
    table.records[task_id] = rec
    return rec


def _worker(task_id: str, instance: int = 1) -> FakeWorker:
    return FakeWorker(task_id, instance, on_exit=lambda w, code: None)


@in_loop
async def test_a_workers_exit_removes_everything_live_of_its_task_in_one_step() -> None:
    table, _ = _table()
    rec = _add(table, "1", state=TaskState.READY)
    rt = table.runtime("1")
    worker = _worker("1")
    rt.reserved_bytes, rt.worker, rt.memory_bytes = 256 * MiB, worker, 300 * MiB
    rt.outbox = asyncio.Queue()
    rt.outbox.put_nowait(Control.PAUSE)
    rt.desired = TaskState.PAUSED
    assert table.reserved_bytes == 256 * MiB and table.workers() == [worker]

    assert table.worker_exited(worker)

    assert table.live == {}
    assert table.worker("1") is None and table.workers() == []
    assert table.reserved_bytes == 0 and table.waiting() == [] and table.waiting_count() == 0
    assert table.records == {"1": rec}  # the record stays: only the live state went


@in_loop
async def test_the_exit_of_a_stale_worker_removes_nothing() -> None:
    table, _ = _table()
    _add(table, "1", state=TaskState.READY)
    current = _worker("1", instance=2)
    table.runtime("1").worker = current
    assert not table.worker_exited(_worker("1", instance=1))
    assert table.worker("1") is current


@pytest.mark.parametrize("new", [TaskState.PAUSED, TaskState.CANCELLED, TaskState.FAILED])
def test_stopping_a_task_without_a_worker_ends_its_wait_and_releases_its_reservation(new: TaskState) -> None:
    table, _ = _table()
    waiting, admitted = _add(table, "1"), _add(table, "2")
    table.runtime("1").waiting = "agent restarted"
    table.runtime("2").reserved_bytes = 64 * MiB
    table.set_state(waiting, new)
    table.set_state(admitted, new)
    assert table.live == {} and table.reserved_bytes == 0


@in_loop
async def test_stopping_a_task_whose_worker_runs_keeps_its_runtime_until_the_worker_exits() -> None:
    table, _ = _table()
    rec = _add(table, "1", state=TaskState.READY)
    rt = table.runtime("1")
    rt.reserved_bytes, rt.worker = 64 * MiB, _worker("1")
    table.set_state(rec, TaskState.PAUSED)
    assert table.live["1"] is rt and table.reserved_bytes == 64 * MiB  # the worker still holds its memory


def test_a_runtime_whose_worker_is_being_created_is_kept_when_its_task_is_paused() -> None:
    table, _ = _table()
    rec = _add(table, "1", state=TaskState.STARTING)
    table.runtime("1").spawning = True
    table.set_state(rec, TaskState.PAUSED)
    assert "1" in table.live


def test_every_state_change_goes_through_the_state_machine() -> None:
    table, changes = _table()
    rec = _add(table, "1", state=TaskState.DONE)
    with pytest.raises(InvalidStateError):
        table.set_state(rec, TaskState.STARTING)
    assert rec.state is TaskState.DONE and changes == []


def test_changes_say_what_changed_so_the_store_knows_how_soon_to_write() -> None:
    table, changes = _table()
    rec = _add(table, "1")
    table.set_state(rec, TaskState.STARTING, "agent restarted")
    table.set_reason(rec, "waiting for memory: needs 1 MiB, 0 MiB free for side tasks")
    table.checkpointed(rec)
    assert changes == [("1", TaskState.STARTING, Change.STATE), ("1", TaskState.STARTING, Change.REASON),
                       ("1", TaskState.STARTING, Change.PROGRESS)]
    assert rec.updated_unix_s == 7.0


def test_waiting_tasks_come_highest_priority_first_then_oldest() -> None:
    table, _ = _table()
    for task_id, priority in (("1", 1), ("2", 5), ("3", 5), ("10", 1)):
        _add(table, task_id, priority)
        table.runtime(task_id).waiting = ""
    _add(table, "4", 9)  # not waiting
    assert [r.id for r in table.waiting()] == ["2", "3", "1", "10"]


def test_a_snapshot_is_a_copy_later_changes_do_not_reach() -> None:
    table, _ = _table()
    rec = _add(table, "1")
    rec.progress["count"] = 1.0
    (snap,) = table.snapshot({"1", "gone"})
    rec.progress["count"] = 2.0
    rec.counters.steps += 5
    assert snap.progress == {"count": 1.0} and snap.counters.steps == 0
