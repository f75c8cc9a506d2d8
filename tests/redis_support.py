"""A real redis-server for the pool tests: started on a unix socket in a temp dir, stopped and restarted at will.

Append-only persistence with an fsync per write, as the pool docs advise for a pool that must lose
nothing: a stop and a start in the same directory keep every item.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import redis

REDIS_SERVER = shutil.which("redis-server")
SKIP_REASON = ("redis-server is not installed (Debian: apt-get install redis-server; ./dev.sh test installs it "
               "when run as root)")


class RedisServer:
    def __init__(self, root: Path) -> None:
        self.root = root
        # Not under root: a unix socket's path is limited to 107 bytes, and pytest's tmp paths are long.
        self.socket = Path(tempfile.mkdtemp(prefix="redis-")) / "redis.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, name: str, db: int = 0) -> str:
        return f"unix://{self.socket}/{name}" + (f"?db={db}" if db else "")

    def client(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.socket))

    def start(self, timeout_s: float = 20.0) -> RedisServer:
        assert REDIS_SERVER is not None, SKIP_REASON
        self.root.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700",
             "--dir", str(self.root), "--save", "", "--appendonly", "yes", "--appendfsync", "always",
             "--logfile", str(self.root / "redis.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        # redis-server has no readiness notice on a plain socket; retry the PING with a growing back-off.
        deadline = time.monotonic() + timeout_s
        delay = 0.005
        while True:
            try:
                with self.client() as c:
                    if c.ping():
                        return self
            except (redis.ConnectionError, redis.BusyLoadingError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start: {self.log_tail()}") from None
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


def need_redis() -> None:
    if REDIS_SERVER is None:
        pytest.skip(SKIP_REASON)
