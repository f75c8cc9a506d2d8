"""The timer the engine's parts are given (asyncio's on the agent, a manual one in tests): one shape for all."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


Clock = Callable[[], int]  # CLOCK_MONOTONIC in ns
CallAt = Callable[[int, Callable[[], None]], TimerHandle]  # at an instant of Clock (ns)
CallLater = Callable[[float, Callable[[], None]], TimerHandle]  # after a delay in seconds
