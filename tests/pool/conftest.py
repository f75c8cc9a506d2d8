from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from redis_support import RedisServer, need_redis


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server on a unix socket (skips, saying why, where redis-server is not installed)."""
    need_redis()
    # A short directory: a unix socket path is limited to 107 bytes.
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.kill()
