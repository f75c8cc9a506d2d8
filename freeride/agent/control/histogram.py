"""Bubble lengths as cumulative-histogram bucket counts, kept by the scheduler itself.

Observing is a bisect and two integer additions on the agent's loop: no lock, no
prometheus-client object on the control path. The metrics endpoint copies the counts at scrape time.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

# 1 ms .. 10 s, 1-2-5 steps: pipeline bubbles are milliseconds to seconds long.
BUBBLE_BOUNDS_NS: tuple[int, ...] = (*(m * 10**e for e in range(6, 10) for m in (1, 2, 5)), 10**10)


@dataclass
class Histogram:
    bounds_ns: tuple[int, ...] = BUBBLE_BOUNDS_NS
    counts: list[int] = field(default_factory=list)  # per bucket (not cumulative); last one is +Inf
    sum_ns: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds_ns) + 1)

    def observe(self, value_ns: int) -> None:
        self.counts[bisect_left(self.bounds_ns, value_ns)] += 1
        self.sum_ns += value_ns

    def copy(self) -> Histogram:
        return Histogram(self.bounds_ns, list(self.counts), self.sum_ns)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound in seconds, count of values <= it), ending with (+inf, total)."""
        out, running = [], 0
        for bound, count in zip((*(b / 1e9 for b in self.bounds_ns), float("inf")), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out
