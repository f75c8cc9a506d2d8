"""Learns each bubble slot's length online and predicts it conservatively."""

from __future__ import annotations

from collections import deque


class SlotPredictor:
    """Predicts the next length of one bubble slot: the minimum of its recent lengths.

    The first `skip` observations are ignored (the first iteration pays for warm-up, caches,
    allocator growth). The minimum is conservative: a window sized by it rarely outlives the
    bubble, and a shorter bubble lowers it at once. When bubbles get longer (a new schedule, or
    the end of a one-off short bubble), `change_run` lengths in a row above the prediction by
    more than `change_ratio` replace the history, so the slot adapts within a few iterations
    instead of waiting for the longer history to roll over.
    """

    def __init__(self, history: int = 16, skip: int = 1, change_ratio: float = 0.25, change_run: int = 3) -> None:
        self._history: deque[int] = deque(maxlen=history)
        self._skip = skip
        self._change_ratio = change_ratio
        self._change_run = change_run
        self._outliers: list[int] = []
        self._min: int | None = None

    def observe(self, length_ns: int) -> None:
        if length_ns <= 0:
            return
        if self._skip > 0:
            self._skip -= 1
            return
        current = self._min
        if current is not None and length_ns > current * (1 + self._change_ratio):
            # Longer than predicted: harmless for one bubble, a new schedule if it keeps happening.
            self._outliers.append(length_ns)
            if len(self._outliers) >= self._change_run:
                self._history.clear()
                self._history.extend(self._outliers)
                self._outliers = []
                self._min = min(self._history)
                return
        else:
            self._outliers = []  # shorter lengths take effect at once through the minimum
        self._history.append(length_ns)
        self._min = min(self._history)

    def predict_ns(self) -> int | None:
        return self._min


class MarginController:
    """The safety margin cut from every window: a base plus what recent overruns asked for.

    An overrun raises the margin by the overrun's length (capped); every clean window decays
    the extra part, so a one-off spike does not cost harvest for long.
    """

    def __init__(self, base_ns: int, cap_ns: int = 5_000_000, decay: float = 0.95) -> None:
        self.base_ns = base_ns
        self._cap_ns = cap_ns
        self._decay = decay
        self._extra_ns = 0.0

    def margin_ns(self) -> int:
        return self.base_ns + int(self._extra_ns)

    def on_window(self, overrun_ns: int) -> None:
        if overrun_ns > 0:
            self._extra_ns = min(float(self._cap_ns), self._extra_ns + overrun_ns)
        else:
            self._extra_ns *= self._decay
