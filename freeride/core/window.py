"""The window fast path between an agent and a local worker: a shared control word plus a wake-up pipe.

gRPC carries everything else (attach, setup, step reports, pause and cancel). Grants and
revocations happen on every bubble, so they take a shorter road: the agent writes the window
(id, until, open) into a 64-byte memory-mapped file under a sequence lock and writes one byte
into a pipe; the worker blocks on that pipe while idle (no polling) and, between steps, reads
the control word directly, so a revocation costs it no wake-up at all.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from pathlib import Path
from typing import NamedTuple

from freeride.core.private import create_private, private_dir

_LAYOUT = struct.Struct("<QQqQ")  # seq, window_id, until_ns, open
_SEQ = struct.Struct("<Q")
SIZE = 64


class WindowWord(NamedTuple):
    window_id: int
    until_ns: int
    open: bool


class WindowWriter:
    """Agent side: owns the file and the pipe's write end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        private_dir(path.parent)
        try:
            with os.fdopen(create_private(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
                f.write(b"\0" * SIZE)
        except OSError:  # a full disk: no empty file is left behind for each try
            path.unlink(missing_ok=True)
            raise
        self._f = open(path, "r+b")  # noqa: SIM115 - lives as long as the worker
        self._mm = mmap.mmap(self._f.fileno(), SIZE)
        self._seq = 0
        self.read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)

    def _store(self, window_id: int, until_ns: int, is_open: bool) -> None:
        seq = self._seq + 1  # odd: a write is in progress
        _LAYOUT.pack_into(self._mm, 0, seq, window_id, until_ns, int(is_open))
        self._seq = seq + 1
        _SEQ.pack_into(self._mm, 0, seq + 1)
        try:  # noqa: SIM105 - not contextlib.suppress: this runs on the way to every grant
            os.write(self._write_fd, b"w")
        except (BlockingIOError, BrokenPipeError):
            # BlockingIOError: the worker has unread wake-ups already; it reads the word, not the bytes.
            # BrokenPipeError: the worker died and its exit is not processed yet; that exit releases the window.
            pass

    def grant(self, window_id: int, until_ns: int) -> None:
        self._store(window_id, until_ns, True)

    def revoke(self, window_id: int, until_ns: int) -> None:
        self._store(window_id, until_ns, False)

    def close_child_end(self) -> None:
        """After the worker was spawned with the read end, the agent drops its copy."""
        os.close(self.read_fd)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._write_fd)
        self._mm.close()
        self._f.close()
        self.path.unlink(missing_ok=True)


class WindowReader:
    """Worker side: reads the control word; waits on the pipe when idle."""

    def __init__(self, path: str, fd: int) -> None:
        self._f = open(path, "rb")  # noqa: SIM115 - lives as long as the worker
        self._mm = mmap.mmap(self._f.fileno(), SIZE, access=mmap.ACCESS_READ)
        self.fd = fd
        os.set_blocking(fd, False)

    def read(self) -> WindowWord:
        while True:
            seq, window_id, until_ns, is_open = _LAYOUT.unpack_from(self._mm, 0)
            if seq & 1 == 0 and _SEQ.unpack_from(self._mm, 0)[0] == seq:
                return WindowWord(window_id, until_ns, bool(is_open))

    def drain(self) -> bool:
        """Consume pending wake-ups; False when the agent's end is closed (the agent is gone)."""
        try:
            while True:
                data = os.read(self.fd, 4096)
                if not data:
                    return False
                if len(data) < 4096:
                    return True
        except BlockingIOError:
            return True
