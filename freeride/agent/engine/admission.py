"""Admission: at most --max-workers resident workers, and their memory caps never add up to more than
the trainer leaves free.

Pure bookkeeping. A resident worker is a task admitted and not yet exited (its process is being
created or runs): each one is a process with its own memory and CPU time, whatever its cap.

Usable memory = min(the trainer's free-memory hint, what the device could give the side tasks:
NVML free plus what the workers hold) minus a safety headroom; unknown on both sides (CPU mode,
no hint) means unbounded. A task that does not fit waits; it is never started
to fail. Tasks without a declared cap reserve nothing (they are bounded only by the watchdog).
"""

from __future__ import annotations

from collections.abc import Callable


def usable_bytes(trainer_free_bytes: int, device_available_bytes: int | None, headroom_bytes: int) -> int | None:
    """Memory side tasks may hold in all; None when nothing bounds it."""
    bounds = [b for b in (trainer_free_bytes if trainer_free_bytes > 0 else None, device_available_bytes)
              if b is not None]
    return max(0, min(bounds) - headroom_bytes) if bounds else None


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def admit(cap_bytes: int, reserved_bytes: int, usable: Callable[[], int | None]) -> str:
    """"" if a task of this cap fits beside the caps already reserved, else the reason it waits.

    `usable` is asked only for a capped task: it may query the GPU. Each task's reservation is kept
    with the task's runtime (freeride.agent.engine.tasks), from admission until its worker exits."""
    limit = usable() if cap_bytes > 0 else None
    if limit is not None:
        free = limit - reserved_bytes
        if cap_bytes > free:
            return f"waiting for memory: needs {_mib(cap_bytes)}, {_mib(max(0, free))} free for side tasks"
    return ""


def worker_slot(resident: int, max_workers: int) -> str:
    """"" if one more worker may start beside `resident` ones, else the reason the task waits (queued)."""
    if resident >= max_workers:
        return f"queued: {resident} workers resident (--max-workers {max_workers})"
    return ""
