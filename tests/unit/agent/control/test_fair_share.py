"""Specification of fair share among tasks of one priority: decayed recent usage, so an old task is not starved
by new ones (the fake clock and timers of tests/unit/agent/control/test_scheduler.py)."""

from __future__ import annotations

from collections import Counter

from test_scheduler import MARGIN, MS, FakePort, Harness

from freeride.agent.control.policy import RecentUsage
from freeride.agent.control.scheduler import TaskSlot
from freeride.agent.domain.model import Counters

S = 1_000 * MS
HALF_LIFE = 30 * S  # the scheduler's default
WINDOW = 100 * MS  # one bubble a second: the test covers minutes of wall time in a few thousand bubbles


def bubble(h: Harness, i: int) -> str:
    """Bubble i (at i seconds): whoever is granted steps through it and goes idle after its END; who it was."""
    t = i * S
    h.start(t, hint=WINDOW)
    holders = [task_id for task_id, slot in h.sched.tasks.items() if slot.window_id]
    assert len(holders) == 1
    (holder,) = holders
    wid = h.sched.tasks[holder].window_id
    h.steps(holder, wid, (t, WINDOW - MARGIN))
    h.end(t + WINDOW)
    h.done(holder, wid)
    return holder


def test_an_old_task_is_served_again_within_a_few_half_lives_after_50_new_tasks_arrive_and_gets_its_share() -> None:
    h = Harness()
    h.add("old")
    h.sched.tasks["old"].counters.harvested_ns = 3_600 * S  # an hour harvested before: not held against it
    for i in range(300):  # 5 minutes alone: its recent usage is as high as it gets
        assert bubble(h, i) == "old"
    for n in range(50):
        h.add(f"new{n:02d}")
    got = [bubble(h, i) for i in range(300, 300 + 1200)]  # 20 minutes, 51 tasks
    first = got.index("old")
    # Its usage falls to the least used new task's (about half a window over 50 tasks' mean): log2(2 x 50)
    # half-lives, 6.6 here; the lifetime total of before would have kept it out for over 50 hours.
    assert first * S < 8 * HALF_LIFE
    last = Counter(got[-51 * 10:])  # the last 510 windows
    assert 8 <= last["old"] <= 12  # 1/51 of them: 10
    assert max(last.values()) - min(last.values()) <= 4  # and so does every new task


def test_the_lifetime_total_no_longer_decides_recent_usage_does() -> None:
    h = Harness()
    h.sched.add_task(TaskSlot("veteran", 0, FakePort(), Counters(harvested_ns=10**15)))
    h.sched.add_task(TaskSlot("newcomer", 0, FakePort(), Counters()))
    h.sched.usage.add("newcomer", 50 * MS, 0)
    assert bubble(h, 0) == "veteran"


def test_recent_usage_halves_every_half_life_and_keeps_its_order_across_rescalings() -> None:
    u = RecentUsage(HALF_LIFE)
    u.add("a", 8 * MS, 0)
    assert u.recent_ns("a", HALF_LIFE) == 4 * MS
    u.add("b", 1 * MS, 3 * HALF_LIFE)  # b's 1 ms now weighs as much as a's 8 ms of three half-lives ago
    assert u.recent_ns("b", 3 * HALF_LIFE) == u.recent_ns("a", 3 * HALF_LIFE)
    u.add("b", 1, 3 * HALF_LIFE)
    assert u.score("b") > u.score("a")
    u.add("c", 1 * MS, 100 * HALF_LIFE)  # past 64 half-lives: rescaled; a and b decayed below 1 ns are forgotten
    assert (u.score("a"), u.score("b")) == (0.0, 0.0) and u.recent_ns("c", 101 * HALF_LIFE) == 0.5 * MS
