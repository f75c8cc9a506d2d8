"""A full disk: how to recognise it, what a task waiting for it says, how full a file system is.

A full disk is an outage of the disk, not a task's fault: a worker whose checkpoint cannot be written,
or a worker that cannot be started because its files cannot be created, waits (holding no window, no
restart charged) and tries again with backoff, and at once when the agent frees space (`freeride rm`,
`prune`, `--retention`). Both sides of that agreement, the worker (freeride.sdk) and the agent, read
it from here.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass
from pathlib import Path

from freeride.core.units import format_size

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})  # no space left; the user's quota is used up
# What a waiting task's reason starts with (after "waiting: ") while it waits for space: the agent asks such a
# task to try again when it frees space.
WAIT_PREFIX = "disk full"
RETRY_S = 1.0  # the first retry after a full disk; doubled each time, up to MAX_RETRY_S
MAX_RETRY_S = 30.0


def is_full(exc: BaseException) -> bool:
    """The error is a full disk (or quota), rather than a fault of the task or of freeride."""
    return isinstance(exc, OSError) and exc.errno in FULL_ERRNOS


def wait_reason(what: str, path: Path | str, exc: OSError, state_dir: Path | str | None = None) -> str:
    """`disk full: <what> <path> (<strerror>); <whose space it is>; ...`: shown in `freeride ls`.

    `state_dir`: freeride's own state (checkpoints, logs, database) on that file system. The hint says how much
    of the used space it holds, so that it sends the operator to `freeride rm/prune` only where that can help:
    a disk filled by something else is freed there, not by removing tasks. Blocking (a statvfs and a walk of
    `state_dir`): the agent calls it off its loop."""
    head = f"{WAIT_PREFIX}: {what} {path} ({exc.strerror or exc})"
    return f"{head}; {_whose(Path(state_dir) if state_dir is not None else None, exc)} and it goes on"


# freeride's state holding at least this part of the used space: removing tasks can free a useful amount.
MEANINGFUL_SHARE = 0.10


def _whose(state_dir: Path | None, exc: OSError) -> str:
    if state_dir is None:
        return "free space (freeride rm/prune)"
    try:
        u = usage(state_dir)
        held = held_bytes(state_dir)
    except OSError:
        return "free space (freeride rm/prune)"
    if exc.errno == errno.EDQUOT:  # the user's quota, not the file system, is spent: its usage says nothing
        return (f"this user's disk quota is used up (freeride's state {state_dir} holds {_size(held)}): "
                "free the user's files (freeride rm/prune) or raise the quota")
    used = u.total_bytes - u.free_bytes
    where = f"the file system at {mount_point(state_dir)} has {_size(u.free_bytes)} free of {_size(u.total_bytes)}"
    if held >= used * MEANINGFUL_SHARE:
        return f"{where}, freeride's state {state_dir} holds {_size(held)} of it: free space (freeride rm/prune)"
    return (f"{where}, freeride's state {state_dir} holds only {_size(held)} of the {_size(used)} used: "
            "something else filled it, free space there")


def _size(n: int) -> str:
    return format_size(n) if n > 0 else "0 B"


def held_bytes(root: Path) -> int:
    """Space the files under `root` take on disk (allocated blocks; symbolic links not followed)."""
    total = 0
    for top, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile (a rotated log, a replaced checkpoint)
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
    return total


def mount_point(path: Path) -> Path:
    """The mount point of the file system holding `path` (or its nearest existing parent)."""
    p = next((q for q in (path, *path.parents) if q.exists()), Path("/")).resolve()
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return p


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
