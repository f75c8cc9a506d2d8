"""A small, real file system that fills up: a tmpfs of a few MiB mounted for one test.

The kernel refuses writes past its size with ENOSPC, as a full disk does (not EFBIG, as RLIMIT_FSIZE does).
Mounting needs root (or CAP_SYS_ADMIN): elsewhere the tests that need it are skipped, saying why.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(where: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of `size_bytes` mounted at `where` (created), unmounted (lazily, if something still holds it)
    when the block ends."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a full disk is made with a tmpfs mount, which needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not allowed here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(path: Path, leave_bytes: int = 0) -> int:
    """Append to `path` until its file system has at most `leave_bytes` left; the bytes written."""
    chunk = b"\0" * (64 << 10)
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while (free := _free(path.parent)) > leave_bytes:
            try:
                written += os.write(fd, chunk[: min(len(chunk), free - leave_bytes)])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    finally:
        os.close(fd)
    return written


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
