"""StepBudget: sizes one step of a side task to the bubble it runs in, as many units as fit, at least one.

A unit is the task's smallest piece of work (one optimizer update, one block of rows, one image).
freeride runs a step only when its estimated duration (a high percentile of recent steps) fits the
rest of the window, so a step must stay bounded: it fills at most `fill` of what is left and at
most `max_step_s`, whichever is smaller. Outside a window (remaining 0, e.g. a task driven
directly by a test) a step is exactly one unit, so such runs are reproducible unit by unit.

Public as `freeride.StepBudget`; every shipped task in `sidetasks/` sizes its steps with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class StepBudget:
    """Decides, unit by unit, whether another unit still fits the current step.

    In `step()`: `budget.start(self.context.remaining_s())`, then after each unit `if not budget.another():
    return`. A unit is assumed to cost as much as the slowest recent one (decaying by 10% a unit).
    """

    def __init__(self, max_step_s: float, fill: float = 0.8, clock: Callable[[], float] = time.perf_counter) -> None:
        self.max_step_s = max_step_s
        self.fill = fill
        self._clock = clock
        self._unit_s = 0.0  # slowest recent unit (decays slowly), the cost assumed for the next one
        self._deadline = 0.0
        self._last = 0.0

    def start(self, remaining_s: float) -> None:
        """Begin a step with `remaining_s` seconds left in the window."""
        now = self._clock()
        self._last = now
        budget = min(self.max_step_s, self.fill * remaining_s) if remaining_s > 0 else 0.0
        self._deadline = now + budget

    def another(self) -> bool:
        """Account the unit just finished; True when one more is expected to end before the deadline."""
        now = self._clock()
        took = now - self._last
        self._last = now
        self._unit_s = max(took, 0.9 * self._unit_s)
        return now + self._unit_s <= self._deadline

    @property
    def unit_s(self) -> float:
        return self._unit_s
