"""Specification of the cap on resident workers (--max-workers): tasks beyond it wait, queued and visibly so,
and start as workers exit, highest priority first, then oldest.

In-process with the supervisor's fakes (engine_fakes.Rig): workers exit when the test says so, and the
admission pass after an exit is a manual timer the test fires.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.engine_fakes import Rig, in_loop

from freeride.agent.domain.model import TaskState
from freeride.agent.engine.admission import worker_slot

QUEUED = "queued: 2 workers resident (--max-workers 2)"


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path, max_workers=2)


def test_a_worker_slot_is_free_below_the_cap_only() -> None:
    assert worker_slot(resident=1, max_workers=2) == ""
    assert worker_slot(resident=2, max_workers=2) == QUEUED
    assert worker_slot(resident=3, max_workers=2) == "queued: 3 workers resident (--max-workers 2)"


@in_loop
async def test_tasks_beyond_the_cap_wait_queued_and_spawn_nothing(rig: Rig) -> None:
    tasks = [rig.task() for _ in range(5)]
    for rec in tasks:
        await rig.sup.start(rec)
    assert [w.task_id for w in rig.launcher.workers] == [tasks[0].id, tasks[1].id]
    for rec in tasks[2:]:
        assert rec.state is TaskState.SUBMITTED and rec.reason == QUEUED
        assert rig.launcher.of(rec.id) == []
    assert rig.table.waiting() == tasks[2:]


@in_loop
async def test_a_worker_exit_starts_the_highest_priority_then_the_oldest_waiting_task(rig: Rig) -> None:
    first, second = rig.task(), rig.task()
    old, new_high, newer = rig.task(priority=1), rig.task(priority=5), rig.task(priority=1)
    for rec in (first, second, old, new_high, newer):
        await rig.sup.start(rec)

    rig.ask_stop(first, TaskState.CANCELLED)
    rig.worker(first).exit(0)
    rig.timers.fire_next()  # the admission pass set for after the exit (an event, not a poll)
    await rig.sup.settle()
    assert len(rig.launcher.of(new_high.id)) == 1 and new_high.state is TaskState.STARTING
    assert rig.table.waiting() == [old, newer]

    rig.worker(second).exit(0)  # a crash: its restart waits its backoff, and then queues like any other
    rig.timers.fire_next()
    await rig.sup.settle()
    assert len(rig.launcher.of(old.id)) == 1
    assert rig.table.waiting() == [newer] and newer.reason == QUEUED


@in_loop
async def test_a_submit_between_an_exit_and_its_admission_pass_does_not_jump_the_queue(rig: Rig) -> None:
    a, b, queued = rig.task(), rig.task(), rig.task()
    for rec in (a, b, queued):
        await rig.sup.start(rec)
    rig.table.set_state(a, TaskState.CANCELLED)
    rig.worker(a).exit(0)  # a slot is free, the pass is due
    late = rig.task()
    await rig.sup.start(late)
    assert rig.launcher.of(late.id) == []
    rig.timers.fire_next()
    await rig.sup.settle()
    assert len(rig.launcher.of(queued.id)) == 1
    assert rig.table.waiting() == [late] and late.reason == QUEUED


@in_loop
async def test_pausing_or_cancelling_a_queued_task_takes_it_out_of_the_queue(rig: Rig) -> None:
    a, b, paused, cancelled = rig.task(), rig.task(), rig.task(), rig.task()
    for rec in (a, b, paused, cancelled):
        await rig.sup.start(rec)
    rig.ask_stop(paused, TaskState.PAUSED)
    rig.ask_stop(cancelled, TaskState.CANCELLED)
    assert rig.table.waiting() == []
    rig.table.set_state(a, TaskState.CANCELLED)
    rig.worker(a).exit(0)
    assert rig.timers.pending() == []  # nothing waits: no pass is set
    assert rig.launcher.of(paused.id) == [] and rig.launcher.of(cancelled.id) == []
