"""Fetch the ring the agent offered: its file and wake-up eventfd, over the one-shot unix socket."""

from __future__ import annotations

import contextlib
import os
import socket

from freeride.core.ring import RingWriter, map_ring

HANDSHAKE_TIMEOUT_S = 5.0


def fetch_ring(socket_path: str, key: bytes, wake_fd: int) -> RingWriter:
    """Connect, send the key, receive (ring file, eventfd); the eventfd lands on `wake_fd` if that is >= 0
    (dup2: the number the hook writes to never changes, so a hook racing a detach never writes elsewhere).
    Raises OSError or RingError; the caller stays on gRPC then."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(HANDSHAKE_TIMEOUT_S)
        sock.connect(socket_path)
        sock.sendall(key)
        _, fds, _, _ = socket.recv_fds(sock, 16, 2)
    if len(fds) != 2:
        for fd in fds:
            os.close(fd)
        raise OSError(f"the agent's ring socket {socket_path} sent {len(fds)} descriptors, not 2")
    ring_fd, event_fd = fds
    try:
        mm = map_ring(ring_fd, os.fstat(ring_fd).st_size)
    except BaseException:
        os.close(event_fd)
        raise
    finally:
        os.close(ring_fd)  # the mapping keeps the file
    if wake_fd >= 0:
        os.dup2(event_fd, wake_fd, inheritable=False)
        os.close(event_fd)
        event_fd = wake_fd
    try:
        return RingWriter(mm, event_fd)
    except BaseException:
        with contextlib.suppress(BufferError):
            mm.close()
        raise


def park(wake_fd: int) -> None:
    """Point `wake_fd` at /dev/null: a hook still holding a detached writer wakes nobody and harms nothing."""
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.dup2(null, wake_fd, inheritable=False)
    finally:
        os.close(null)
