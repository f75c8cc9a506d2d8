"""Specification of a closed window's books (freeride.agent.control.accounting), a pure function over the window."""

from __future__ import annotations

from freeride.agent.control.accounting import account
from freeride.agent.control.windows import TaskShare, Window

MS = 1_000_000


def window(end_ns: int, *shares: TaskShare) -> Window:
    w = Window(id=7, rank=1, slot=2, iteration=3, start_ns=100 * MS, until_ns=109 * MS, predicted_ns=10 * MS,
               seen_ns=100 * MS + 5, end_ns=end_ns)
    w.shares.extend(shares)
    return w


def test_a_step_past_the_bubbles_end_is_overrun_the_rest_harvest() -> None:
    inside, past = (101 * MS, 2 * MS), (109 * MS, 3 * MS)  # the second ends 2 ms after the END at 110 ms
    books = account(window(110 * MS, TaskShare("a", [inside, past], granted_ns=100 * MS, woke_ns=100 * MS + 1)))
    a = books.per_task["a"]
    assert (a.steps, a.windows, a.bubbles, a.bubble_ns) == (2, 1, 1, 10 * MS)
    assert (a.harvested_ns, a.overrun_ns, a.overrun_steps) == (3 * MS, 2 * MS, 1)
    assert books.steps_overrun_ns == 2 * MS
    share, = books.record.shares
    assert (share.task_id, share.steps, share.busy_ns, share.overrun_ns, share.first_step_ns) == (
        "a", 2, 5 * MS, 2 * MS, 101 * MS)
    assert (books.record.bubble_end_ns, books.record.window_id, books.record.seen_ns) == (110 * MS, 7, 100 * MS + 5)


def test_a_hung_steps_time_to_its_kill_is_overrun_the_margin_does_not_learn_from_it() -> None:
    hung = TaskShare("b", [(102 * MS, 1 * MS)], killed_at_ns=115 * MS)
    books = account(window(110 * MS, hung))
    b = books.per_task["b"]
    assert (b.harvested_ns, b.overrun_ns, b.overrun_steps) == (1 * MS, 5 * MS, 1)
    assert books.steps_overrun_ns == 0


def test_a_lost_end_is_accounted_up_to_the_prediction_and_the_gpu_counts_the_window_not_the_bubble() -> None:
    books = account(window(0, TaskShare("a", [(101 * MS, 1 * MS)]), TaskShare("c", [(103 * MS, 2 * MS)]),
                           TaskShare("a", [(106 * MS, 1 * MS)])))
    assert books.record.bubble_end_ns == 110 * MS  # start + predicted
    assert (books.per_task["a"].windows, books.per_task["a"].steps, books.per_task["c"].steps) == (2, 2, 1)
    assert (books.total.windows, books.total.bubbles, books.total.bubble_ns) == (1, 0, 0)
    assert books.total.harvested_ns == 4 * MS and books.total.steps == 3
