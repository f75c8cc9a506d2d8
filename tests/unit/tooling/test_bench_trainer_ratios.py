"""The paired ratios of `freeride bench trainer` (freeride.tooling.bench.trainer), on step times made up here."""

from __future__ import annotations

import random

import pytest

from freeride.tooling.bench.trainer import _balanced, _paired


def steps(cost: float, seed: int, n: int = 40001) -> list[float]:
    """Alternated steps (odd ones instrumented, `cost` slower) of 20 ms, with noise and rare long outliers (a
    preempted step is 30-100 % longer), as a loaded machine gives them."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = 20.0 * (1 + rng.gauss(0, 0.03)) * (1 + cost * (i % 2))
        if rng.random() < 0.15:
            t *= 1 + rng.uniform(0.3, 1.0)
        out.append(t)
    return out


@pytest.mark.parametrize("cost", [0.0, 0.004, 0.02])
def test_the_balanced_ratio_finds_the_cost_where_the_paired_median_leans_below_it(cost: float) -> None:
    s = steps(cost, seed=7)
    paired, inverse = _paired(s, 1, 3), _paired(s, 1, 4)
    null = _paired(s, 2, 4)
    leaning = sorted(paired)[len(paired) // 2]
    assert leaning < 1 + cost - 0.005  # outliers in a neighbour lift the mean: the paired median leans low ...
    assert sorted(null)[len(null) // 2] < 0.995  # ... and so does the A/A figure
    assert _balanced(paired, inverse) == pytest.approx(1 + cost, abs=0.0015)  # the balanced ratio does not
