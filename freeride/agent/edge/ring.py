"""The agent's end of a trainer's bubble ring (the same-host fast path, see freeride.core.ring).

One `RingChannel` per trainer stream that asks for it. The agent creates the ring file and an
eventfd, and listens on a one-shot unix socket next to them; the trainer, told the socket's path
and a random key over its gRPC stream, connects, sends the key and receives both descriptors
(SCM_RIGHTS: an eventfd cannot be opened by path). From then on its edges arrive through
`loop.add_reader` on the eventfd: no thread, no polling. The files carry the agent socket's
permissions and are removed when the stream ends.

A channel is `quiet` while the agent has nothing to grant: it then waits without asking for a
wake-up per edge (freeride.core.ring), and reads what the trainer wrote when it is woken anyway
(the half-full wake-up), when `pump` is called (a Stats call), or when `listen` ends the quiet (a
task became schedulable): from then on each edge wakes it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import mmap
import os
import socket
from collections.abc import Callable
from pathlib import Path

from freeride.core.ring import DEFAULT_RECORDS, Record, RingReader, init_ring, map_ring, ring_bytes

log = logging.getLogger("freeride.agent")

HANDSHAKE_TIMEOUT_S = 10.0
KEY_BYTES = 16
_BATCH = 4096  # records per turn of the event loop: a flood must not starve the other callbacks
_serial = itertools.count(1)


def ring_prefix(gpu: int) -> str:
    return f"ring-gpu{gpu}-"


def remove_stale_rings(directory: Path, gpu: int) -> int:
    """Ring files and sockets a killed agent of this GPU left behind (only ours: prefix and type checked)."""
    removed = 0
    with contextlib.suppress(FileNotFoundError):
        for path in directory.iterdir():
            if not path.name.startswith(ring_prefix(gpu)) or path.suffix not in (".shm", ".sock"):
                continue
            st = path.lstat()
            if st.st_uid != os.geteuid():
                continue
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += 1
    return removed


class RingChannel:
    """A ring, its wake-up eventfd and the one-shot socket that hands them over."""

    def __init__(self, directory: Path, gpu: int, mode: int, gid: int | None, records: int = DEFAULT_RECORDS) -> None:
        stem = directory / f"{ring_prefix(gpu)}{os.getpid()}-{next(_serial)}"
        self.path = stem.with_suffix(".shm")
        self.socket_path = stem.with_suffix(".sock")
        self.key = os.urandom(KEY_BYTES)
        self.attached = False
        self.quiet = False  # waiting without a wake-up per edge (set by `listen`)
        self.refused = 0  # handshake connections with a wrong key
        self._reader: RingReader | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._mm: mmap.mmap | None = None
        self._listener: socket.socket | None = None
        self._pending: list[socket.socket] = []  # connections that have not sent a key yet
        self._timer: asyncio.TimerHandle | None = None
        self._wake_fd = -1
        self._ring_fd = -1
        try:
            self._ring_fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            os.fchmod(self._ring_fd, mode)
            if gid is not None:
                os.fchown(self._ring_fd, -1, gid)
            init_ring(self._ring_fd, records)
            self._mm = map_ring(self._ring_fd, ring_bytes(records))
            self._reader = RingReader(self._mm)
            self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener = listener
            old = os.umask(0o177)  # no window in which the socket has looser permissions than the ring
            try:
                listener.bind(str(self.socket_path))
            finally:
                os.umask(old)
            os.chmod(self.socket_path, mode)
            if gid is not None:
                os.chown(self.socket_path, -1, gid)
            listener.listen(4)
            listener.setblocking(False)
        except BaseException:
            self.close()
            raise

    @property
    def reader(self) -> RingReader:
        assert self._reader is not None
        return self._reader

    def offer(self, on_fetched: Callable[[], None], on_timeout: Callable[[], None],
              timeout_s: float = HANDSHAKE_TIMEOUT_S) -> None:
        """Hand the descriptors to the first connection that sends the key, from the running loop's
        callbacks (no task to own: `close` undoes it all); then `on_fetched`, or `on_timeout` if nobody
        comes in time."""
        loop = self._loop = asyncio.get_running_loop()
        assert self._listener is not None
        self._on_fetched, self._on_timeout = on_fetched, on_timeout
        loop.add_reader(self._listener.fileno(), self._on_connect)
        self._timer = loop.call_later(timeout_s, self._give_up)

    def _on_connect(self) -> None:
        assert self._listener is not None and self._loop is not None
        try:
            conn, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        conn.setblocking(False)
        self._pending.append(conn)
        self._loop.add_reader(conn.fileno(), self._on_key, conn)

    def _on_key(self, conn: socket.socket) -> None:
        assert self._loop is not None
        try:
            key = conn.recv(KEY_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            key = b""
        self._drop(conn)
        if not hmac.compare_digest(key, self.key):
            self.refused += 1
            log.warning("bubble ring %s: a connection without the stream's key was refused", self.socket_path.name)
            conn.close()
            return
        try:
            socket.send_fds(conn, [b"R"], [self._ring_fd, self._wake_fd])
        except OSError as exc:
            log.warning("bubble ring %s: the hand-over failed (%s)", self.socket_path.name, exc)
            return
        finally:
            conn.close()
        self._close_listener()
        self._on_fetched()

    def _give_up(self) -> None:
        self._timer = None
        self._close_listener()
        self._on_timeout()

    def _drop(self, conn: socket.socket) -> None:
        assert self._loop is not None
        self._loop.remove_reader(conn.fileno())
        self._pending.remove(conn)

    def start(self, deliver: Callable[[list[Record]], None]) -> None:
        """Read the ring from the running loop, calling `deliver` with each batch of records."""
        self._loop = asyncio.get_running_loop()
        self._deliver = deliver
        self.attached = True
        self._loop.add_reader(self._wake_fd, self._on_wake)
        self.pump()  # edges written between the hand-over and now

    def _on_wake(self) -> None:
        try:  # noqa: SIM105 - not contextlib.suppress: this runs on the way to every grant
            os.read(self._wake_fd, 8)
        except BlockingIOError:
            pass
        self.reader.awake()
        self.pump()

    def listen(self, wanted: bool) -> None:
        """Ask for a wake-up per edge (True: what is already written is read now), or be quiet (False: at once,
        nothing read; from now on no edge wakes the agent, and what is written waits, as every quiet edge does)."""
        self.quiet = not wanted
        if wanted:
            self.pump()
        elif self.attached and self._reader is not None:
            self._reader.quiet()

    def pump(self) -> None:
        """Take and deliver what the trainer has written; then wait for its next wake-up (or be quiet)."""
        if not self.attached:  # closed while this turn waited in the loop
            return
        reader = self.reader
        while True:
            batch = reader.take(_BATCH)
            if batch:
                self._deliver(batch)
            if len(batch) == _BATCH:
                assert self._loop is not None
                self._loop.call_soon(self.pump)  # awake still: the trainer need not wake us
                return
            if self.quiet:
                reader.quiet()
                return
            if reader.sleep():
                return

    def close(self) -> None:
        """Take what is left, then remove the reader, the descriptors and the files."""
        if self.attached and self._loop is not None and self._reader is not None:
            self._loop.remove_reader(self._wake_fd)
            batch = self._reader.take()
            if batch:
                self._deliver(batch)
        self.attached = False
        self._close_listener()
        if self._reader is not None:
            self._reader.release()
            self._reader = None
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        for fd in (self._wake_fd, self._ring_fd):
            if fd >= 0:
                os.close(fd)
        self._wake_fd = self._ring_fd = -1
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _close_listener(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for conn in list(self._pending):
            self._drop(conn)
            conn.close()
        if self._listener is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
