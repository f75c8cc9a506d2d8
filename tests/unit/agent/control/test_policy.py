"""Specification of the window policy: who gets (the rest of) a bubble window."""

from __future__ import annotations

import itertools

from freeride.agent.control.policy import Candidate, choose

MS = 1_000_000


def cand(
    task_id: str,
    priority: int = 0,
    harvested_ns: int = 0,
    step_estimate_ns: int | None = 1 * MS,
    idle: bool = True,
) -> Candidate:
    return Candidate(task_id, priority, harvested_ns, step_estimate_ns, idle)


def chosen_id(
    candidates: list[Candidate], remaining_ns: int = 10 * MS, exclude: set[str] | None = None
) -> str | None:
    pick = choose(candidates, remaining_ns, exclude or set())
    return None if pick is None else pick.task_id


def test_higher_priority_wins_even_with_more_harvested_time() -> None:
    assert chosen_id([cand("a", priority=0), cand("b", priority=5, harvested_ns=10**12)]) == "b"


def test_among_equal_priorities_the_least_harvested_task_wins() -> None:
    tasks = [
        cand("a", harvested_ns=30 * MS),
        cand("b", harvested_ns=10 * MS),
        cand("c", harvested_ns=20 * MS),
    ]
    assert chosen_id(tasks) == "b"


def test_task_whose_step_does_not_fit_is_skipped_for_a_shorter_one() -> None:
    tasks = [
        cand("big", priority=9, step_estimate_ns=8 * MS),
        cand("small", priority=0, step_estimate_ns=2 * MS),
    ]
    assert chosen_id(tasks, remaining_ns=10 * MS) == "big"
    assert chosen_id(tasks, remaining_ns=5 * MS) == "small"  # the tail of the bubble


def test_step_exactly_filling_the_remaining_time_fits() -> None:
    assert chosen_id([cand("a", step_estimate_ns=5 * MS)], remaining_ns=5 * MS) == "a"


def test_task_without_an_estimate_fits_any_remaining_time() -> None:
    assert chosen_id([cand("new", step_estimate_ns=None)], remaining_ns=1) == "new"


def test_excluded_tasks_are_skipped() -> None:
    tasks = [cand("a", priority=5), cand("b")]
    assert chosen_id(tasks, exclude={"a"}) == "b"


def test_busy_tasks_are_skipped() -> None:
    tasks = [cand("a", priority=5, idle=False), cand("b")]
    assert chosen_id(tasks) == "b"


def test_returns_none_when_nothing_fits() -> None:
    tasks = [
        cand("busy", idle=False),
        cand("excluded"),
        cand("too-long", step_estimate_ns=20 * MS),
    ]
    assert chosen_id(tasks, remaining_ns=10 * MS, exclude={"excluded"}) is None


def test_returns_none_without_candidates() -> None:
    assert chosen_id([]) is None


def test_ties_are_broken_by_task_id_whatever_the_input_order() -> None:
    tasks = [cand("2"), cand("1"), cand("3")]
    for order in itertools.permutations(tasks):
        assert chosen_id(list(order)) == "1"


def test_accepts_any_iterable() -> None:
    assert chosen_id(c for c in [cand("x"), cand("y", priority=1)]) == "y"  # type: ignore[arg-type]
