"""Accounting: what a closed window gave each task that held it, as a pure function over the window.

A step's time inside the bubble is harvest; the part of it past the bubble's end (or past the
predicted end, when the END edge was lost) is overrun, and so is a hung step's time from the
bubble's end (or its own later start) to its kill.
"""

from __future__ import annotations

from dataclasses import dataclass

from freeride.agent.control.windows import TaskShare, Window
from freeride.agent.domain.events import Share, WindowRecord
from freeride.agent.domain.model import Counters


@dataclass(frozen=True)
class Accounted:
    record: WindowRecord
    per_task: dict[str, Counters]  # each task's counters from this window
    total: Counters  # what the GPU's counters gain (its bubbles are counted at their END, granted or not)
    steps_overrun_ns: int  # overrun of the steps that ran long (the margin learns from it; a hang is not one)


def account(w: Window) -> Accounted:
    """The books of a window that is closed, whose holder is idle and whose bubble end is known (or lost)."""
    end = w.end_ns or (w.start_ns + w.predicted_ns)
    per_task: dict[str, Counters] = {}
    shares = []
    steps_overrun = 0
    for share in w.shares:
        c = per_task.setdefault(share.task_id, Counters())
        kept, overrun = _share(share, w.start_ns, end, c)
        steps_overrun += overrun
        shares.append(kept)
    record = WindowRecord(
        window_id=w.id,
        rank=w.rank,
        slot=w.slot,
        iteration=w.iteration,
        bubble_start_ns=w.start_ns,
        bubble_end_ns=end,
        until_ns=w.until_ns,
        predicted_ns=w.predicted_ns,
        shares=tuple(shares),
        seen_ns=w.seen_ns,
    )
    total = Counters()
    for c in per_task.values():
        total.add(c)
    total.windows = 1
    total.bubbles = total.bubble_ns = 0
    return Accounted(record, per_task, total, steps_overrun)


def _share(share: TaskShare, start_ns: int, end_ns: int, c: Counters) -> tuple[Share, int]:
    """Add one share to its task's counters `c`: its record, and the overrun of its steps that ran long."""
    c.windows += 1
    c.bubbles, c.bubble_ns = 1, end_ns - start_ns  # the bubble this task had a share of
    busy = 0
    overrun = 0
    for start, duration in share.steps:
        stop = start + duration
        busy += duration
        if stop > end_ns:
            c.overrun_steps += 1
            overrun += stop - max(start, end_ns)
    c.steps += len(share.steps)
    c.harvested_ns += busy - overrun
    steps_overrun = overrun
    if share.killed_at_ns:  # the hung step: from the bubble's end (or its own later start) to its kill
        last_stop = max((start + duration for start, duration in share.steps), default=0)
        c.overrun_steps += 1
        overrun += max(0, share.killed_at_ns - max(end_ns, last_stop))
    c.overrun_ns += overrun
    return Share(
        task_id=share.task_id,
        first_step_ns=share.steps[0][0] if share.steps else 0,
        idle_since_ns=share.idle_since_ns,
        steps=len(share.steps),
        busy_ns=busy,
        overrun_ns=overrun,
        granted_ns=share.granted_ns,
        woke_ns=share.woke_ns,
    ), steps_overrun
