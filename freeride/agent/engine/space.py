"""While a task waits for a full disk: the state directory's free space, watched so that space freed by anyone
wakes the task within a watchdog tick, not at its next backoff (doubled up to 30 s).

freeride's own `rm`, `prune` and retention say when they free space (Supervisor.disk_freed). Space freed by
something else (another job's files removed, a volume grown) sends no event: no kernel interface announces a file
system's free space (inotify and fanotify report files, not space). So, only while something waits for the disk,
the memory watchdog's tick (every --memory-check-s, on its own thread, off the loop) also reads the file system's
free space, one statvfs; grown by FREED_BYTES over the lowest seen in the wait, it wakes what waits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger("freeride.agent")

FREED_BYTES = 1 << 20  # less is noise (a log line, a temporary file) and fits no checkpoint worth retrying


class SpaceWatch:
    def __init__(self, free_bytes: Callable[[], int], waiting: Callable[[], bool],
                 on_freed: Callable[[], None]) -> None:
        """`free_bytes()`: the file system's free space (blocking); `waiting()`: something waits for the disk;
        `on_freed()`: try what waits now."""
        self._free_bytes = free_bytes
        self._waiting = waiting
        self._on_freed = on_freed
        self._low: int | None = None  # the least free space seen since the wait began (or since the last wake)

    def wanted(self) -> bool:
        """On the loop: whether this tick reads the free space (something waits for the disk)."""
        if not self._waiting():
            self._low = None
            return False
        return True

    def read(self) -> int | None:
        """In the watchdog's thread: the free space; None where the file system does not answer."""
        try:
            return self._free_bytes()
        except OSError:
            return None

    def apply(self, free: int | None) -> None:
        """On the loop: space grown by FREED_BYTES over the lowest seen wakes what waits for the disk."""
        if free is None or not self._waiting():
            return
        if self._low is None or free < self._low:
            self._low = free
        elif free - self._low >= FREED_BYTES:
            log.info("space freed on the state directory's file system (%d bytes free): trying what waits for it",
                     free)
            self._low = free
            self._on_freed()
