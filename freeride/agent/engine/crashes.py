"""What a worker's crash makes of its task: a pure decision, beside the supervisor that acts on it.

FAILED when the crash cannot be retried (the task said so, or its setup is deterministic), or once the task has
had its restarts (`--max-restarts`, or its own `max_restarts`); else STARTING again after an exponential backoff.
A crash inside a pool item is the item's (poison.py): restarted after the base backoff, no restart spent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from freeride.agent.domain.model import TaskState
from freeride.agent.domain.timers import CallLater, TimerHandle


@dataclass(frozen=True)
class Verdict:
    state: TaskState
    reason: str
    delay_s: float = 0.0  # STARTING: when to start it again
    spends_restart: bool = False


def after_crash(restarts: int, limit: int, backoff_s: float, reason: str, retryable: bool,
                log_path: Path | None, item: str = "") -> Verdict:
    """`restarts` spent of `limit`; `item`: poison.py's note when the worker died inside a pool item."""
    if not retryable:
        return Verdict(TaskState.FAILED, reason)
    if item:
        return Verdict(TaskState.STARTING, f"restart in {backoff_s:.1f}s after: {reason} ({item})", backoff_s)
    if restarts >= limit:
        where = f"; log: {log_path}" if log_path is not None else ""
        return Verdict(TaskState.FAILED, f"{reason} (gave up after {restarts} restarts{where})")
    delay = backoff_s * 2 ** restarts
    return Verdict(TaskState.STARTING, f"restart {restarts + 1}/{limit} in {delay:.1f}s after: {reason}", delay, True)


class RestartTimers:
    """Each task's pending restart (after a crash's backoff, or a start after a full disk): one at most."""

    def __init__(self, call_later: CallLater) -> None:
        self._call_later = call_later
        self._timers: dict[str, TimerHandle] = {}

    def __contains__(self, task_id: str) -> bool:
        return task_id in self._timers

    def pending(self) -> list[str]:
        return list(self._timers)

    def set(self, task_id: str, delay_s: float, fn: Callable[[], None]) -> None:
        self.cancel(task_id)
        self._timers[task_id] = self._call_later(delay_s, fn)

    def fired(self, task_id: str) -> None:
        self._timers.pop(task_id, None)

    def cancel(self, task_id: str) -> None:
        timer = self._timers.pop(task_id, None)
        if timer is not None:
            timer.cancel()
