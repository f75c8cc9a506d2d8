"""Re-probing a task told its steps fit no bubble: a series of windows again, from a timer, backed off.

Told it fits none (slots.starved), a task is offered no window and may let the agent go quiet. A load spike may
have inflated the estimate that keeps it out, and only a step refreshes it; so a timer offers it PROBE_SERIES
windows in a row again (its worker declines that many before it steps anyway: freeride.worker.fit), first after
REPROBE_FIRST_NS, then twice as late each time it still fits none, up to REPROBE_MAX_NS. A window it fits ends the
re-probing. Pure: the clock, the timer and what to do when a series starts are injected.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from freeride.agent.control.slots import TaskSlot
from freeride.agent.domain.timers import CallAt, Clock

PROBE_SERIES = 8  # = freeride.worker.fit.PROBE_AFTER_WINDOWS (a test keeps the two equal)
REPROBE_FIRST_NS = 5_000_000_000
REPROBE_MAX_NS = 80_000_000_000


def delay_ns(reprobes: int) -> int:
    """How long after it was (again) found to fit none a task's next series comes."""
    return min(REPROBE_FIRST_NS << min(reprobes, 16), REPROBE_MAX_NS)


class Reprobes:
    def __init__(self, clock: Clock, call_at: CallAt, tasks: Mapping[str, TaskSlot],
                 on_series: Callable[[], None]) -> None:
        self._clock = clock
        self._call_at = call_at
        self._tasks = tasks
        self._on_series = on_series  # a series began: the task could take a window again (the scheduler's demand)

    def arm(self, task: TaskSlot) -> None:
        """The task was found to fit none (or its series ran out, still fitting none): its next series, later."""
        if task.reprobe is not None:
            task.reprobe.cancel()
        task.reprobe = self._call_at(self._clock() + delay_ns(task.reprobes), lambda: self._series(task.task_id))

    def probed(self, task: TaskSlot) -> None:
        """It was granted a probe window: one fewer of its series; the next series once this one ran out."""
        if task.probes_left:
            task.probes_left -= 1
            if not task.probes_left:
                self.arm(task)

    def fits_again(self, task: TaskSlot) -> None:
        """It was granted a window it fits (not a probe): no longer told it fits none, no more series."""
        task.fits_none = False
        self.stop(task)

    @staticmethod
    def stop(task: TaskSlot) -> None:
        """It fits a window again, or it is gone: no more series."""
        if task.reprobe is not None:
            task.reprobe.cancel()
        task.reprobe, task.reprobes, task.probes_left = None, 0, 0

    def _series(self, task_id: str) -> None:
        task = self._tasks.get(task_id)
        if task is None:
            return
        task.reprobe = None
        if not task.fits_none:
            return
        task.reprobes += 1
        task.probes_left = PROBE_SERIES
        self._on_series()
