"""The pipes the worker lives on (the window pipe, its wake-up pipe), watched for a task that closes them: a task
that closes file descriptors it did not open (os.closerange, a daemonising helper) is told so in its own log,
before gRPC (whose descriptors went too) aborts with its own words."""

from __future__ import annotations

import os
from collections.abc import Sequence


class PlumbingError(BaseException):
    """A pipe the worker lives on is gone (the task closed descriptors it did not open); the message says which.
    A BaseException, as TaskStop: a task's `except Exception` in run() must not swallow it."""


class KnownPipes:
    """Each pipe's (device, inode), noted before any task code ran: a pipe closed is caught even when something
    the task opened afterwards took its number."""

    def __init__(self) -> None:
        self._ids: dict[int, tuple[int, int]] = {}

    def note(self, pipes: Sequence[tuple[str, int]]) -> None:
        for _, fd in pipes:
            st = os.fstat(fd)
            self._ids[fd] = (st.st_dev, st.st_ino)

    def check(self, pipes: Sequence[tuple[str, int]]) -> None:
        """Raise PlumbingError naming the first of `pipes` (name, fd) that is closed or names another file."""
        for name, fd in pipes:
            try:
                st = os.fstat(fd)
            except OSError as exc:
                problem = exc.strerror
            else:
                known = self._ids.get(fd)
                if known is None or known == (st.st_dev, st.st_ino):
                    continue
                problem = "its number now names another file"
            raise PlumbingError(
                f"the worker's {name} (fd {fd}) was closed: {problem}; the task closed file descriptors "
                "it did not open (os.closerange, a daemonising helper): close only your own"
            )
