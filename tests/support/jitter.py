"""The machine's own jitter, measured in the very run a timing test judges: how far that run's sleeps overshot.

A test that judges real time (a bubble within 20 % of theory, a prediction within 10 %) checks everything else
first, then hands its timing problems to `judge`: on a machine whose sleeps overshot by more than the test's
tolerance can absorb, it says so and skips, with the figure measured; on a quiet one it fails. A loaded
workstation sees "too loaded to judge, sleeps overshot 4.2 ms each", never a bare assertion about a bubble.
A latency (a call's p99, its median) is judged by `assert_within`, which measures the machine's wake-up lateness
only when the figure is over its limit.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NoReturn

import pytest

# A sleep that overshoots by this much (p90, per sleep) moves a bubble that spans a few other ranks' slices by
# about the tests' 6 ms tolerance: beyond it the machine, not the product, decides the lengths measured.
LOADED_OVERSHOOT_MS = 1.0


@dataclass(frozen=True)
class Jitter:
    overshoots_ms: tuple[float, ...]  # per measured slice: how much each of its sleeps overshot, on average

    @classmethod
    def of_slices(cls, slices: Iterable[tuple[float, float, int]]) -> Jitter:
        """From (measured ms, nominal ms, sleeps in it) of each slice of compute the run timed."""
        return cls(tuple(max(0.0, measured - nominal) / max(1, sleeps) for measured, nominal, sleeps in slices))

    @property
    def p90_ms(self) -> float:
        if not self.overshoots_ms:
            return 0.0
        ordered = sorted(self.overshoots_ms)
        return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.overshoots_ms) if self.overshoots_ms else 0.0

    @property
    def too_loaded(self) -> bool:
        return self.p90_ms > LOADED_OVERSHOOT_MS

    def __str__(self) -> str:
        return (f"its sleeps overshot by {self.median_ms:.2f} ms each (median), {self.p90_ms:.2f} ms (p90) over "
                f"{len(self.overshoots_ms)} slices; a quiet machine: under {LOADED_OVERSHOOT_MS:g} ms")


def judge(problems: list[str], jitter: Jitter, what: str) -> None:
    """Fail with `problems` on a quiet machine; on one too loaded to judge `what`, skip saying so and why."""
    if not problems:
        return
    if jitter.too_loaded:
        pytest.skip(f"this machine is too loaded to judge {what}: {jitter}; first problem: {problems[0]}")
    pytest.fail(f"{what} ({jitter}): " + "; ".join(problems))


def wakeup_overshoot_ms(samples: int = 50, sleep_ms: float = 1.0) -> float:
    """How late a short sleep wakes right now, in ms (the 90th percentile over `samples`): the floor under any
    latency this process can measure. A measurement of the machine, not a wait for something."""
    late = []
    for _ in range(samples):
        t0 = time.perf_counter()
        time.sleep(sleep_ms / 1e3)
        late.append((time.perf_counter() - t0) * 1e3 - sleep_ms)
    late.sort()
    return late[int(0.9 * (len(late) - 1))]


def assert_within(measured_ms: float, limit_ms: float, what: str) -> None:
    """`what` (`measured_ms`) is at most `limit_ms`. Where it is not, the machine's wake-up lateness is measured then
    and there: a quarter of the budget or more (1 ms at least) and the test skips with both figures (the call was
    slow because the machine was); less, and it fails, saying the machine was not the cause."""
    if measured_ms <= limit_ms:
        return
    late = wakeup_overshoot_ms()
    if late >= max(limit_ms / 4, 1.0):
        pytest.skip(f"this machine is too loaded to judge {what}: {measured_ms:.3f} ms against {limit_ms:g} ms, "
                    f"while a 1 ms sleep wakes {late:.1f} ms late (p90)")
    pytest.fail(f"{what}: {measured_ms:.3f} ms, over {limit_ms:g} ms (a 1 ms sleep wakes {late:.2f} ms late, p90: "
                f"the machine is not the cause)")


def loaded_past_cores() -> tuple[bool, str]:
    """Whether other work loads the machine past its cores, and the figures said either way. The suite's own
    processes count up to its workers (xdist's, one per core or one more on an idle machine: ./dev.sh): the load
    average must be past the cores and those workers by a whole core. (At the cores alone, a quiet machine running
    three workers on two cores reads 2.5-3.2, and a real failure there would have been skipped as the load's.)"""
    cores, load = os.cpu_count() or 1, os.getloadavg()[0]
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    limit = max(cores, workers) + 1
    return load >= limit, f"at load {load:.1f} on {cores} cores ({workers or 'no'} test workers; too loaded from " \
                          f"{limit})"


def skip_if_loaded_past_cores(what: str) -> str:
    """Skip, saying `what` and the load, where other work loads the machine past its cores (loaded_past_cores): what
    went wrong (a check out of time, a task that never stepped) is then the machine's speed. Else return the figures
    judged, and the caller fails."""
    loaded, figures = loaded_past_cores()
    if loaded:
        pytest.skip(f"this machine is too loaded to judge this test: {what} {figures}")
    return figures


def fail_unless_loaded_past_cores(what: str) -> NoReturn:
    """`what` went wrong: a skip saying so where the machine is loaded past its cores (skip_if_loaded_past_cores),
    else a failure saying the load, which was not the cause."""
    figures = skip_if_loaded_past_cores(what)  # (the load read once: the figures said are those judged)
    pytest.fail(f"{what}, {figures}: not loaded past its cores")
