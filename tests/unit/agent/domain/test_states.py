"""Specification of the task state machine and the harvest counters."""

from __future__ import annotations

import itertools
from dataclasses import fields

import pytest

from freeride.agent.domain.model import _ALLOWED, Counters, TaskState, check_transition
from freeride.errors import FreerideError, InvalidStateError

S = TaskState
LIVE = (S.STARTING, S.READY, S.RUNNING)
TERMINAL = (S.DONE, S.FAILED, S.CANCELLED)


def allowed(a: TaskState, b: TaskState) -> bool:
    try:
        check_transition(a, b)
    except InvalidStateError:
        return False
    return True


@pytest.mark.parametrize(("current", "new"), list(itertools.product(TaskState, TaskState)),
                         ids=lambda s: s.value)
def test_transition_is_allowed_iff_listed_in_the_table(current: TaskState, new: TaskState) -> None:
    assert allowed(current, new) == (new in _ALLOWED[current])


def test_table_covers_every_state() -> None:
    assert set(_ALLOWED) == set(TaskState)


@pytest.mark.parametrize(
    "path",
    [
        [S.SUBMITTED, S.STARTING, S.READY, S.RUNNING, S.READY, S.RUNNING, S.DONE],
        [S.SUBMITTED, S.STARTING, S.READY, S.RUNNING, S.FAILED],
        [S.SUBMITTED, S.STARTING, S.READY, S.CANCELLED],
        [S.SUBMITTED, S.STARTING, S.READY, S.RUNNING, S.STARTING, S.READY],  # a restart
        [S.SUBMITTED, S.STARTING, S.READY, S.RUNNING, S.PAUSED, S.SUBMITTED, S.STARTING],  # pause, resume
        [S.SUBMITTED, S.PAUSED, S.CANCELLED],
    ],
    ids=["done", "failed", "cancelled", "restart", "pause-resume", "pause-cancel"],
)
def test_documented_lifecycles_are_allowed(path: list[TaskState]) -> None:
    for a, b in itertools.pairwise(path):
        check_transition(a, b)  # raises if not allowed


@pytest.mark.parametrize("state", [S.SUBMITTED, *LIVE])
def test_every_live_or_waiting_state_can_be_paused_cancelled_or_failed(state: TaskState) -> None:
    assert allowed(state, S.PAUSED)
    assert allowed(state, S.CANCELLED)
    assert allowed(state, S.FAILED)


@pytest.mark.parametrize("state", TERMINAL)
def test_terminal_states_allow_no_transition(state: TaskState) -> None:
    assert state.terminal
    assert not any(allowed(state, new) for new in TaskState)


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (S.SUBMITTED, S.DONE),
        (S.SUBMITTED, S.READY),
        (S.SUBMITTED, S.RUNNING),
        (S.PAUSED, S.RUNNING),
        (S.PAUSED, S.STARTING),
        (S.PAUSED, S.DONE),
        (S.PAUSED, S.PAUSED),
        (S.DONE, S.SUBMITTED),
        (S.CANCELLED, S.STARTING),
        (S.FAILED, S.FAILED),
    ],
)
def test_forbidden_transitions_raise_invalid_state_error(current: TaskState, new: TaskState) -> None:
    with pytest.raises(InvalidStateError) as info:
        check_transition(current, new)
    assert current.value in str(info.value)
    assert new.value in str(info.value)


def test_paused_task_can_only_be_resumed_or_cancelled() -> None:
    assert {new for new in TaskState if allowed(S.PAUSED, new)} == {S.SUBMITTED, S.CANCELLED}


def test_invalid_state_error_is_a_freeride_error() -> None:
    assert issubclass(InvalidStateError, FreerideError)


def test_active_means_a_worker_exists_or_is_starting() -> None:
    assert {s for s in TaskState if s.active} == set(LIVE)
    assert {s for s in TaskState if s.terminal} == set(TERMINAL)


def test_counters_add_sums_every_field() -> None:
    names = [f.name for f in fields(Counters)]
    a = Counters(**{n: i + 1 for i, n in enumerate(names)})
    b = Counters(**{n: 100 * (i + 1) for i, n in enumerate(names)})
    a.add(b)
    assert a == Counters(**{n: 101 * (i + 1) for i, n in enumerate(names)})
    assert b == Counters(**{n: 100 * (i + 1) for i, n in enumerate(names)})  # the argument is unchanged


def test_counters_add_of_zero_counters_changes_nothing() -> None:
    c = Counters(steps=3, harvested_ns=5, killed_steps=1)
    c.add(Counters())
    assert c == Counters(steps=3, harvested_ns=5, killed_steps=1)
