"""Specification of the scheduler's part in a task's lifecycle: a hung step's overrun (with the fake clock
and timers of tests/unit/test_scheduler.py)."""

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
