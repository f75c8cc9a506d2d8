"""A redis-server of our own for `freeride bench pool` and the pool fault tests: a unix socket, append-only file.

The socket lives in a short private directory (a unix socket's path is limited to 107 bytes); the
data (the append-only file) in `root`, so `stop()` (SHUTDOWN) and `start()` again keep every item.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from freeride.errors import FreerideError


def redis_server_program() -> str:
    """The redis-server executable, or FreerideError saying how to install it."""
    program = shutil.which("redis-server")
    if program is None:
        raise FreerideError("redis-server is not installed (Debian: apt-get install redis-server), or pass the "
                            "URL of a running Redis")
    return program


class RedisServer:
    """redis-server on a unix socket; `appendfsync`: always (an fsync per write) or everysec (the docs' advice)."""

    def __init__(self, root: Path, appendfsync: str = "everysec") -> None:
        self.root = root
        self.appendfsync = appendfsync
        self.socket = Path(tempfile.mkdtemp(prefix="redis-")) / "redis.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, name: str) -> str:
        """The pool URL of pool `name` on this server."""
        return f"unix://{self.socket}/{name}"

    def client(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.socket))

    def start(self, timeout_s: float = 20.0) -> RedisServer:
        self.root.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [redis_server_program(), "--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700",
             "--dir", str(self.root), "--save", "", "--appendonly", "yes", "--appendfsync", self.appendfsync,
             "--logfile", str(self.root / "redis.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        # redis-server has no readiness notice on a plain socket: retry the PING with a growing back-off.
        deadline = time.monotonic() + timeout_s
        delay = 0.005
        while True:
            try:
                with self.client() as c:
                    if c.ping():
                        return self
            except (redis.ConnectionError, redis.BusyLoadingError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise FreerideError(f"redis-server did not start: {self.log_tail()}") from None
            time.sleep(delay)
            delay = min(0.1, delay * 2)

    def stop(self) -> None:
        """SHUTDOWN: the append-only file is complete, the socket removed."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            with self.client() as c:
                c.shutdown(nosave=False)
        except redis.ConnectionError:
            pass
        self.proc.wait(timeout=30)

    def kill(self) -> None:
        """Kill the server (if running) and remove its socket's directory."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        shutil.rmtree(self.socket.parent, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join((self.root / "redis.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
