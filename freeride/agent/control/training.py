"""Training time: how long this GPU trained while the agent watched, the time a training slowdown applies to.

A GPU trains while one of its ranks holds a bubble stream to the agent, so the time with at least one
stream open is the training the side tasks ran beside (an upper bound: it counts stretches in which no
side task ran, so a slowdown's cost computed from it is never too small). `freeride stats` turns it into
the GPU-hours a declared slowdown costs (docs/operations.md, *Harvested GPU-hours and their value*).

The time is kept in the GPU's ledger (`Counters.training_ns`) beside the harvest, and folded into it
whenever the ledger is read: every write of the ledger carries the training time up to that moment, so an
agent killed with SIGKILL loses as little of it as of the harvest.
"""

from __future__ import annotations

from collections.abc import Callable

from freeride.agent.domain.model import Counters


class TrainingTime:
    """Counts the time with one stream open or more into a ledger; `clock` is CLOCK_MONOTONIC in ns."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self._clock = clock
        self._open = 0
        self._since_ns: int | None = None  # start of the stretch not yet folded into the ledger

    def opened(self) -> None:
        """A trainer stream opened."""
        self._open += 1
        if self._open == 1:
            self._since_ns = self._clock()

    def closed(self, ledger: Counters) -> None:
        """A trainer stream ended: the last one to end closes the stretch."""
        self.fold(ledger)
        self._open = max(0, self._open - 1)
        if self._open == 0:
            self._since_ns = None

    def fold(self, ledger: Counters) -> Counters:
        """Add the open stretch so far to `ledger` (and start it again from now); the ledger, for chaining."""
        if self._since_ns is not None:
            now = self._clock()
            ledger.training_ns += max(0, now - self._since_ns)
            self._since_ns = now
        return ledger
