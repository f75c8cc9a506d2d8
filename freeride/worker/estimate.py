"""Online step-time estimate: a high percentile of recent steps."""

from __future__ import annotations

from collections import deque


class StepEstimator:
    """p-th percentile of the last `window` step durations; None until a step was seen.

    Recomputed lazily every few samples (a step must not pay for a sort); a sample above the
    cached value raises it at once, so the estimate is never late on the side that overruns.
    The first `warmup_steps` samples are left out: a process's first step pays for lazy
    initialisation (allocators, kernels, caches), and an estimate taken from it alone could keep
    the task out of every bubble, with no later step ever run to correct it.
    """

    def __init__(self, percentile: float = 0.95, window: int = 64, refresh_every: int = 8,
                 warmup_steps: int = 0) -> None:
        self._warmup = warmup_steps
        self._samples: deque[int] = deque(maxlen=window)
        self._percentile = percentile
        self._refresh_every = refresh_every
        self._since_refresh = 0
        self._cached: int | None = None
        self._lone_forgotten = False
        self._cold: int | None = None  # the latest warm-up sample: left out, yet evidence of how long a step may be

    def add(self, duration_ns: int) -> None:
        if self._warmup > 0:
            self._warmup -= 1
            self._cold = duration_ns
            return
        self._samples.append(duration_ns)
        self._since_refresh += 1
        if self._cached is None or duration_ns > self._cached or self._since_refresh >= self._refresh_every:
            self._refresh()

    def estimate_ns(self) -> int | None:
        return self._cached

    def cold_ns(self) -> int | None:
        """The left-out warm-up step's duration while no other step was measured (None: none, or measured)."""
        return self._cold if not self._samples else None

    def samples(self) -> list[int]:
        return list(self._samples)

    def load(self, samples: list[int]) -> None:
        self._samples.clear()
        self._samples.extend(samples)
        if self._samples:
            self._refresh()

    def forget_outlier(self, keep_above_ns: int | None = None) -> bool:
        """Drop the largest sample if it is over twice the median of the others; True if one was dropped.

        A lone sample above `keep_above_ns` is kept: measuring it again would run a step far longer than
        any window (an overrun of seconds on a training GPU), on no evidence that it got shorter.

        Called when a window went unused because the estimate did not fit: one step slowed by a
        loaded machine must not keep a task out of every bubble for good, and only running a step
        could replace that sample. Steps that are all long stay long: nothing is dropped then.
        """
        lone_too_long = keep_above_ns is not None and bool(self._samples) and self._samples[0] > keep_above_ns
        if len(self._samples) == 1 and not self._lone_forgotten and not lone_too_long:
            # One slow step is no evidence either way: measure again, once. A task whose steps
            # really are long pays one overrun for it and then keeps its (repeated) estimate.
            self._lone_forgotten = True
            self._samples.clear()
            self._cached = None
            return True
        if len(self._samples) < 2:
            return False
        ordered = sorted(self._samples)
        largest, rest = ordered[-1], ordered[:-1]
        if largest <= 2 * rest[len(rest) // 2]:
            return False
        self._samples.remove(largest)
        self._refresh()
        return True

    def _refresh(self) -> None:
        ordered = sorted(self._samples)
        index = min(len(ordered) - 1, int(self._percentile * len(ordered)))
        self._cached = ordered[index]
        self._since_refresh = 0
