"""Wait for processes to exit: a pidfd each, one `select` over them (an event per process, no polling)."""

from __future__ import annotations

import os
import select
import time
from collections.abc import Iterable


def wait_pids(pids: Iterable[int], timeout_s: float,
              unwaitable: type[OSError] | tuple[type[OSError], ...] = ProcessLookupError) -> list[int]:
    """Block until each pid has exited or `timeout_s` passed; the pids still running, sorted.

    A pid whose pidfd cannot be opened with an error of type `unwaitable` is skipped (by default: it is gone
    already); other errors are raised."""
    fds: dict[int, int] = {}
    try:
        for pid in pids:
            try:
                fds[os.pidfd_open(pid)] = pid
            except unwaitable:
                continue
        deadline = time.monotonic() + timeout_s
        while fds and (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select(list(fds), [], [], left)
            for fd in ready:
                os.close(fd)
                del fds[fd]
        return sorted(fds.values())
    finally:
        for fd in fds:
            os.close(fd)
