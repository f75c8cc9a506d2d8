"""A full disk: how to recognise it, what a task waiting for it says, how full a file system is.

A full disk is an outage of the disk, not a task's fault: a worker whose checkpoint cannot be written,
or a worker that cannot be started because its files cannot be created, waits (holding no window, no
restart charged) and tries again with backoff, and at once when the agent frees space (`freeride rm`,
`prune`, `--retention`). Both sides of that agreement, the worker (freeride.sdk) and the agent, read
it from here.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})  # no space left; the user's quota is used up
# What a waiting task's reason starts with (after "waiting: ") while it waits for space: the agent asks such a
# task to try again when it frees space.
WAIT_PREFIX = "disk full"
RETRY_S = 1.0  # the first retry after a full disk; doubled each time, up to MAX_RETRY_S
MAX_RETRY_S = 30.0


def is_full(exc: BaseException) -> bool:
    """The error is a full disk (or quota), rather than a fault of the task or of freeride."""
    return isinstance(exc, OSError) and exc.errno in FULL_ERRNOS


def wait_reason(what: str, path: Path | str, exc: OSError) -> str:
    """`disk full: <what> <path> (<strerror>); free space ...`: short, it is shown in `freeride ls`."""
    return (f"{WAIT_PREFIX}: {what} {path} ({exc.strerror or exc}); free space (freeride rm/prune) and it "
            "goes on")


@dataclass(frozen=True)
class Usage:
    """One file system's space as an unprivileged writer sees it."""

    total_bytes: int
    free_bytes: int  # available to an unprivileged user (f_bavail): what the agent and its workers may still write

    @property
    def used_ratio(self) -> float:
        """0..1: the part of the file system no unprivileged writer can use any more."""
        return 1.0 - self.free_bytes / self.total_bytes if self.total_bytes else 0.0


def usage(path: Path) -> Usage:
    """The space of the file system holding `path` (or its nearest existing parent); OSError if none answers."""
    for p in (path, *path.parents):
        if p.exists():
            st = os.statvfs(p)
            return Usage(total_bytes=st.f_blocks * st.f_frsize, free_bytes=st.f_bavail * st.f_frsize)
    raise FileNotFoundError(errno.ENOENT, "no such directory", str(path))
