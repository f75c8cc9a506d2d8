"""The statistics of `freeride bench overhead` (freeride.tooling.bench.stats), on inputs computed by hand."""

from __future__ import annotations

import random
from typing import Any

import pytest

from freeride.tooling.bench.stats import (
    Interval,
    bootstrap_median,
    classify_segments,
    null_ratios,
    paired_ratios,
    segment_deltas,
    verdict,
)


def alternated(n: int, cost: float, base: float = 20.0, drift: float = 0.0) -> list[float]:
    """n steps, even ones plain, odd ones `cost` slower; a linear drift cancels in the neighbours' mean."""
    return [(base + drift * i) * (1 + cost * (i % 2)) for i in range(n)]


# --- paired_ratios -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("steps", "harvested", "expected"), [
    (alternated(9, 0.01), [1, 3, 5, 7], [0.01] * 4),
    (alternated(9, 0.01, drift=0.5), [1, 3, 5, 7], [0.01] * 4),  # linear drift cancels
    (alternated(8, 0.01), [1, 3, 5, 7], [0.01] * 3),  # 7 is last: no right neighbour
    ([20.0, 22.0, 20.0], [0, 1, 2], [0.1]),  # 0 and 2 at the ends are skipped
    ([10.0, 12.0, 30.0], [1], [-0.4]),  # 12 / 20 - 1
    ([20.0], [0], []),
    ([], [1], []),
])
def test_paired_ratios(steps: list[float], harvested: list[int], expected: list[float]) -> None:
    assert paired_ratios(steps, harvested) == pytest.approx(expected)


# --- null_ratios ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("steps", "plain", "expected"), [
    ([20.0] * 11, [0, 2, 4, 6, 8, 10], [0.0, 0.0]),  # p1=2 over (0,4), p3=6 over (4,8); p5=10 has no p6
    ([20.0] * 13, [0, 2, 4, 6, 8, 10, 12], [0.0, 0.0, 0.0]),  # 2, 6, 10
    # Picks the right indices: the plain steps at 2 and 6 are 10 % and 20 % up; harvested ones are ignored.
    ([20, 99, 22, 99, 20, 99, 24, 99, 20], [0, 2, 4, 6, 8], [0.1, 0.2]),
    ([20, 99, 22, 99, 20, 99, 24, 99, 20], [8, 6, 4, 2, 0], [0.1, 0.2]),  # order of the indices does not matter
    ([10.0, 0.0, 11.0, 0.0, 12.0], [0, 2, 4], [0.0]),  # linear drift over the plain ones cancels
    ([20.0] * 5, [0, 2], []),
    ([20.0] * 5, [], []),
])
def test_null_ratios(steps: list[float], plain: list[int], expected: list[float]) -> None:
    assert null_ratios(steps, plain) == pytest.approx(expected)


def test_null_ratios_of_an_alternated_run_is_zero_whatever_the_cost() -> None:
    steps = alternated(41, 0.05, drift=0.1)
    assert null_ratios(steps, range(0, 41, 2)) == pytest.approx([0.0] * 10)
    assert paired_ratios(steps, range(1, 41, 2)) == pytest.approx([0.05] * 20)


# --- bootstrap_median ----------------------------------------------------------------------------------------


def spread(n: int) -> list[float]:
    """n distinct values with the same spread whatever n: evenly over (-0.05, +0.05), interleaved (no ties: a
    median over many ties has an interval of zero width)."""
    return [((i * 7919 % n + 0.5) / n - 0.5) / 10 for i in range(n)]


@pytest.mark.parametrize(("values", "expected"), [
    ([], Interval(0.0, 0.0, 0.0, 0)),
    ([0.3], Interval(0.3, 0.3, 0.3, 1)),
    ([2.0, 2.0, 2.0], Interval(2.0, 2.0, 2.0, 3)),  # no spread, no width
])
def test_bootstrap_median_degenerate(values: list[float], expected: Interval) -> None:
    assert bootstrap_median(values) == expected


def test_bootstrap_median_is_deterministic_with_a_seed() -> None:
    values = spread(55)
    assert bootstrap_median(values, seed=3) == bootstrap_median(values, seed=3)
    assert bootstrap_median(values, seed=3).estimate == bootstrap_median(values, seed=4).estimate


@pytest.mark.parametrize("n", [11, 55, 1001])
def test_bootstrap_median_interval_contains_the_median(n: int) -> None:
    iv = bootstrap_median(spread(n))
    assert iv.n == n
    assert iv.estimate == pytest.approx(0.0)
    assert iv.low < iv.estimate < iv.high
    assert iv.high - iv.low < 0.1


def test_bootstrap_median_narrows_with_more_samples_of_the_same_spread() -> None:
    widths = [(lambda iv: iv.high - iv.low)(bootstrap_median(spread(n), draws=500)) for n in (31, 301, 3001)]
    assert widths[0] > widths[1] > widths[2] > 0


def test_bootstrap_median_of_a_shifted_sample_leaves_out_zero() -> None:
    iv = bootstrap_median([0.01 + v / 10 for v in spread(1101)])  # 1 % +- 0.5 %
    assert iv.estimate == pytest.approx(0.01)
    assert 0 < iv.low <= 0.01 <= iv.high


def test_interval_as_dict_rounds() -> None:
    iv = Interval(0.0031234567, -0.001, 0.0123456789, 40)
    assert iv.as_dict() == {"median": 0.00312, "low": -0.001, "high": 0.01235, "n": 40}
    assert iv.as_dict(3) == {"median": 0.003, "low": -0.001, "high": 0.012, "n": 40}


# --- classify_segments ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "expected"), [
    ([False, True, False, False, True, False],
     ["compute", "gap", "first", "compute", "gap", "first"]),
    ([True, False, True, True, False], ["gap", "first", "gap", "gap", "first"]),  # two gaps in a row: one first
    ([False, False, False], ["compute", "compute", "compute"]),
    ([True], ["gap"]),
    ([], []),
])
def test_classify_segments(flags: list[bool], expected: list[str]) -> None:
    assert classify_segments(flags) == expected


# --- segment_deltas ------------------------------------------------------------------------------------------

FLAGS = [False, True, False, False, True, False]  # compute, gap, first, compute, gap, first
KINDS = classify_segments(FLAGS)


def rows(n: int, first_extra: float) -> list[dict[str, Any]]:
    """n iterations: harvested (odd) ones' "first" segments `first_extra` ms longer each; compute drifts
    and the gaps drift linearly, so neither shows in a delta (a neighbours' mean cancels a linear drift)."""
    out = []
    for i in range(n):
        extra = first_extra * (i % 2)
        gap = 3.0 + 0.02 * i
        out.append({"seg_ms": [5.0 + 0.01 * i, gap, 1.0 + extra, 4.0 + 0.01 * i, gap, 1.5 + extra]})
    return out


def test_segment_deltas_finds_the_cost_of_the_first_segments() -> None:
    d = segment_deltas(rows(41, 0.1), KINDS, range(1, 41, 2))  # two "first" segments, 0.1 ms each
    assert list(d) == ["compute", "gap", "first", "total"]
    assert d["first"].estimate == pytest.approx(0.2)
    assert d["first"].low == pytest.approx(0.2) and d["first"].high == pytest.approx(0.2)
    assert d["gap"].estimate == pytest.approx(0.0)
    assert d["compute"].estimate == pytest.approx(0.0)
    assert d["total"].estimate == pytest.approx(0.2)
    assert {iv.n for iv in d.values()} == {20}


def test_segment_deltas_skips_the_ends_and_rows_that_do_not_line_up() -> None:
    rs = rows(9, 0.1)
    rs[4] = {"seg_ms": [1.0, 2.0]}  # 3 and 5 lose a neighbour
    rs[6] = {"step_ms": 12.0}  # 5 and 7 lose a neighbour
    d = segment_deltas(rs, KINDS, [0, 1, 3, 5, 7, 8, 9])  # 0, 8 at the ends, 9 out of range
    assert d["first"].n == 1 and d["first"].estimate == pytest.approx(0.2)  # 1 alone is left
    assert segment_deltas(rs, KINDS, [3, 5])["gap"] == Interval(0.0, 0.0, 0.0, 0)


# --- verdict -------------------------------------------------------------------------------------------------

NULL = Interval(0.0002, -0.001, 0.0015, 200)


@pytest.mark.parametrize(("effect", "null", "expected"), [
    (Interval(0.0031, 0.0012, 0.0050, 200), NULL,
     "meets: +0.31 % [0.12, 0.50] within the 0.50 % target; null +0.02 % [-0.10, 0.15]"),
    (Interval(0.0081, 0.0062, 0.0100, 200), NULL,
     "misses: +0.81 % [0.62, 1.00] above the 0.50 % target; null +0.02 % [-0.10, 0.15]"),
    (Interval(0.0041, 0.0012, 0.0070, 200), NULL,
     "unresolved: the interval straddles the target: +0.41 % [0.12, 0.70] against the 0.50 % target; "
     "null +0.02 % [-0.10, 0.15]"),
    (Interval(0.0031, 0.0012, 0.0050, 200), Interval(0.002, 0.001, 0.003, 200),
     "the null is off zero: drift or carry-over, the effect is not resolved: +0.31 % [0.12, 0.50]; "
     "null +0.20 % [0.10, 0.30]"),
    (Interval(-0.0031, -0.0050, -0.0012, 200), NULL,
     "meets: -0.31 % [-0.50, -0.12] within the 0.50 % target; null +0.02 % [-0.10, 0.15]"),
    (Interval(0.0, 0.0, 0.0, 0), NULL,
     "unresolved: no paired iterations; null +0.02 % [-0.10, 0.15]"),
])
def test_verdict(effect: Interval, null: Interval, expected: str) -> None:
    assert verdict(effect, null, 0.005) == expected


def noisy(n: int, cost: float, seed: int, outliers: float = 0.0) -> list[float]:
    """Alternated 20 ms steps (odd ones `cost` slower) with 3 % gaussian noise and, at rate `outliers`, a step
    30-100 % longer (a preempted one: right-skewed noise, as a loaded machine gives it)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = 20.0 * (1 + rng.gauss(0, 0.03)) * (1 + cost * (i % 2))
        if rng.random() < outliers:
            t *= 1 + rng.uniform(0.3, 1.0)
        out.append(t)
    return out


@pytest.mark.parametrize(("cost", "expected"), [(0.0, "meets: "), (0.002, "meets: "), (0.02, "misses: ")])
def test_verdict_end_to_end_on_gaussian_noise(cost: float, expected: str) -> None:
    steps = noisy(8001, cost, seed=1)
    effect = bootstrap_median(paired_ratios(steps, range(1, 8001, 2)), draws=500)
    null = bootstrap_median(null_ratios(steps, range(0, 8001, 2)), draws=500)
    assert verdict(effect, null, 0.005).startswith(expected)


def test_verdict_refuses_when_skewed_noise_biases_the_null() -> None:
    """With right-skewed noise the median of a step over its neighbours' mean leans below 0 (an outlier weighs
    fully on the step, half on the mean): the null shows that lean, and the verdict resolves nothing."""
    steps = noisy(8001, 0.0, seed=7, outliers=0.15)
    null = bootstrap_median(null_ratios(steps, range(0, 8001, 2)), draws=500)
    effect = bootstrap_median(paired_ratios(steps, range(1, 8001, 2)), draws=500)
    assert null.high < 0 and effect.high < 0
    assert verdict(effect, null, 0.005).startswith("the null is off zero")
