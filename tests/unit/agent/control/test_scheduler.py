"""Specification of the scheduler: bubble edges in, windows granted and revoked, harvest accounted.

Driven with a fake clock, fake timers fired by hand and fake window ports that record calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from support.engine_fakes import Timer as FakeTimer

from freeride.agent.control.reprobe import PROBE_SERIES
from freeride.agent.control.scheduler import Scheduler, SchedulerConfig, TaskSlot
from freeride.agent.domain.events import Edge, Steps, WindowDone, WindowRecord
from freeride.agent.domain.model import Counters
from freeride.worker.fit import PROBE_AFTER_WINDOWS

MS = 1_000_000
US = 1_000
MARGIN = 200 * US
HANG = 1_000 * MS
PERIOD = 100 * MS  # one training iteration
LENGTH = 10 * MS  # the bubble length of slot 0 in the fake trainer


# -- fakes -----------------------------------------------------------------------------------------


@dataclass
class FakePort:
    calls: list[tuple[object, ...]] = field(default_factory=list)

    def grant(self, window_id: int, until_ns: int) -> None:
        self.calls.append(("grant", window_id, until_ns))

    def revoke(self, window_id: int, until_ns: int) -> None:
        self.calls.append(("revoke", window_id, until_ns))

    def grants(self) -> list[tuple[object, ...]]:
        return [c for c in self.calls if c[0] == "grant"]

    def revokes(self) -> list[tuple[object, ...]]:
        return [c for c in self.calls if c[0] == "revoke"]


@dataclass
class Account:
    record: WindowRecord
    per_task: dict[str, Counters]
    total: Counters


class Harness:
    def __init__(self) -> None:
        self.now = 0
        self.timers: list[FakeTimer] = []
        self.accounts: list[Account] = []
        self.hangs: list[tuple[str, int]] = []
        self.demand: list[tuple[bool, bool]] = []  # (what on_demand was told, wants_edges at that moment)
        cfg = SchedulerConfig(
            margin_ns=MARGIN, min_window_ns=200 * US, hang_timeout_ns=HANG, hang_factor=20.0
        )
        self.sched = Scheduler(
            clock=lambda: self.now,
            call_at=self._call_at,
            config=cfg,
            on_account=lambda rec, per, total: self.accounts.append(Account(rec, per, total)),
            on_hang=lambda task_id, wid: self.hangs.append((task_id, wid)),
            on_demand=lambda wanted: self.demand.append((wanted, self.sched.wants_edges)),
        )

    def _call_at(self, at: int, fn: Callable[[], None]) -> FakeTimer:
        t = FakeTimer(at, fn)
        self.timers.append(t)
        return t

    def pending_timers(self) -> list[FakeTimer]:
        return [t for t in self.timers if t.pending]

    def fire(self, timer: FakeTimer) -> None:
        assert timer.pending
        self.now = max(self.now, timer.at)
        timer.fired = True
        timer.fn()

    def fire_next(self) -> None:
        self.fire(min(self.pending_timers(), key=lambda t: t.at))

    # -- tasks
    def add(self, task_id: str, priority: int = 0, step_estimate_ns: int | None = None) -> FakePort:
        port = FakePort()
        self.sched.add_task(TaskSlot(task_id, priority, port, Counters(), step_estimate_ns))
        return port

    def steps(self, task_id: str, window_id: int, *steps: tuple[int, int]) -> None:
        self.sched.on_steps(task_id, Steps(window_id, list(steps), {}, 0))

    def done(self, task_id: str, window_id: int, idle_since_ns: int = 0, step_estimate_ns: int = 0) -> None:
        """The worker's WindowDone (why it went idle, the message's reason, is the worker's business)."""
        self.sched.on_window_done(task_id, WindowDone(window_id, idle_since_ns, step_estimate_ns))

    # -- trainer
    def start(self, t: int, slot: int = 0, rank: int = 0, iteration: int = 0, hint: int = 0) -> None:
        self.now = t
        self.sched.on_bubble(Edge(True, True, rank, slot, iteration, t, expected_duration_ns=hint))

    def end(self, t: int, slot: int = 0, rank: int = 0, iteration: int = 0) -> None:
        self.now = t
        self.sched.on_bubble(Edge(False, True, rank, slot, iteration, t))

    def learn(self, iterations: int = 2, length: int = LENGTH, rank: int = 0, slot: int = 0) -> int:
        """Run `iterations` full bubbles of one slot; return the start time of the next iteration."""
        for i in range(iterations):
            self.start(i * PERIOD, slot=slot, rank=rank, iteration=i)
            self.end(i * PERIOD + length, slot=slot, rank=rank, iteration=i)
        return iterations * PERIOD


@pytest.fixture
def h() -> Harness:
    return Harness()


def granted_window(port: FakePort) -> int:
    (grant,) = port.grants()
    return int(grant[1])  # type: ignore[call-overload]


# -- learning and granting -------------------------------------------------------------------------


def test_a_window_record_says_when_the_agent_took_the_start_wrote_the_grant_and_the_worker_saw_it(
        h: Harness) -> None:
    """The four legs of a grant (freeride.tooling.harness.grant_parts_us), one clock throughout."""
    port = h.add("a")
    t = h.learn()

    def slow_write(window_id: int, until_ns: int) -> None:  # the pipe write that wakes the worker takes time
        h.now += 15 * US
        FakePort.grant(port, window_id, until_ns)

    port.grant = slow_write  # type: ignore[method-assign]
    h.now = t + 40 * US  # the agent takes the START 40 us after the trainer stamped it
    h.sched.on_bubble(Edge(True, True, 0, 0, 2, t))
    wid = granted_window(port)
    h.steps("a", wid, (t + 80 * US, 100 * US))
    h.sched.on_window_done("a", WindowDone(wid, t + 300 * US, 0, woke_ns=t + 70 * US))
    h.end(t + LENGTH, iteration=2)
    record = h.accounts[-1].record
    (share,) = record.shares
    assert (record.seen_ns - t, share.granted_ns - t, share.woke_ns - t, share.first_step_ns - t) == (
        40 * US, 55 * US, 70 * US, 80 * US)


def test_no_grant_in_the_first_two_iterations_of_a_slot(h: Harness) -> None:
    port = h.add("a")
    h.start(0, iteration=0)
    assert port.calls == []  # nothing known
    h.end(LENGTH, iteration=0)  # the first observation is skipped (warm-up)
    h.start(PERIOD, iteration=1)
    assert port.calls == []  # still nothing learned
    h.end(PERIOD + LENGTH, iteration=1)
    assert port.calls == []


def test_third_iteration_is_granted_until_start_plus_learned_minimum_minus_margin(h: Harness) -> None:
    port = h.add("a")
    h.start(0, iteration=0)
    h.end(50 * MS, iteration=0)  # warm-up: long, skipped
    h.start(PERIOD, iteration=1)
    h.end(PERIOD + LENGTH, iteration=1)
    t = 2 * PERIOD
    h.start(t, iteration=2)
    assert port.grants() == [("grant", 1, t + LENGTH - MARGIN)]


def test_hint_allows_a_grant_without_history(h: Harness) -> None:
    port = h.add("a")
    h.start(5 * MS, hint=8 * MS)
    assert port.grants() == [("grant", 1, 5 * MS + 8 * MS - MARGIN)]


def test_learned_length_takes_precedence_over_the_hint(h: Harness) -> None:
    port = h.add("a")
    t = h.learn()
    h.start(t, iteration=2, hint=50 * MS)
    assert port.grants() == [("grant", 1, t + LENGTH - MARGIN)]


def test_no_grant_when_the_window_would_be_shorter_than_the_minimum(h: Harness) -> None:
    port = h.add("a")
    h.start(0, hint=MARGIN + 100 * US)  # 100 us left after the margin: below min_window_ns
    assert port.calls == []


def test_no_grant_when_the_start_edge_arrives_too_late(h: Harness) -> None:
    port = h.add("a")
    h.now = 10 * MS  # the event was delivered 9.9 ms after the edge; the window is as good as gone
    h.sched.on_bubble(Edge(True, True, rank=0, slot=0, iteration=0, time_ns=100 * US, expected_duration_ns=LENGTH))
    assert port.calls == []


def test_no_grant_without_any_task(h: Harness) -> None:
    t = h.learn()
    h.start(t, iteration=2)  # nothing to grant to; nothing breaks
    late = h.add("late")  # a task arriving while the window is open gets it
    assert late.grants() == [("grant", 1, t + LENGTH - MARGIN)]


def test_higher_priority_task_is_granted_first(h: Harness) -> None:
    low = h.add("low", priority=1)
    high = h.add("high", priority=9)
    h.start(0, hint=LENGTH)
    assert high.grants() and not low.grants()


def test_the_task_with_the_least_recent_harvest_is_granted_among_equal_priorities(h: Harness) -> None:
    rich, poor = FakePort(), FakePort()
    h.sched.add_task(TaskSlot("a-rich", 0, rich, Counters()))
    h.sched.add_task(TaskSlot("b-poor", 0, poor, Counters()))
    h.sched.usage.add("a-rich", 50 * MS, 0)
    h.sched.usage.add("b-poor", 5 * MS, 0)
    h.start(0, hint=LENGTH)
    assert poor.grants() and not rich.grants()


def test_task_whose_step_does_not_fit_is_not_granted(h: Harness) -> None:
    big = h.add("big", priority=9, step_estimate_ns=20 * MS)
    small = h.add("small", step_estimate_ns=1 * MS)
    h.start(0, hint=LENGTH)
    assert small.grants() and not big.grants()


def test_only_one_window_is_open_at_a_time(h: Harness) -> None:
    a = h.add("a")
    b = h.add("b")
    h.start(0, rank=0, hint=LENGTH)
    h.start(1 * MS, rank=1, hint=LENGTH)  # another rank's bubble overlaps: no second window
    assert len(a.grants()) + len(b.grants()) == 1
    h.end(LENGTH, rank=0)
    h.start(20 * MS, rank=1, slot=1, hint=LENGTH)  # the first window is closed: a new one may open
    assert len(a.grants()) + len(b.grants()) == 2


# -- closing ---------------------------------------------------------------------------------------


def test_end_edge_closes_the_window_and_revokes_the_holder(h: Harness) -> None:
    port = h.add("a")
    t = h.learn()
    h.start(t, iteration=2)
    until = t + LENGTH - MARGIN
    until_timer = h.pending_timers()[0]
    h.end(t + LENGTH, iteration=2)
    assert port.revokes() == [("revoke", 1, until)]
    assert until_timer.cancelled


def test_until_timer_closes_the_window_if_the_end_edge_has_not_come(h: Harness) -> None:
    port = h.add("a")
    t = h.learn()
    h.start(t, iteration=2)
    until = t + LENGTH - MARGIN
    (timer,) = h.pending_timers()
    assert timer.at == until
    h.fire(timer)
    assert port.revokes() == [("revoke", 1, until)]


def test_window_closed_by_its_timer_frees_the_gpu_for_another_window(h: Harness) -> None:
    a = h.add("a")
    b = h.add("b")
    h.start(0, rank=0, hint=LENGTH)
    h.fire_next()  # rank 0's window reaches its until
    h.start(LENGTH, rank=1, hint=LENGTH)  # rank 0's END has not come, but its window is closed
    assert len(a.grants()) + len(b.grants()) == 2


def test_trainer_gone_closes_the_open_window(h: Harness) -> None:
    port = h.add("a")
    h.start(0, hint=LENGTH)
    h.sched.trainer_gone(0)
    assert port.revokes() == [("revoke", 1, LENGTH - MARGIN)]
    h.done("a", 1)
    (acct,) = h.accounts  # no END will come: accounted up to the predicted end
    assert acct.record.bubble_end_ns == LENGTH


def test_trainer_gone_of_another_rank_leaves_the_window_open(h: Harness) -> None:
    port = h.add("a")
    h.start(0, rank=0, hint=LENGTH)
    h.sched.trainer_gone(1)
    assert port.revokes() == []


def test_a_new_start_on_the_same_rank_closes_a_window_whose_end_was_lost(h: Harness) -> None:
    port = h.add("a")
    h.start(0, slot=0, hint=LENGTH)
    h.start(30 * MS, slot=1)  # slot 0's END never arrived
    assert port.revokes() == [("revoke", 1, LENGTH - MARGIN)]


# -- accounting ------------------------------------------------------------------------------------


def test_accounting_waits_for_window_done_then_splits_harvest_at_the_end_edge(h: Harness) -> None:
    h.add("a")
    t = h.learn()
    h.start(t, iteration=2)
    h.steps("a", 1, (t + 100 * US, 3 * MS), (t + 3100 * US, 3 * MS))
    h.steps("a", 1, (t + 6100 * US, 3 * MS))  # stops at t + 9.1 ms
    end = t + 8 * MS  # the bubble ended early
    h.end(end, iteration=2)
    assert h.accounts == []  # the holder has not reported WindowDone yet
    h.done("a", 1, idle_since_ns=t + 8 * MS + 50 * US)

    (acct,) = h.accounts
    c = acct.per_task["a"]
    assert c.steps == 3
    assert c.overrun_steps == 1
    assert c.overrun_ns == (t + 9100 * US) - end  # 1.1 ms of the last step ran after END
    assert c.harvested_ns == 9 * MS - 1100 * US  # step time before END
    assert c.windows == 1


def test_account_record_describes_the_window_and_each_share(h: Harness) -> None:
    h.add("a")
    t = h.learn()
    h.start(t, iteration=2)
    h.steps("a", 1, (t + 100 * US, 2 * MS), (t + 2100 * US, 2 * MS))
    h.end(t + LENGTH, iteration=2)
    h.done("a", 1, idle_since_ns=t + LENGTH + 70 * US)

    (acct,) = h.accounts
    rec = acct.record
    assert isinstance(rec, WindowRecord)
    assert (rec.window_id, rec.rank, rec.slot, rec.iteration) == (1, 0, 0, 2)
    assert (rec.bubble_start_ns, rec.bubble_end_ns) == (t, t + LENGTH)
    assert rec.until_ns == t + LENGTH - MARGIN
    assert rec.predicted_ns == LENGTH
    (share,) = rec.shares
    assert share.task_id == "a"
    assert share.first_step_ns == t + 100 * US
    assert share.idle_since_ns == t + LENGTH + 70 * US
    assert share.steps == 2
    assert share.busy_ns == 4 * MS
    assert share.overrun_ns == 0
    # The task saw the one bubble it had a share of; the GPU counts its bubbles at END, not here.
    assert acct.per_task["a"] == Counters(steps=2, harvested_ns=4 * MS, windows=1, bubbles=1, bubble_ns=LENGTH)
    assert acct.total == Counters(steps=2, harvested_ns=4 * MS, windows=1)


def test_window_closed_by_its_timer_is_accounted_only_once_the_end_edge_is_known(h: Harness) -> None:
    h.add("a")
    t = h.learn()
    h.start(t, iteration=2)
    h.fire_next()  # until reached
    h.steps("a", 1, (t + 100 * US, 9 * MS))  # stops at t + 9.1 ms
    h.done("a", 1)  # EXPIRED: until_ns passed
    assert h.accounts == []  # the END edge decides what was harvest and what was overrun
    h.end(t + 9 * MS, iteration=2)
    (acct,) = h.accounts
    assert acct.record.bubble_end_ns == t + 9 * MS
    assert acct.per_task["a"].harvested_ns == 8900 * US
    assert acct.per_task["a"].overrun_ns == 100 * US
    assert acct.per_task["a"].overrun_steps == 1


def test_step_starting_after_the_end_edge_is_all_overrun(h: Harness) -> None:
    h.add("a")
    h.start(0, hint=LENGTH)
    h.steps("a", 1, (1 * MS, 2 * MS), (6 * MS, 2 * MS))
    h.end(5 * MS)
    h.done("a", 1)
    c = h.accounts[0].per_task["a"]
    assert (c.harvested_ns, c.overrun_ns, c.overrun_steps, c.steps) == (2 * MS, 2 * MS, 1, 2)


def test_window_is_accounted_exactly_once(h: Harness) -> None:
    h.add("a")
    h.start(0, hint=LENGTH)
    h.end(LENGTH)
    h.done("a", 1)
    h.done("a", 1)  # a duplicate is ignored
    h.end(LENGTH + 1)  # so is an END without a START
    assert len(h.accounts) == 1


def test_scheduler_ledger_adds_up_windows_and_bubbles(h: Harness) -> None:
    h.add("a")
    t = h.learn()  # two bubbles of LENGTH, no windows
    h.start(t, iteration=2)
    h.steps("a", 1, (t, 1 * MS))
    h.end(t + LENGTH, iteration=2)
    h.done("a", 1)
    assert h.sched.gpu.bubbles == 3
    assert h.sched.gpu.bubble_ns == 3 * LENGTH
    assert h.sched.gpu.events == 6
    assert h.sched.gpu.windows == 1
    assert h.sched.gpu.steps == 1
    assert h.sched.gpu.harvested_ns == 1 * MS


def test_overrun_widens_the_margin_of_later_windows(h: Harness) -> None:
    port = h.add("a")
    h.start(0, hint=LENGTH)
    h.steps("a", 1, (1 * MS, 10 * MS))  # stops at 11 ms
    h.end(LENGTH)  # 1 ms overrun
    h.done("a", 1)
    assert h.sched.margin.margin_ns() == MARGIN + 1 * MS
    h.start(PERIOD, slot=1, hint=LENGTH)
    assert port.grants()[-1] == ("grant", 2, PERIOD + LENGTH - MARGIN - 1 * MS)


def test_window_done_updates_the_task_step_estimate(h: Harness) -> None:
    h.add("a")
    h.start(0, hint=LENGTH)
    h.end(LENGTH)
    h.done("a", 1, step_estimate_ns=3 * MS)
    assert h.sched.tasks["a"].step_estimate_ns == 3 * MS


def test_reports_for_unknown_windows_are_ignored(h: Harness) -> None:
    port = h.add("a")
    h.start(0, hint=LENGTH)
    h.steps("a", 99, (1 * MS, 1 * MS))
    h.done("a", 99)
    assert h.sched.tasks["a"].window_id == 1  # still holds its real window
    h.end(LENGTH)
    h.done("a", 1)
    assert h.accounts[0].per_task["a"].steps == 0
    assert port.revokes() == [("revoke", 1, LENGTH - MARGIN)]


# -- tail filling ----------------------------------------------------------------------------------


def test_no_fit_hands_the_rest_of_the_window_to_a_task_whose_step_fits(h: Harness) -> None:
    big = h.add("big", priority=9, step_estimate_ns=4 * MS)
    small = h.add("small", step_estimate_ns=1 * MS)
    huge = h.add("huge", step_estimate_ns=5 * MS)
    t = h.learn()
    h.start(t, iteration=2)
    until = t + LENGTH - MARGIN
    assert big.grants() == [("grant", 1, until)]

    h.steps("big", 1, (t, 4 * MS), (t + 4 * MS, 4 * MS))
    h.now = t + 8 * MS  # 1.8 ms left: another 4 ms step does not fit
    h.done("big", 1, step_estimate_ns=4 * MS)  # NO_FIT: its next step would not fit
    assert small.grants() == [("grant", 1, until)]  # the same window, the same deadline
    assert huge.grants() == []
    assert big.grants() == [("grant", 1, until)]  # not granted again

    h.steps("small", 1, (t + 8 * MS, 1 * MS))
    h.end(t + LENGTH, iteration=2)
    assert small.revokes() == [("revoke", 1, until)]
    assert big.revokes() == []
    h.done("small", 1)
    (acct,) = h.accounts
    assert [s.task_id for s in acct.record.shares] == ["big", "small"]
    assert acct.per_task["big"].harvested_ns == 8 * MS
    assert acct.per_task["small"].harvested_ns == 1 * MS
    assert acct.total.harvested_ns == 9 * MS
    assert acct.total.windows == 1


def test_no_fit_with_no_other_task_leaves_the_window_unused_until_its_end(h: Harness) -> None:
    port = h.add("a", step_estimate_ns=4 * MS)
    h.start(0, hint=LENGTH)
    h.now = 7 * MS
    h.done("a", 1)  # NO_FIT
    assert port.grants() == [("grant", 1, LENGTH - MARGIN)]
    h.end(LENGTH)
    assert port.revokes() == []  # nobody holds the window any more
    assert len(h.accounts) == 1


# -- task removal ----------------------------------------------------------------------------------


def test_removing_the_holder_of_an_open_window_grants_it_to_another_task(h: Harness) -> None:
    first = h.add("first", priority=5)
    second = h.add("second")
    h.start(0, hint=LENGTH)
    assert first.grants() and not second.grants()
    h.now = 2 * MS
    h.sched.remove_task("first")
    assert second.grants() == [("grant", 1, LENGTH - MARGIN)]
    assert "first" not in h.sched.tasks


def test_removing_the_holder_of_a_closed_window_lets_it_be_accounted(h: Harness) -> None:
    h.add("a")
    h.start(0, hint=LENGTH)
    h.steps("a", 1, (1 * MS, 2 * MS))
    h.end(LENGTH)
    assert h.accounts == []
    h.sched.remove_task("a")  # the worker died without WindowDone
    (acct,) = h.accounts
    assert acct.per_task["a"].steps == 1


def test_removing_an_unknown_task_is_harmless(h: Harness) -> None:
    h.sched.remove_task("nobody")
    assert h.sched.tasks == {}


# -- hang detection --------------------------------------------------------------------------------


def test_holder_that_does_not_report_window_done_in_time_is_reported_hung(h: Harness) -> None:
    h.add("a")
    h.start(0, hint=LENGTH)
    h.end(LENGTH)
    (hang_timer,) = h.pending_timers()
    assert hang_timer.at == LENGTH + HANG
    h.fire(hang_timer)
    assert h.hangs == [("a", 1)]
    assert h.sched.tasks["a"].counters.killed_steps == 1


def test_window_done_in_time_cancels_the_hang_timer(h: Harness) -> None:
    h.add("a")
    h.start(0, hint=LENGTH)
    h.end(LENGTH)
    h.done("a", 1)
    assert h.pending_timers() == []
    assert h.hangs == []
    assert h.sched.tasks["a"].counters.killed_steps == 0


def test_hang_timeout_grows_with_the_step_estimate(h: Harness) -> None:
    h.add("slow", step_estimate_ns=100 * MS)  # 20 x 100 ms = 2 s, longer than the 1 s timeout
    h.start(0, hint=200 * MS)
    h.end(200 * MS)
    (hang_timer,) = h.pending_timers()
    assert hang_timer.at == 200 * MS + 2_000 * MS


def test_removed_task_is_not_reported_hung(h: Harness) -> None:
    h.add("a")
    h.start(0, hint=LENGTH)
    h.end(LENGTH)
    (hang_timer,) = h.pending_timers()
    h.sched.remove_task("a")
    assert hang_timer.cancelled
    assert h.hangs == []


def test_end_edge_at_the_start_instant_still_revokes_the_holder(h: Harness) -> None:
    port = h.add("a")
    h.start(5 * MS, hint=LENGTH)
    h.end(5 * MS)  # a zero-length bubble (coarse clock): the GPU is needed again at once
    assert port.revokes() == [("revoke", 1, 5 * MS + LENGTH - MARGIN)]


def test_a_task_that_goes_idle_late_takes_the_window_that_opened_while_it_was_busy(h: Harness) -> None:
    # The holder of window 1 is still in a step after END; window 2 opens meanwhile with nobody
    # to take it. When the holder reports idle, it is granted window 2 at once (an event, not a poll).
    port = h.add("a", step_estimate_ns=1 * MS)
    t = h.learn()
    h.start(t, iteration=2)
    w1 = granted_window(port)
    h.end(t + LENGTH, iteration=2)
    h.start(t + PERIOD, iteration=3)
    assert len(port.grants()) == 1  # busy: not granted again yet
    h.now = t + PERIOD + 1 * MS
    h.done("a", w1, idle_since_ns=h.now)
    assert len(port.grants()) == 2 and port.grants()[-1][1] != w1


def test_the_trainers_free_memory_hint_is_kept_for_admission(h: Harness) -> None:
    h.sched.on_bubble(Edge(True, True, rank=0, slot=0, iteration=0, time_ns=1, free_memory_bytes=12 << 30))
    assert h.sched.trainer_free_memory_bytes == 12 << 30
    h.start(2 * PERIOD)  # an edge without the hint keeps the last one
    assert h.sched.trainer_free_memory_bytes == 12 << 30


# -- history (the Timeline RPC) -----------------------------------------------------------------------


def test_history_keeps_each_bubble_and_each_window_with_its_steps(h: Harness) -> None:
    port = h.add("a")
    t = h.learn()
    h.start(t, iteration=2)
    wid = granted_window(port)
    h.steps("a", wid, (t + 1 * MS, 2 * MS), (t + 3 * MS, 2 * MS))
    h.end(t + LENGTH, iteration=2)
    h.done("a", wid)
    bubbles, windows = h.sched.history()
    assert [(b.iteration, b.start_ns, b.end_ns) for b in bubbles] == [
        (0, 0, LENGTH), (1, PERIOD, PERIOD + LENGTH), (2, t, t + LENGTH)
    ]
    assert [b.predicted_ns for b in bubbles] == [0, 0, LENGTH]  # nothing predicted while the slot was learned
    (w,) = windows
    assert (w.window_id, w.bubble_start_ns, w.bubble_end_ns) == (wid, t, t + LENGTH)
    (share,) = w.shares
    assert list(share.step_spans) == [(t + 1 * MS, 2 * MS), (t + 3 * MS, 2 * MS)]
    assert share.steps == 2 and share.busy_ns == 4 * MS


def test_history_since_keeps_only_what_ended_later(h: Harness) -> None:
    h.learn(iterations=3)
    bubbles, _ = h.sched.history(since_ns=PERIOD + LENGTH)
    assert [b.iteration for b in bubbles] == [2]


def test_history_is_bounded(h: Harness) -> None:
    from freeride.agent.control.scheduler import HISTORY_BUBBLES

    h.learn(iterations=HISTORY_BUBBLES + 10)
    bubbles, _ = h.sched.history()
    assert len(bubbles) == HISTORY_BUBBLES
    assert bubbles[0].iteration == 10 and bubbles[-1].iteration == HISTORY_BUBBLES + 9


def test_history_gives_steps_to_the_newest_windows_within_its_budget(h: Harness) -> None:
    port = h.add("a")
    t = h.learn()
    for i in range(3):
        start = t + i * PERIOD
        h.start(start, iteration=2 + i)
        wid = int(port.grants()[-1][1])  # type: ignore[call-overload]
        h.steps("a", wid, *[(start + k * MS // 2, MS // 4) for k in range(4)])
        h.end(start + LENGTH, iteration=2 + i)
        h.done("a", wid)
    _, windows = h.sched.history(max_steps=9)
    assert [len(w.shares[0].step_spans) for w in windows] == [0, 4, 4]  # oldest first; it did not fit
    assert [w.shares[0].steps for w in windows] == [4, 4, 4]  # the counts stay


# -- recovering from stale evidence (found by tests/faults) ------------------------------------------


def test_a_margin_grown_past_every_bubble_decays_on_the_bubbles_it_skips(h: Harness) -> None:
    h.add("a")
    h.sched.margin.on_window(5 * MS)  # a burst of overruns: now no 2 ms bubble leaves room for a window
    short = 2 * MS
    t = h.learn(length=short)
    for i in range(200):
        h.start(t + i * PERIOD, iteration=2 + i)
        h.end(t + i * PERIOD + short, iteration=2 + i)
    assert h.sched.gpu.windows > 0  # skipped bubbles counted as clean ones until a window fit again


def test_a_task_kept_out_by_its_step_estimate_is_offered_a_window_now_and_then(h: Harness) -> None:
    stale = h.add("stale", step_estimate_ns=300 * MS)  # one slow step (a loaded machine) set its p95
    fits = h.add("fits", step_estimate_ns=1 * MS)
    for i in range(16):
        h.start(i * PERIOD, hint=LENGTH, iteration=i)
        h.done("stale", i + 1)  # NO_FIT (if probed: its step does not fit)
        h.done("fits", i + 1)
        h.end(i * PERIOD + LENGTH, iteration=i)
    assert len(stale.grants()) == 1  # a probe: its worker re-checks the estimate; a step runs only if it fits
    assert len(fits.grants()) == 16  # and the rest of that window went to the task that fits


def test_a_probe_never_jumps_ahead_of_a_higher_priority_task_that_fits(h: Harness) -> None:
    stale = h.add("stale", priority=1, step_estimate_ns=300 * MS)
    high = h.add("high", priority=9, step_estimate_ns=1 * MS)
    for i in range(40):
        h.start(i * PERIOD, hint=LENGTH, iteration=i)
        h.done("high", i + 1)  # done at once: the tail is free
        h.done("stale", i + 1)  # NO_FIT (if probed: its step does not fit)
        h.end(i * PERIOD + LENGTH, iteration=i)
    assert len(high.grants()) == 40
    probed = {g[1] for g in stale.grants()}
    assert probed and probed <= {g[1] for g in high.grants()}  # only tails the higher priority left


def test_a_wait_between_schedule_steps_is_counted_but_never_harvested(h: Harness) -> None:
    port = h.add("a")
    h.sched.on_bubble(Edge(True, False, rank=0, slot=0, iteration=0, time_ns=0, expected_duration_ns=LENGTH))
    h.sched.on_bubble(Edge(False, False, rank=0, slot=0, iteration=0, time_ns=LENGTH))
    assert port.calls == []
    assert (h.sched.gpu.events, h.sched.gpu.bubbles) == (2, 0)


@dataclass
class OrderedPort(FakePort):
    """A port that also writes its grants into one log shared by every task: who went first in a window."""

    task_id: str = ""
    log: list[tuple[int, str]] = field(default_factory=list)

    def grant(self, window_id: int, until_ns: int) -> None:
        super().grant(window_id, until_ns)
        self.log.append((window_id, self.task_id))


def test_a_probe_never_takes_a_window_before_a_higher_priority_task_that_fits(h: Harness) -> None:
    log: list[tuple[int, str]] = []
    for task_id, priority, estimate in (("stale", 1, 300 * MS), ("high", 9, 1 * MS)):
        h.sched.add_task(TaskSlot(task_id, priority, OrderedPort(task_id=task_id, log=log), Counters(), estimate))
    for i in range(40):
        h.start(i * PERIOD, hint=LENGTH, iteration=i)
        first = log[-1][1]
        if i == 0:  # busy to the END: no tail this time, so stale's count of passed-over dispatches turns odd
            h.end(i * PERIOD + LENGTH, iteration=i)  # and its probe falls due at a window's first dispatch
            h.done(first, i + 1)
            continue
        h.done(first, i + 1)  # the first holder goes idle: the tail goes to the other (a probe of stale)
        h.done("stale" if first == "high" else "high", i + 1)
        h.end(i * PERIOD + LENGTH, iteration=i)
    firsts = {wid: task for wid, task in reversed(log)}  # each window's first grant
    assert len(firsts) == 40 and set(firsts.values()) == {"high"}
    assert any(task == "stale" for _, task in log)  # the probe did happen, in tails only


# -- round 2, item 8: a task whose steps fit no bubble says so -------------------------------------


def test_a_task_whose_steps_fit_no_bubble_seen_is_told_once_and_the_word_is_taken_back_when_one_fits() -> None:
    said: list[tuple[str, int, int]] = []
    h = Harness()
    h.sched._on_fit = lambda task_id, estimate_ns, longest_ns: said.append((task_id, estimate_ns, longest_ns))
    big = h.add("big", step_estimate_ns=2_000 * MS)  # two-second steps; bubbles of 10 ms
    t = h.learn()

    def bubble(i: int, estimate_ns: int) -> bool:
        """One bubble; the worker answers a grant (a probe) with `estimate_ns`. True if it was granted one."""
        h.start(t + i * PERIOD, iteration=2 + i)
        grants = big.grants()
        for grant in grants:
            h.done("big", int(grant[1]), step_estimate_ns=estimate_ns)  # type: ignore[call-overload]
        big.calls.clear()
        h.end(t + i * PERIOD + LENGTH, iteration=2 + i)
        return bool(grants)

    probes = sum(bubble(i, 2_000 * MS) for i in range(40))  # passed over, probed, passed over again
    assert probes == 2 and said == [("big", 2_000 * MS, LENGTH)]  # said once
    i = 40
    while not bubble(i, 1 * MS):  # the next probe: its worker found its steps short now
        i += 1
    assert said[1:] == []  # a probe is not a window it fits (its worker may not have stepped)
    bubble(i + 1, 1 * MS)
    assert said[1:] == [("big", 0, 0)]  # granted a window it fits: the reason is taken back


# -- demand: whether each edge must wake the agent ---------------------------------------------------------------


def test_edges_are_wanted_from_the_first_schedulable_task_until_none_could_take_a_window() -> None:
    h = Harness()
    assert h.sched.wants_edges is False  # no task: the edges only feed the profile
    h.add("a")
    h.add("b")
    assert h.sched.wants_edges is True
    assert h.demand == [(True, False)]  # told once, before the answer changed (the agent reads its rings first)
    h.sched.stop_granting("a")
    assert h.sched.wants_edges is True  # b could still take a window
    h.sched.checkpointing("b", True)
    assert h.sched.wants_edges is False and h.demand[-1] == (False, True)
    h.sched.checkpointing("b", False)
    assert h.sched.wants_edges is True
    h.sched.remove_task("b")
    h.sched.remove_task("a")
    assert h.sched.wants_edges is False
    assert [wanted for wanted, _ in h.demand] == [True, False, True, False]


def test_a_stopping_task_that_holds_a_window_keeps_edges_wanted_until_it_gives_it_back() -> None:
    h = Harness()
    t = h.learn()
    h.add("a")
    h.start(t)
    wid = h.sched.tasks["a"].window_id
    assert wid  # granted
    h.sched.stop_granting("a")  # paused mid-window: its END must still revoke in time
    assert h.sched.wants_edges is True
    h.end(t + LENGTH)
    h.done("a", wid)
    assert h.sched.wants_edges is False


def test_event_delays_are_learned_only_from_edges_read_while_wanted() -> None:
    h = Harness()
    h.now = 70 * MS
    h.sched.on_bubble(Edge(True, True, 0, 0, 1, 20 * MS))  # read 50 ms late, on purpose: nothing wanted it
    assert list(h.sched.event_delays_ns) == []
    assert h.sched.gpu.events == 1  # yet it counts, and its bubble feeds the profile
    h.add("a")
    h.now = 100 * MS
    h.sched.on_bubble(Edge(True, True, 0, 0, 2, 100 * MS - 30 * US))
    assert list(h.sched.event_delays_ns) == [30 * US]


# -- issue 36 item 5: a task whose steps fit no bubble seen does not make the agent listen -----------------------


def _quiet_on_a_task_that_fits_no_bubble(estimate_ns: int) -> tuple[Harness, FakePort, int]:
    """Bubbles of LENGTH; one task of `estimate_ns` steps, passed over until it is told it fits none and probed (its
    worker answers the probe with the same estimate). Returns the harness, its port and the next bubble's index."""
    h = Harness()
    t = h.learn()
    big = h.add("big", step_estimate_ns=estimate_ns)
    assert h.sched.wants_edges is True  # not yet known to fit none: its windows are offered
    i = 0
    while not big.grants():  # passed over PROBE_AFTER times, then probed
        h.start(t + i * PERIOD, iteration=2 + i)
        h.end(t + i * PERIOD + LENGTH, iteration=2 + i)
        i += 1
        assert h.sched.wants_edges is True or big.grants()
    assert h.sched.tasks["big"].fits_none
    assert h.sched.wants_edges is True  # it holds the probe's window
    h.done("big", int(big.grants()[0][1]), step_estimate_ns=estimate_ns)  # type: ignore[call-overload]
    return h, big, i


def test_the_agent_stays_quiet_while_no_task_fits_any_bubble_seen_and_listens_once_a_longer_one_comes() -> None:
    h, big, i = _quiet_on_a_task_that_fits_no_bubble(50 * MS)  # 50 ms steps, 10 ms bubbles
    assert h.sched.wants_edges is False and h.demand[-1] == (False, True)  # the probe confirmed it: quiet
    t = 2 * PERIOD
    for k in range(i, i + 40):  # read late (quiet), the edges still teach the lengths: nothing changes
        h.start(t + k * PERIOD, iteration=2 + k)
        h.end(t + k * PERIOD + LENGTH, iteration=2 + k)
        for grant in big.grants():  # (a probe now and then, if the edges come in time: still no fit)
            h.done("big", int(grant[1]), step_estimate_ns=50 * MS)  # type: ignore[call-overload]
        big.calls.clear()
        assert h.sched.wants_edges is False
    (reprobe,) = h.pending_timers()  # the one timer: the re-probe, beyond this test's few seconds
    assert reprobe.at > h.now
    assert h.sched.bubbles.longest_ns == LENGTH
    for k in range(i + 40, i + 43):  # the slot's bubbles grow to 60 ms (a new schedule): long enough for its steps
        h.start(t + k * PERIOD, iteration=2 + k)
        h.end(t + k * PERIOD + 60 * MS, iteration=2 + k)
        if k < i + 42:  # one or two long bubbles are outliers (a stall): no window could count on them
            assert h.pending_timers() == [reprobe] and h.sched.wants_edges is False
    assert h.sched.wants_edges is False  # not while that END is delivered (the agent is reading a ring) ...
    (relisten,) = [timer for timer in h.pending_timers() if timer is not reprobe]
    assert relisten.at == h.now  # ... but at once after
    h.fire(relisten)
    assert h.sched.wants_edges is True and h.demand[-1] == (True, False)


def test_a_task_that_fits_none_is_offered_a_series_of_windows_again_later_and_less_often_each_time() -> None:
    """A load spike may have inflated the estimate, and only a step refreshes it: told it fits none, the task is not
    left out for good. A timer offers it PROBE_SERIES windows in a row (its worker declines that many before it steps
    anyway), then, if it still fits none, the next series comes twice as late."""
    h, big, i = _quiet_on_a_task_that_fits_no_bubble(50 * MS)
    big.calls.clear()
    t, delays = 2 * PERIOD, []
    for _ in range(3):
        (reprobe,) = h.pending_timers()
        delays.append(reprobe.at - h.now)
        h.fire(reprobe)
        assert h.sched.wants_edges is True  # the series: each edge matters again
        offered = 0
        while h.sched.wants_edges:
            h.start(t + i * PERIOD, iteration=2 + i)
            for grant in big.grants():  # declined: the same estimate
                offered += 1
                h.done("big", int(grant[1]), step_estimate_ns=50 * MS)  # type: ignore[call-overload]
            big.calls.clear()
            h.end(t + i * PERIOD + LENGTH, iteration=2 + i)
            i += 1
        assert offered == PROBE_SERIES
        t = h.now - i * PERIOD
    assert delays[1] >= 2 * delays[0] - PERIOD and delays[2] >= 2 * delays[1] - PERIOD  # backed off
    assert delays[0] >= 1_000 * MS  # and not soon: the quiet agent's saving stays
    # A series whose step comes back short: it fits again, and nothing more is scheduled for it.
    h.fire(h.pending_timers()[0])
    h.start(t + i * PERIOD, iteration=2 + i)
    (grant,) = big.grants()
    h.done("big", int(grant[1]), step_estimate_ns=1 * MS)  # type: ignore[call-overload]
    h.end(t + i * PERIOD + LENGTH, iteration=2 + i)
    i += 1
    h.start(t + i * PERIOD, iteration=2 + i)
    assert not h.sched.tasks["big"].fits_none and h.sched.tasks["big"].reprobe is None


def test_the_re_probe_series_is_as_long_as_the_worker_declines_before_it_steps_anyway() -> None:
    assert PROBE_SERIES == PROBE_AFTER_WINDOWS


def test_a_task_that_could_take_a_window_makes_the_quiet_agent_listen_at_once() -> None:
    h, _, _ = _quiet_on_a_task_that_fits_no_bubble(50 * MS)
    assert h.sched.wants_edges is False
    h.add("fits", step_estimate_ns=1 * MS)
    assert h.sched.wants_edges is True
    h.sched.remove_task("fits")
    assert h.sched.wants_edges is False
    h.add("unknown")  # no estimate yet: only a window can teach it
    assert h.sched.wants_edges is True


def test_a_probe_that_finds_the_steps_shorter_makes_the_agent_listen_again() -> None:
    h, _, _ = _quiet_on_a_task_that_fits_no_bubble(50 * MS)
    assert h.sched.wants_edges is False
    # a window it could not fit, answered late with a fresh estimate (a stale outlier dropped): it fits now
    h.sched.tasks["big"].window_id = 99
    h.done("big", 99, step_estimate_ns=1 * MS)
    assert h.sched.wants_edges is True


def test_a_task_that_finishes_inside_a_window_keeps_the_agent_listening_until_that_windows_end_is_accounted(
        h: Harness) -> None:
    """Its worker's Finished comes before the bubble's END: the last window's steps are counted at that END, which a
    quiet agent would read only when the trainer next writes its held edges (a task shown DONE with steps missing)."""
    port = h.add("a", step_estimate_ns=1 * MS)
    t = h.learn()
    h.start(t, iteration=2)
    wid = granted_window(port)
    h.steps("a", wid, (t + 100 * US, 1 * MS), (t + 1_200 * US, 1 * MS))
    h.done("a", wid)
    h.sched.remove_task("a")  # the task finished: no task left that could take a window
    assert h.sched.wants_edges is True  # yet the window it ran in waits for this bubble's END
    assert not h.accounts
    h.end(t + LENGTH, iteration=2)
    (books,) = h.accounts
    assert books.per_task["a"].steps == 2
    assert h.sched.wants_edges is False and h.demand[-1] == (False, True)  # then quiet: nothing left to hear
