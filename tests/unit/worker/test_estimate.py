"""Specification of the online step-time estimate (a high percentile of recent steps)."""

from __future__ import annotations

from freeride.worker.estimate import StepEstimator


def test_no_estimate_before_any_sample() -> None:
    assert StepEstimator().estimate_ns() is None


def test_first_sample_is_the_estimate() -> None:
    est = StepEstimator()
    est.add(1234)
    assert est.estimate_ns() == 1234


def test_p95_ignores_a_rare_outlier() -> None:
    est = StepEstimator(percentile=0.95, window=100, refresh_every=1)
    for _ in range(99):
        est.add(10)
    est.add(1000)
    assert est.estimate_ns() == 10


def test_p95_follows_frequent_long_steps() -> None:
    est = StepEstimator(percentile=0.95, window=100, refresh_every=1)
    for i in range(100):
        est.add(1000 if i % 10 == 0 else 10)  # 10 % of the steps are long
    assert est.estimate_ns() == 1000


def test_estimate_lies_between_the_median_and_the_maximum_of_recent_steps() -> None:
    est = StepEstimator(percentile=0.95, window=100, refresh_every=1)
    for v in range(1, 101):
        est.add(v)
    estimate = est.estimate_ns()
    assert estimate is not None
    assert 94 <= estimate <= 100


def test_old_samples_fall_out_of_the_estimate() -> None:
    est = StepEstimator(window=10, refresh_every=1)
    for _ in range(10):
        est.add(1000)
    for _ in range(10):
        est.add(10)
    assert est.estimate_ns() == 10


def test_sample_above_the_estimate_raises_it_at_once() -> None:
    est = StepEstimator(window=8, refresh_every=1000)
    for _ in range(8):
        est.add(10)
    assert est.estimate_ns() == 10
    est.add(50)
    assert est.estimate_ns() == 50


def test_shorter_samples_lower_the_estimate_only_at_the_next_refresh() -> None:
    est = StepEstimator(window=4, refresh_every=4)
    est.add(100)
    for _ in range(3):
        est.add(10)
        assert est.estimate_ns() == 100  # never late on the side that overruns
    est.add(10)  # fourth sample since the refresh: recompute over the last 4 (all 10)
    assert est.estimate_ns() == 10


def test_window_is_bounded_to_the_most_recent_samples() -> None:
    est = StepEstimator(window=5, refresh_every=1)
    for v in range(20):
        est.add(v)
    assert est.samples() == [15, 16, 17, 18, 19]


def test_load_restores_samples_and_estimate() -> None:
    original = StepEstimator(window=64)
    for v in [5, 7, 9, 11, 40]:
        original.add(v)
    restored = StepEstimator(window=64)
    restored.load(original.samples())
    assert restored.samples() == [5, 7, 9, 11, 40]
    assert restored.estimate_ns() == original.estimate_ns() == 40


def test_load_of_no_samples_leaves_a_fresh_estimator_without_estimate() -> None:
    est = StepEstimator()
    est.load([])
    assert est.estimate_ns() is None
    assert est.samples() == []


def test_load_keeps_only_the_window() -> None:
    est = StepEstimator(window=3)
    est.load([1, 2, 3, 4, 5])
    assert est.samples() == [3, 4, 5]


def test_warmup_steps_are_left_out_so_a_cold_first_step_cannot_lock_a_task_out() -> None:
    est = StepEstimator(warmup_steps=1, refresh_every=1)
    est.add(500_000_000)  # the first step of a process: lazy initialisation
    assert est.estimate_ns() is None  # still fits anything: the next step gets measured
    est.add(2_000_000)
    assert est.estimate_ns() == 2_000_000
    assert est.samples() == [2_000_000]


def test_forgetting_drops_a_lone_outlier_so_one_slow_step_does_not_rule_for_good() -> None:
    e = StepEstimator()
    for d in (1_000_000, 1_100_000, 300_000_000):
        e.add(d)
    assert e.estimate_ns() == 300_000_000
    assert e.forget_outlier()
    assert e.estimate_ns() == 1_100_000


def test_forgetting_keeps_steps_that_are_all_long() -> None:
    e = StepEstimator()
    for d in (80_000_000, 82_000_000, 85_000_000):
        e.add(d)
    assert not e.forget_outlier()
    assert e.estimate_ns() == 85_000_000


def test_a_lone_slow_sample_is_measured_again_once_and_then_kept() -> None:
    e = StepEstimator(warmup_steps=1)
    e.add(500_000_000)  # cold first step: left out
    e.add(300_000_000)  # one slow step under load: the only evidence
    assert e.forget_outlier()  # granted and not fitting: measure again rather than starve
    assert e.estimate_ns() is None  # fits anything: the next step is measured
    e.add(300_000_000)  # and really is long
    assert not e.forget_outlier()  # kept from now on: one overrun, not one per probe
    assert e.estimate_ns() == 300_000_000
