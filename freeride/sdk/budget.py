"""StepBudget: sizes one step of a side task to the bubble it runs in, as many units as fit, at least one.

A unit is the task's smallest piece of work (one optimizer update, one block of rows, one image).
freeride runs a step only when its estimated duration (a high percentile of recent steps) fits the
rest of the window, so a step must stay bounded: it fills at most `fill` of what is left and at
most `max_step_s`, whichever is smaller. Outside a window (remaining 0, e.g. a task driven
directly by a test) a step is exactly one unit, so such runs are reproducible unit by unit.

On a GPU a unit's kernels are queued, not done, when its Python returns: timed by the CPU, a step would queue
far more than fits and its kernels would run on past the bubble's end, into the trainer's compute. A task on a
GPU calls `track(device)` once (in `setup()`): each unit then records a CUDA event, the next unit waits for the
one before it (at most one short unit in flight), units are timed by when their kernels finish, and a step ends
when its last unit's kernels are done. `start(remaining_s, window=context.remaining_s)` also re-reads the window
between units: a window revoked early (the bubble ended) stops the step at the next unit.

Public as `freeride.StepBudget`; every shipped task in `sidetasks/` sizes its steps with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


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
        self._window: Callable[[], float] | None = None
        self._units: _InFlight | None = None

    def track(self, device: object, event: Callable[[], Any] | None = None) -> StepBudget:
        """Time units by their kernels on `device` (a torch device or its name) when it is a CUDA one: at most
        one unit in flight, a step ends with its kernels done. A CPU device changes nothing. `event` makes the
        marker recorded after each unit (default torch.cuda.Event; it needs record() and synchronize())."""
        if not str(device).startswith("cuda"):
            self._units = None
        elif event is not None:
            self._units = _InFlight(event)
        else:
            import torch

            self._units = _InFlight(torch.cuda.Event)
        return self

    def start(self, remaining_s: float, window: Callable[[], float] | None = None) -> None:
        """Begin a step with `remaining_s` seconds left in the window; `window` (the task context's
        `remaining_s`) is read again between units."""
        now = self._clock()
        self._last = now
        self._window = window
        budget = min(self.max_step_s, self.fill * remaining_s) if remaining_s > 0 else 0.0
        self._deadline = now + budget

    def another(self) -> bool:
        """Account the unit just finished; True when one more is expected to end before the deadline."""
        if self._units is not None:
            self._units.queued()  # waits for the unit before this one: its kernels are done now
        now = self._clock()
        took = now - self._last
        self._last = now
        self._unit_s = max(took, 0.9 * self._unit_s)
        more = now + self._unit_s <= self._deadline
        if more and self._window is not None and self._deadline > now:
            more = self._window() > self._unit_s  # the window still holds one more unit (0: it was revoked)
        if not more and self._units is not None:
            self._units.drain()
        return more

    @property
    def unit_s(self) -> float:
        return self._unit_s


class _InFlight:
    """The last unit's CUDA event: recording one waits for the one before (one unit in flight at most)."""

    def __init__(self, event: Callable[[], Any]) -> None:
        self._event = event
        self._last: Any = None

    def queued(self) -> None:
        ev = self._event()
        ev.record()
        if self._last is not None:
            self._last.synchronize()
        self._last = ev

    def drain(self) -> None:
        if self._last is not None:
            self._last.synchronize()
            self._last = None
