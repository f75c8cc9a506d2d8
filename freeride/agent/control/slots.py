"""The resident tasks as the scheduler sees them, and which of them are candidates for a window.

A task whose step estimate fits no bubble is passed over; after `PROBE_AFTER` dispatches it is offered one
anyway (a probe): its estimate may be one step slowed by a loaded machine, and only a window can refresh it.
Once told it fits none the agent stops offering it windows (and may stop listening) until a re-probe series
(reprobe.py) offers it some again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from freeride.agent.control.policy import Candidate, RecentUsage
from freeride.agent.domain.model import Counters
from freeride.agent.domain.timers import TimerHandle

# A task passed over this many times because its step estimate did not fit is offered a window
# anyway: its worker re-checks (and drops a stale outlier from) its estimate instead of starving.
PROBE_AFTER = 16


class WindowPort(Protocol):
    """How the scheduler reaches one worker's window word (see freeride.core.window)."""

    def grant(self, window_id: int, until_ns: int) -> None: ...
    def revoke(self, window_id: int, until_ns: int) -> None: ...


@dataclass
class TaskSlot:
    """A resident task as the scheduler sees it."""

    task_id: str
    priority: int
    port: WindowPort
    counters: Counters
    step_estimate_ns: int | None = None
    window_id: int = 0  # the window this task holds, 0 when idle
    hang_timer: TimerHandle | None = None
    unfit: int = 0  # dispatches it sat out since its last window because its estimate did not fit
    fits_none: bool = False  # told (on_fit) that its estimate fits no bubble seen; cleared when one fits
    stopping: bool = False  # asked to checkpoint and exit: no new window (one it holds ends as usual)
    checkpointing: bool = False  # its worker is in a checkpoint: no new window, no hang timer
    probes_left: int = 0  # windows of the re-probe series still to offer (while it fits none; reprobe.py)
    reprobes: int = 0  # re-probe series offered since it last fitted a window (the backoff's exponent)
    reprobe: TimerHandle | None = None  # the next re-probe series, while it fits none

    def disarm_hang(self) -> None:
        if self.hang_timer is not None:
            self.hang_timer.cancel()
            self.hang_timer = None


def could_take_a_window(t: TaskSlot, longest_bubble_ns: Callable[[], int]) -> bool:
    """Whether a task makes each edge matter as it comes (Scheduler.wants_edges): it holds a window (its END revokes
    it), or it may be granted one. A task that stops or checkpoints may not. Nor may one whose steps fit no bubble:
    told so (`fits_none`: it sat out PROBE_AFTER dispatches and was offered a probe, which refreshed its estimate)
    and its estimate still longer than `longest_bubble_ns()`, every slot's predicted bubble (the windows the agent
    could grant; one long outlier does not count), unless a re-probe series is under way. The edges, read late, still
    teach the bubbles' lengths, and once a slot's prediction is as long as its estimate the agent listens again
    (Scheduler._on_end)."""
    if t.window_id:
        return True
    if t.stopping or t.checkpointing:
        return False
    return not (t.fits_none and not t.probes_left and (t.step_estimate_ns or 0) > longest_bubble_ns())


def candidates(tasks: Mapping[str, TaskSlot], usage: RecentUsage) -> list[Candidate]:
    """The tasks that may take a window: not stopping, not in a checkpoint."""
    return [
        Candidate(t.task_id, t.priority, usage.score(t.task_id), t.step_estimate_ns, t.window_id == 0)
        for t in tasks.values() if not (t.stopping or t.checkpointing)
    ]


def starved(tasks: Mapping[str, TaskSlot], candidates: list[Candidate], remaining_ns: int, tried: set[str],
            longest_bubble_ns: Callable[[], int]) -> tuple[Candidate | None, list[TaskSlot]]:
    """An idle task that sat out `PROBE_AFTER` dispatches because its estimate did not fit, or is in a re-probe
    series (None: no such task),
    and the tasks newly found to fit no bubble (to be said once, until a window they fit): their estimate is longer
    than `longest_bubble_ns()`, the longest any slot's bubble is predicted to be (asked only then).

    Each idle candidate whose estimate does not fit `remaining_ns` counts one more dispatch sat out. The
    worker runs a step only if it fits by its own estimate, so a probe costs no overrun.
    """
    probe = None
    fits_none = []
    for c in candidates:
        unfit = c.step_estimate_ns is not None and c.step_estimate_ns > remaining_ns
        if c.idle and unfit and c.task_id not in tried:
            slot = tasks[c.task_id]
            slot.unfit += 1
            estimate_ns = c.step_estimate_ns or 0
            if slot.unfit >= PROBE_AFTER and not slot.fits_none and estimate_ns > longest_bubble_ns():
                slot.fits_none = True
                fits_none.append(slot)
            if probe is None and (slot.unfit >= PROBE_AFTER or slot.probes_left):
                probe = c
    return probe, fits_none
