"""The window fast path between an agent and a local worker: a shared control word plus a wake-up pipe.

gRPC carries everything else (attach, setup, step reports, pause and cancel). Grants and
revocations happen on every bubble, so they take a shorter road: the agent writes the window
(id, until, open) into a 64-byte shared-memory word under a sequence lock and writes one byte
into a pipe; the worker blocks on that pipe while idle (no polling) and, between steps, reads
the control word directly, so a revocation costs it no wake-up at all.

The word is an anonymous memory file (memfd) with no name in any directory: the worker inherits
its descriptor (with the pipe's read end) at spawn and nobody else holds one, so a task reaches
its own word only. The agent maps it writable and then seals it (`F_SEAL_FUTURE_WRITE`): from
then on no descriptor, the worker's or one reopened through /proc/PID/fd, can write it or map it
writable; only the agent's mapping, made before the seal, writes. A new agent makes new words
for the workers it starts: nothing outlives the worker.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
from typing import NamedTuple

_LAYOUT = struct.Struct("<QQqQ")  # seq, window_id, until_ns, open
_SEQ = struct.Struct("<Q")
SIZE = 64
# fcntl names F_SEAL_FUTURE_WRITE only from Python 3.12 (Linux 5.1+ has it: linux/fcntl.h, 0x0010).
_F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | _F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL


class WindowWord(NamedTuple):
    window_id: int
    until_ns: int
    open: bool


class WindowWriter:
    """Agent side: owns the word's writable mapping and the pipe's write end. `word_fd` and `read_fd`
    are the worker's (passed at spawn, then closed here by close_child_end)."""

    def __init__(self) -> None:
        self.word_fd = os.memfd_create("freeride-window", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.word_fd, SIZE)
            self._mm = mmap.mmap(self.word_fd, SIZE)  # shared and writable: the only writable mapping ever
            fcntl.fcntl(self.word_fd, fcntl.F_ADD_SEALS, _SEALS)
        except BaseException:
            os.close(self.word_fd)
            raise
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

    def child_fds(self) -> tuple[int, int]:
        """What the worker inherits: the word's descriptor and the pipe's read end."""
        return self.word_fd, self.read_fd

    def close_child_end(self) -> None:
        """After the worker was spawned with them, the agent drops its copies of the worker's descriptors."""
        for fd in (self.word_fd, self.read_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.word_fd = self.read_fd = -1

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._write_fd)
        self._mm.close()


class WindowReader:
    """Worker side: reads the control word; waits on the pipe when idle."""

    def __init__(self, word_fd: int, fd: int) -> None:
        """`word_fd`: the word's descriptor (mapped read-only: the seal allows nothing else); `fd`: the pipe's
        read end. Both inherited from the agent."""
        self._mm = mmap.mmap(word_fd, SIZE, access=mmap.ACCESS_READ)
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
