"""What the scheduler makes of the trainers' bubbles: each bubble as it is seen, each window granted in
one, and each task's share of a window. Plain data, made on the control path and kept by reference
for the history (freeride.agent.control.history) once accounted (freeride.agent.control.accounting).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from freeride.agent.domain.events import WindowRecord
from freeride.agent.domain.timers import TimerHandle


@dataclass(slots=True)  # made per grant, on the path to it: no instance dict
class TaskShare:
    """One task's hold on a window, from its grant to its WindowDone (a window is handed on when it ends early)."""

    task_id: str
    steps: list[tuple[int, int]] = field(default_factory=list)
    idle_since_ns: int = 0  # the worker's clock when it reported WindowDone (an instant); 0: it never did
    granted_ns: int = 0  # when the grant was written
    woke_ns: int = 0  # when the worker saw it (from its WindowDone); 0: unknown
    killed_at_ns: int = 0  # its step hung past the window and was killed at this instant; 0: it was not


@dataclass(slots=True)
class Window:
    id: int
    rank: int
    slot: int
    iteration: int
    start_ns: int
    until_ns: int
    predicted_ns: int
    seen_ns: int = 0  # when the agent took the START edge
    end_ns: int = 0
    open: bool = True
    holder: str = ""
    tried: set[str] = field(default_factory=set)
    shares: list[TaskShare] = field(default_factory=list)
    timer: TimerHandle | None = None
    record: WindowRecord | None = None  # set when accounted

    def share(self, task_id: str) -> TaskShare | None:
        """The task's latest share of this window (None: it was never granted it)."""
        return next((s for s in reversed(self.shares) if s.task_id == task_id), None)


@dataclass(slots=True)
class Bubble:
    slot: int
    iteration: int
    start_ns: int
    predicted_ns: int | None
    window: Window | None
    rank: int = 0
    end_ns: int = 0
    kind: int = 0
    stands_for: int = 1  # iterations it stands for in the counters (Edge.stands_for)
