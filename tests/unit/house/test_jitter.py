"""The timing tests' judge (tests/support/jitter.py): a quiet machine's timing problem fails, a loaded one's skips."""

from __future__ import annotations

import os

import pytest
from support import jitter
from support.jitter import LOADED_OVERSHOOT_MS, Jitter, assert_within, judge, loaded_past_cores


def test_the_overshoot_is_per_sleep_and_never_negative() -> None:
    j = Jitter.of_slices([(130.0, 120.0, 10), (119.0, 120.0, 10), (124.0, 120.0, 4)])
    assert j.overshoots_ms == (1.0, 0.0, 1.0)
    assert j.median_ms == 1.0 and j.p90_ms == 1.0


def test_no_problem_is_judged_nothing() -> None:
    judge([], Jitter((50.0,)), "anything")  # returns: nothing to say, however loaded


def test_a_quiet_machines_timing_problem_fails_naming_the_jitter() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"bubbles \(its sleeps overshot by 0\.10 ms"):
        judge(["rank 0: short"], Jitter((0.1,) * 10), "bubbles")


def test_a_loaded_machine_says_it_is_too_loaded_to_judge_with_the_figure() -> None:
    with pytest.raises(pytest.skip.Exception, match=r"too loaded to judge bubbles: its sleeps overshot by 4\.00 ms"):
        judge(["rank 0: short"], Jitter((4.0,) * 10), "bubbles")
    assert Jitter((LOADED_OVERSHOOT_MS,) * 10).too_loaded is False  # the bound itself is still quiet


def test_a_latency_within_its_limit_measures_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jitter, "wakeup_overshoot_ms", lambda: pytest.fail("measured the machine for nothing"))
    assert_within(0.5, 1.0, "a call")


@pytest.mark.parametrize(("late_ms", "outcome", "words"), [
    (3.0, pytest.skip.Exception, r"too loaded to judge a call: 2\.500 ms against 1 ms, while a 1 ms sleep wakes 3\.0"),
    (0.1, pytest.fail.Exception, r"a call: 2\.500 ms, over 1 ms \(a 1 ms sleep wakes 0\.10 ms late"),
])
def test_a_latency_over_its_limit_skips_on_a_late_waking_machine_and_fails_on_a_prompt_one(
    monkeypatch: pytest.MonkeyPatch, late_ms: float, outcome: type[BaseException], words: str
) -> None:
    monkeypatch.setattr(jitter, "wakeup_overshoot_ms", lambda: late_ms)
    with pytest.raises(outcome, match=words):
        assert_within(2.5, 1.0, "a call")


@pytest.mark.parametrize(("cores", "workers", "load", "loaded"), [
    (2, "", 2.9, False),  # the serial run: past the cores by less than a core
    (2, "", 3.0, True),
    (2, "2", 2.5, False),  # a worker per core: their own load is no reason to skip
    (2, "3", 3.3, False),  # three workers on an idle 2-core machine read 2.5-3.2
    (2, "3", 4.0, True),
    (16, "16", 12.0, False),
])
def test_the_load_that_excuses_a_failure_is_past_the_cores_and_the_suites_own_workers(
    monkeypatch: pytest.MonkeyPatch, cores: int, workers: str, load: float, loaded: bool
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", workers)
    said, figures = loaded_past_cores()
    assert said is loaded and f"at load {load:.1f} on {cores} cores" in figures
