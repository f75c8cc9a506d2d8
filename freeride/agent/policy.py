"""Which resident task gets (the rest of) a bubble window."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class Candidate:
    """What the policy needs to know of a task; the scheduler owns the instances."""

    task_id: str
    priority: int
    harvested_ns: int
    step_estimate_ns: int | None
    idle: bool


def choose(candidates: Iterable[Candidate], remaining_ns: int, exclude: set[str]) -> Candidate | None:
    """Highest priority first, then the task with the least harvested time (fair share).

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
        if best is None or (-c.priority, c.harvested_ns, c.task_id) < (-best.priority, best.harvested_ns, best.task_id):
            best = c
    return best
