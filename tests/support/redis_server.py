"""A real redis-server for the pool tests (freeride.tooling.redis_server's), skipped where none is installed.

Append-only persistence with an fsync per write, as the pool docs advise for a pool that must lose
nothing: a stop and a start in the same directory keep every item.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from freeride.tooling import redis_server

SKIP_REASON = ("redis-server is not installed (Debian: apt-get install redis-server; ./dev.sh test installs it "
               "when run as root)")


class RedisServer(redis_server.RedisServer):
    def __init__(self, root: Path) -> None:
        super().__init__(root, appendfsync="always")


def need_redis() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip(SKIP_REASON)
