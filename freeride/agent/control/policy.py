"""Which resident task gets (the rest of) a bubble window, and the fair share's measure: recent usage."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

_RESCALE_AFTER = 64.0  # half-lives between rescalings of the stored usage (2^64: far from a float's range)


@dataclass
class Candidate:
    """What the policy needs to know of a task; the scheduler owns the instances."""

    task_id: str
    priority: int
    recent_usage: float  # RecentUsage.score: comparable between tasks, not a duration
    step_estimate_ns: int | None
    idle: bool


def choose(candidates: Iterable[Candidate], remaining_ns: int, exclude: set[str]) -> Candidate | None:
    """Highest priority first, then the task with the least recent usage (fair share).

    A task whose estimated step does not fit `remaining_ns` is skipped, so a task with shorter
    steps can take the tail of a bubble that the first choice cannot use. A task with no
    estimate yet fits anything: it has to run once to be measured.
    """
    best: Candidate | None = None
    for c in candidates:
        if not c.idle or c.task_id in exclude:
            continue
        if c.step_estimate_ns is not None and c.step_estimate_ns > remaining_ns:
            continue
        if best is None or (-c.priority, c.recent_usage, c.task_id) < (-best.priority, best.recent_usage,
                                                                         best.task_id):
            best = c
    return best


class RecentUsage:
    """Each task's harvested time, decayed exponentially with a half-life: the measure fair share evens out.

    Not the lifetime total: with that, one task that ran alone for an hour got nothing while any
    newer task had less, however many arrived. Decayed usage forgets: a task's past counts half
    after one half-life, so an old task is served again within a few half-lives and, in the long
    run, every task of a priority gets an equal share of recent windows.

    Stored as usage x 2^((t - epoch) / half-life) for the time t it was added, so adding is O(1) and
    comparing needs no decay (the factor is common to every task); rescaled every 64 half-lives,
    when tasks whose usage decayed below 1 ns are forgotten (they count as new).
    """

    def __init__(self, half_life_ns: int) -> None:
        if half_life_ns <= 0:
            raise ValueError(f"half_life_ns must be > 0, got {half_life_ns}")
        self._half_life_ns = half_life_ns
        self._epoch_ns = 0
        self._scaled: dict[str, float] = {}

    def add(self, task_id: str, used_ns: int, now_ns: int) -> None:
        exponent = (now_ns - self._epoch_ns) / self._half_life_ns
        if exponent > _RESCALE_AFTER:
            factor = 2.0 ** -exponent
            self._scaled = {k: v * factor for k, v in self._scaled.items() if v * factor >= 1.0}
            self._epoch_ns, exponent = now_ns, 0.0
        self._scaled[task_id] = self._scaled.get(task_id, 0.0) + used_ns * 2.0 ** exponent

    def score(self, task_id: str) -> float:
        """What choose() compares: larger means more recent usage (0 for a task with none)."""
        return self._scaled.get(task_id, 0.0)

    def recent_ns(self, task_id: str, now_ns: int) -> float:
        """The task's decayed usage at `now_ns`, in nanoseconds."""
        return self.score(task_id) * 2.0 ** (-(now_ns - self._epoch_ns) / self._half_life_ns)
