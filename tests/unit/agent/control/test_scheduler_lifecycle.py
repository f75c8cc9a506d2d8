"""Specification of the scheduler's part in a task's lifecycle: a hung step's overrun (with the fake clock
and timers of tests/unit/agent/control/test_scheduler.py)."""

from __future__ import annotations

import pytest
from test_scheduler import HANG, LENGTH, MARGIN, MS, Harness


@pytest.fixture
def h() -> Harness:
    return Harness()


def test_a_hung_step_killed_past_its_window_counts_the_time_it_ran_past_the_window_as_overrun(h: Harness) -> None:
    h.add("a")
    h.start(0, hint=LENGTH)
    h.steps("a", 1, (1 * MS, 2 * MS))  # one step done in time; the next one hangs (its report never comes)
    h.end(LENGTH)
    h.fire_next()  # the hang timer: the agent kills the worker
    assert h.hangs == [("a", 1)]
    h.sched.remove_task("a")  # the worker's exit
    (account,) = h.accounts
    c = account.per_task["a"]
    assert (c.steps, c.overrun_steps, c.overrun_ns) == (1, 1, HANG)  # from the bubble's end to the kill
    assert c.harvested_ns == 2 * MS
    assert account.total.overrun_ns == HANG  # the GPU's ledger too
    assert account.record.shares[0].overrun_ns == HANG
    assert h.sched.margin.margin_ns() == MARGIN  # a hang is not a prediction error: the margin is unchanged


def test_a_window_closing_while_its_task_checkpoints_arms_no_hang_timer_until_the_checkpoint_ends(
        h: Harness) -> None:
    # Granted after the worker's WindowDone and before its "checkpointing" message: unseen, it stays held, and its
    # close must not arm the hang timer (a checkpoint is no step: --checkpoint-timeout-s bounds it, and a hang
    # timer would kill it).
    port = h.add("a")
    t = h.learn()
    h.start(t, iteration=2)
    assert len(port.grants()) == 1
    h.sched.checkpointing("a", True)
    h.end(t + LENGTH, iteration=2)
    assert port.revokes() and h.pending_timers() == []
    h.sched.checkpointing("a", False)  # from now on it answers as any idle worker does
    assert len(h.pending_timers()) == 1


def test_a_task_in_a_checkpoint_is_offered_no_window(h: Harness) -> None:
    port = h.add("a")
    t = h.learn()
    h.sched.checkpointing("a", True)
    h.start(t, iteration=2)
    h.end(t + LENGTH, iteration=2)
    assert port.grants() == []  # a window it could not use: a wasted bubble
    h.sched.checkpointing("a", False)
    h.start(t + 100 * MS, iteration=3)
    assert len(port.grants()) == 1
