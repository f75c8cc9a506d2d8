"""One manual clock for the tests: CLOCK_MONOTONIC in ns as the product reads it, moved only by the test."""

from __future__ import annotations

import time


class ManualClock:
    """Called, it says the time in ns; `seconds()` the same in seconds (for the SDK's clocks). It starts at the real
    clock unless told otherwise, so that the edges a real trainer stamps fall within an agent's bounds."""

    def __init__(self, start_ns: int | None = None) -> None:
        self.now_ns = time.monotonic_ns() if start_ns is None else start_ns

    def __call__(self) -> int:
        return self.now_ns

    def seconds(self) -> float:
        return self.now_ns / 1e9

    def advance(self, ns: int) -> None:
        self.now_ns += ns

    def catch_up(self) -> None:
        """To the real clock: before a real trainer stamps edges (the agent refuses those a second ahead)."""
        self.now_ns = max(self.now_ns, time.monotonic_ns())
