"""The statistics of `freeride bench overhead`: can a slowdown of half a percent be told from noise?

The bench alternates iterations: even ones plain, odd ones harvested. Each harvested iteration is set against
the mean of its two plain neighbours (`paired_ratios`), so slow drifts (clocks, temperature, the allocator)
cancel; an A/A null made of plain iterations alone (`null_ratios`) says how wide the same figure is when
nothing differs. Each is summed up as its median with a seeded percentile-bootstrap interval
(`bootstrap_median`), and `verdict` compares the two with the target. `segment_deltas` splits the cost over
the kinds of segment of an iteration (gaps, the first compute segment after a gap, other compute), in ms.

Pure functions over plain numbers, standard library only.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GAP, FIRST, COMPUTE, TOTAL = "gap", "first", "compute", "total"


@dataclass(frozen=True)
class Interval:
    """A median and its bootstrap 95 % interval, over `n` values."""

    estimate: float  # the median
    low: float  # the bootstrap 2.5 % percentile of the median
    high: float  # the 97.5 % one
    n: int

    def as_dict(self, digits: int = 5) -> dict[str, float | int]:
        return {"median": round(self.estimate, digits), "low": round(self.low, digits),
                "high": round(self.high, digits), "n": self.n}


def _ratio(value: float, before: float, after: float) -> float | None:
    """`value` over the mean of `before` and `after`, less 1; None where that mean is not positive."""
    mean = (before + after) / 2
    return value / mean - 1 if mean > 0 else None


def paired_ratios(steps: Sequence[float], harvested: Sequence[int]) -> list[float]:
    """Each harvested iteration `i` over the mean of its neighbours `i-1` and `i+1` (plain ones, as the bench
    alternates), less 1: 0.01 is 1 % slower. Iterations at either end (a neighbour missing) are left out, and so
    is any whose neighbours' mean is not positive."""
    out = []
    for i in harvested:
        if 1 <= i < len(steps) - 1:
            r = _ratio(steps[i], steps[i - 1], steps[i + 1])
            if r is not None:
                out.append(r)
    return out


def null_ratios(steps: Sequence[float], plain: Sequence[int]) -> list[float]:
    """The A/A null of `paired_ratios`, from the plain iterations alone.

    In the order of the plain indices p0 < p1 < p2 < ..., every other one (p1, p3, ...) stands for a harvested
    iteration and is set against the mean of its plain neighbours in that list ((p0, p2), (p2, p4), ...).
    Those neighbours are 2 iterations away, not 1, so more drift gets in between: a conservative (wider) null
    than the noise `paired_ratios` actually carries."""
    p = sorted(set(plain))
    out = []
    for k in range(1, len(p) - 1, 2):
        a, b, c = p[k - 1], p[k], p[k + 1]
        if a >= 0 and c < len(steps):
            r = _ratio(steps[b], steps[a], steps[c])
            if r is not None:
                out.append(r)
    return out


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The `q` quantile of sorted values, interpolated linearly between ranks."""
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def bootstrap_median(values: Sequence[float], *, draws: int = 2000, seed: int = 0) -> Interval:
    """The median of `values` with a percentile-bootstrap 95 % interval: `draws` resamples (with replacement,
    of the same size) from a generator seeded with `seed`, so the same input gives the same interval. No values:
    all zeros; one value: that value thrice (no spread to resample)."""
    vals = [float(v) for v in values]
    n = len(vals)
    if n == 0:
        return Interval(0.0, 0.0, 0.0, 0)
    est = statistics.median(vals)
    if n == 1 or draws < 1:
        return Interval(est, est, est, n)
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(vals, k=n)) for _ in range(draws))
    return Interval(est, _quantile(medians, 0.025), _quantile(medians, 0.975), n)


def classify_segments(bubble_flags: Sequence[bool]) -> list[str]:
    """Each segment of an iteration by its bubble flag: a bubble is a "gap", the first non-bubble segment after
    one is "first" (it pays for whatever the gap left behind), any other is "compute" (the iteration's very first
    segment included: nothing came before it in the iteration)."""
    out = []
    for j, bubble in enumerate(bubble_flags):
        if bubble:
            out.append(GAP)
        elif j > 0 and bubble_flags[j - 1]:
            out.append(FIRST)
        else:
            out.append(COMPUTE)
    return out


def _sums(row: Mapping[str, Any] | None, kinds: Sequence[str]) -> dict[str, float] | None:
    """The row's segments summed per class (and "total"); None where it has no `seg_ms` aligned with `kinds`."""
    seg = row.get("seg_ms") if row is not None else None
    if seg is None or len(seg) != len(kinds):
        return None
    sums = dict.fromkeys(kinds, 0.0)
    for kind, ms in zip(kinds, seg, strict=True):
        sums[kind] += float(ms)
    sums[TOTAL] = float(sum(seg))
    return sums


def segment_deltas(rows: Sequence[Mapping[str, Any]], kinds: Sequence[str], harvested: Sequence[int], *,
                   draws: int = 2000, seed: int = 0) -> dict[str, Interval]:
    """What a harvested iteration adds per class of segment, in ms, with bootstrap intervals.

    `rows[i]["seg_ms"]` holds iteration i's segment durations (ms), aligned with `kinds` (see
    `classify_segments`). For each harvested i whose neighbours i-1 and i+1 exist with as many segments as
    `kinds`: delta_c = sum_c(i) - mean(sum_c(i-1), sum_c(i+1)). One entry per class in `kinds` (in order of
    first appearance), then "total" (all segments)."""
    classes = list(dict.fromkeys(kinds))
    deltas: dict[str, list[float]] = {c: [] for c in [*classes, TOTAL]}
    for i in harvested:
        if not 1 <= i < len(rows) - 1:
            continue
        here, before, after = (_sums(rows[j], kinds) for j in (i, i - 1, i + 1))
        if here is None or before is None or after is None:
            continue
        for c, ds in deltas.items():
            ds.append(here[c] - (before[c] + after[c]) / 2)
    return {c: bootstrap_median(ds, draws=draws, seed=seed) for c, ds in deltas.items()}


def _pct(x: Interval) -> str:
    return f"{x.estimate * 100:+.2f} % [{x.low * 100:.2f}, {x.high * 100:.2f}]"


def verdict(effect: Interval, null: Interval, target: float) -> str:
    """One sentence on the effect (a ratio: 0.005 is 0.5 %) against `target` (a ratio too), given the null.

    A null whose interval leaves out 0 means drift or carry-over between neighbours: nothing is resolved then.
    Otherwise the effect meets the target when its whole interval lies at or below it, misses it when its whole
    interval lies above it, and is unresolved when the interval straddles it."""
    tail = f"; null {_pct(null)}"
    goal = f"{target * 100:.2f} % target"
    if effect.n == 0:
        return f"unresolved: no paired iterations{tail}"
    if not null.low <= 0 <= null.high:
        return f"the null is off zero: drift or carry-over, the effect is not resolved: {_pct(effect)}{tail}"
    if effect.high <= target:
        return f"meets: {_pct(effect)} within the {goal}{tail}"
    if effect.low > target:
        return f"misses: {_pct(effect)} above the {goal}{tail}"
    return f"unresolved: the interval straddles the target: {_pct(effect)} against the {goal}{tail}"
