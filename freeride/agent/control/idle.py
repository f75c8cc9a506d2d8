"""The bubble time a rank may add to the ledger: never more than the time that has passed.

A rank's bubbles never overlap (it waits on one thing at a time), so all the bubble time it reports
fits between its first START and its latest END. A timed step that stands for N iterations (a quiet
trainer times only some: freeride.trainer.waits) is counted N times, an estimate of the untimed
steps' bubbles; the estimate, or a record forged to claim more (a START stamped a minute back, an END
a second ahead, each within the edge checks, and N up to MAX_STANDS_FOR), could add far more time
than has passed. So each rank has a cursor: the instant up to which its idle time is counted. It
starts at the rank's first START; an END moves it on by what that bubble adds, and a bubble adds at
most the time from the cursor to its END. The rank's total is then at most its latest END minus its
first START, and the cursor never passes the latest END.

A true bubble is never cut by this: the cursor is at or before the rank's previous END, which is
before this bubble's START, so the allowance is at least the bubble's own length; a weighted one is
cut only where its estimate claims more than the time since (the first bubble after a reconnect, at
worst). The time a rank spent computing is left in the allowance, so an estimate a little high for
one step is made good by the steps around it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Rank:
    cursor_ns: int  # idle time is counted up to here
    warned: bool = False  # the first cut is logged, the rest only counted (a flood must not flood the log)


class IdleBound:
    def __init__(self) -> None:
        self._ranks: dict[int, _Rank] = {}
        self.cut_ns = 0  # bubble time claimed and not counted, since the agent started (for /metrics)

    def credit(self, rank: int, start_ns: int, end_ns: int, stands_for: int) -> tuple[int, int]:
        """(bubble time, bubbles) to count for the rank's bubble from `start_ns` to `end_ns` standing for
        `stands_for` iterations: `stands_for` times its length, at most the time since the rank's cursor."""
        r = self._ranks.get(rank)
        if r is None:
            r = self._ranks[rank] = _Rank(start_ns)
        length = end_ns - start_ns
        claimed = length * stands_for
        allowed = max(0, end_ns - r.cursor_ns)
        if claimed <= allowed:
            r.cursor_ns += claimed
            return claimed, stands_for
        r.cursor_ns += allowed
        self.cut_ns += claimed - allowed
        if not r.warned:
            r.warned = True
            log.warning(
                "rank %d reported a %.3f s bubble standing for %d iterations (%.3f s of bubble time), but its "
                "bubbles since its first one leave only %.3f s of the time since uncounted: counted that. A rank "
                "cannot be idle longer than time passes: its trainer's edges are wrong or forged (check what calls "
                "its BubbleReporter). Further cuts for this rank are only counted "
                "(freeride_bubble_refused_seconds_total)",
                rank, length / 1e9, stands_for, claimed / 1e9, allowed / 1e9)
        return allowed, min(stands_for, max(1, allowed // length)) if allowed and length > 0 else 0

    def gone(self, rank: int) -> None:
        """The rank's trainer stream ended: a new one starts its count afresh (and the map stays small)."""
        self._ranks.pop(rank, None)
