"""A step holds as many units as fit the rest of the bubble, never fewer than one."""

from __future__ import annotations

import pytest

from freeride import StepBudget


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def units_in_one_step(remaining_s: float, unit_s: float, max_step_s: float, fill: float = 0.8) -> int:
    clock = Clock()
    budget = StepBudget(max_step_s, fill=fill, clock=clock)
    budget.start(remaining_s)
    units = 0
    while True:
        clock.now_s += unit_s
        units += 1
        if not budget.another():
            return units


def test_a_step_fills_the_given_fraction_of_what_is_left_of_the_window():
    assert units_in_one_step(remaining_s=1.0, unit_s=0.125, max_step_s=10.0, fill=0.75) == 6


def test_a_step_is_capped_so_the_workers_step_estimate_stays_small():
    assert units_in_one_step(remaining_s=10.0, unit_s=0.125, max_step_s=0.3) == 2


def test_a_step_runs_one_unit_when_even_one_more_would_not_fit_or_there_is_no_window():
    assert units_in_one_step(remaining_s=0.125, unit_s=0.25, max_step_s=1.0) == 1
    assert units_in_one_step(remaining_s=0.0, unit_s=0.0001, max_step_s=1.0) == 1


def test_the_unit_cost_remembers_a_slow_unit_so_a_step_does_not_overrun_after_it():
    clock = Clock()
    budget = StepBudget(1.0, fill=1.0, clock=clock)
    budget.start(1.0)
    clock.now_s += 0.5  # one slow unit: half the window
    assert budget.another()  # a second like it just fits
    clock.now_s += 0.1  # a fast one
    assert not budget.another()  # but the slow one is remembered (decaying): 0.45 s more would overrun
    assert budget.unit_s == pytest.approx(0.45)


class Marker:
    """A CUDA event's stand-in: records what happened to it in a shared log."""

    log: list[tuple[str, int]] = []
    made = 0

    def __init__(self) -> None:
        Marker.made += 1
        self.n = Marker.made

    def record(self) -> None:
        Marker.log.append(("record", self.n))

    def synchronize(self) -> None:
        Marker.log.append(("sync", self.n))


def test_on_a_gpu_each_unit_waits_for_the_one_before_and_the_step_ends_with_its_kernels_done():
    Marker.log, Marker.made = [], 0
    clock = Clock()
    budget = StepBudget(1.0, fill=1.0, clock=clock).track("cuda:0", event=Marker)
    budget.start(0.35)
    units = 0
    while True:
        clock.now_s += 0.1
        units += 1
        if not budget.another():
            break
    assert units == 3
    # unit 1 queued; unit 2 queued, then unit 1 waited for; unit 3 queued, unit 2 waited for; the step's end
    # waits for unit 3: never two units' kernels queued beyond the one running
    assert Marker.log == [("record", 1), ("record", 2), ("sync", 1), ("record", 3), ("sync", 2), ("sync", 3)]


def test_a_cpu_device_is_not_tracked():
    Marker.log, Marker.made = [], 0
    budget = StepBudget(1.0, clock=Clock()).track("cpu", event=Marker)
    budget.start(1.0)
    budget.another()
    assert Marker.log == []


def test_a_window_revoked_between_units_ends_the_step_at_the_next_unit():
    clock = Clock()
    left = [1.0]
    budget = StepBudget(10.0, fill=1.0, clock=clock)
    budget.start(1.0, window=lambda: left[0])
    clock.now_s += 0.01
    assert budget.another()  # the window still holds more
    left[0] = 0.0  # the agent revoked it: the bubble ended before its predicted end
    clock.now_s += 0.01
    assert not budget.another()
