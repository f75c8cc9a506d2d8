"""The recent history for timelines (`freeride timeline`, `profile`): a pure function over the bubbles and
the accounted windows the scheduler keeps by reference."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from freeride.agent.control.windows import Bubble, Window
from freeride.agent.domain.events import BubbleSpan, WindowRecord

HISTORY_BUBBLES = 4096  # bubbles kept for `freeride timeline` (a few hundred iterations)
HISTORY_WINDOWS = 512  # accounted windows kept with their steps (the steps make these the heavier ones)
HISTORY_MAX_STEPS = 50_000  # steps in one history answer (one Timeline message): about 1 MB


def history(bubbles: Iterable[Bubble], windows: Sequence[Window], since_ns: int = 0,
            max_steps: int = HISTORY_MAX_STEPS) -> tuple[list[BubbleSpan], list[WindowRecord]]:
    """The bubbles and accounted windows that end after `since_ns`; the newest windows' shares carry their
    steps, up to `max_steps` in all (the answer must fit one gRPC message)."""
    spans = [
        BubbleSpan(b.rank, b.slot, b.iteration, b.start_ns, b.end_ns, b.predicted_ns or 0, b.kind)
        for b in bubbles if b.end_ns > since_ns
    ]
    records = []
    budget = max_steps
    for w in reversed(windows):
        if w.record is None or w.record.bubble_end_ns <= since_ns:
            continue
        shares = []
        for kept, share in zip(w.record.shares, w.shares, strict=True):
            if len(share.steps) <= budget:
                budget -= len(share.steps)
                kept = kept._replace(step_spans=share.steps)  # no longer written: the window is accounted
            shares.append(kept)
        records.append(w.record._replace(shares=tuple(shares)))
    records.reverse()
    return spans, records
