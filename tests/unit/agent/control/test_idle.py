"""The bubble time a rank adds to the ledger (freeride.agent.control.idle): weighted by the iterations a timed step
stands for, and never more than the time that has passed (round 3, item 2: a trainer wrote 199 years in 0.78 s)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from support.clock import ManualClock
from support.engine_fakes import Timer as FakeTimer

from freeride.agent.control.idle import IdleBound
from freeride.agent.control.scheduler import Scheduler, SchedulerConfig
from freeride.agent.domain.events import Edge
from freeride.core.ring import MAX_STANDS_FOR

MS = 1_000_000
S = 1_000_000_000
T0 = 1_000 * S  # the agent's clock when the rank's first bubble starts


def scheduler(clock: ManualClock) -> Scheduler:
    def call_at(at: int, fn: Callable[[], None]) -> FakeTimer:
        return FakeTimer(at, fn)  # (a window's end: never fired here, no task holds one)

    return Scheduler(clock, call_at, SchedulerConfig(), on_account=lambda *a: None,
                     on_hang=lambda *a: None)


def bubble(s: Scheduler, clock: ManualClock, start_ns: int, end_ns: int, stands_for: int = 1, rank: int = 0,
           seen_ns: int = 0) -> None:
    """One START..END of slot 0 as the edge checks let it through; the agent reads both at `seen_ns` (0: END)."""
    clock.now_ns = seen_ns or end_ns
    s.on_bubble(Edge(True, True, rank, 0, 0, start_ns, kind=1, stands_for=stands_for))
    s.on_bubble(Edge(False, True, rank, 0, 0, end_ns, kind=1, stands_for=stands_for))


def test_a_step_that_stands_for_several_adds_its_bubble_time_that_many_times() -> None:
    """A quiet trainer times one step in five: that step's bubbles count for the five, in number and in time."""
    clock = ManualClock(start_ns=T0)
    s = scheduler(clock)
    bubble(s, clock, T0, T0 + 10 * MS)
    bubble(s, clock, T0 + 500 * MS, T0 + 510 * MS, stands_for=5)
    assert (s.gpu.bubbles, s.gpu.bubble_ns) == (6, 60 * MS)
    assert s.idle.cut_ns == 0


def test_true_bubbles_are_never_cut_however_the_steps_are_sampled() -> None:
    """Three 10 ms bubbles in each 100 ms step, one step in seven timed (standing for seven): all counted."""
    clock = ManualClock(start_ns=T0)
    s = scheduler(clock)
    claimed = 0
    for step in range(0, 700, 7):
        weight = 1 if step == 0 else 7
        for k in range(3):
            start = T0 + step * 100 * MS + k * 30 * MS
            bubble(s, clock, start, start + 10 * MS, stands_for=weight)
            claimed += 10 * MS * weight
    assert s.gpu.bubble_ns == claimed and s.idle.cut_ns == 0


@pytest.mark.parametrize("stands_for", [1, MAX_STANDS_FOR])
def test_forged_edges_add_no_more_bubble_time_than_has_passed_and_are_said_once(
        stands_for: int, caplog: pytest.LogCaptureFixture) -> None:
    """The adversary's records: each START stamped 59 s back and its END 0.9 s ahead (each within the edge checks'
    60 s and 1 s), 100 of them in 1.6 s, with the largest weight the ring carries or none. Before the bound they added
    100 x 60 s (x 2^20 with the weight: centuries); now the rank's total is within its first START..last END."""
    clock = ManualClock(start_ns=T0)
    s = scheduler(clock)
    bubble(s, clock, T0, T0 + 10 * MS)  # a true one first
    with caplog.at_level(logging.WARNING, logger="freeride.agent.control.idle"):
        for i in range(100):
            now = T0 + 1 * S + i * 16 * MS
            bubble(s, clock, now - 59 * S, now + 900 * MS, stands_for=stands_for, seen_ns=now)
    last_end = T0 + 1 * S + 99 * 16 * MS + 900 * MS
    assert s.gpu.bubble_ns <= last_end - T0
    assert s.gpu.bubble_ns + s.idle.cut_ns == 10 * MS + 100 * 59_900 * MS * stands_for  # the rest: refused, counted
    assert s.gpu.bubbles <= 1 + 100 * stands_for
    said = [r for r in caplog.records if r.name == "freeride.agent.control.idle"]
    assert len(said) == 1 and "rank 0" in said[0].getMessage() and "cannot be idle" in said[0].getMessage()


def test_the_bound_is_per_rank_and_a_new_stream_of_the_rank_starts_afresh() -> None:
    idle = IdleBound()
    assert idle.credit(0, T0, T0 + 10 * MS, 100) == (10 * MS, 1)  # the first bubble: nothing before it
    assert idle.credit(1, T0, T0 + 10 * MS, 1) == (10 * MS, 1)  # another rank's time is its own
    assert idle.credit(0, T0 + 1 * S, T0 + 1 * S + 10 * MS, 100) == (1 * S, 100)  # 1 s since: all of it
    idle.gone(0)
    assert idle.credit(0, T0 + 5 * S, T0 + 5 * S + 10 * MS, 1) == (10 * MS, 1)
