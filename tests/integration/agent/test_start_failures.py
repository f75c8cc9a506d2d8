"""A start that fails part way releases what it had acquired, in reverse order: the MPS daemon it started
is stopped, the socket is gone, the state directory is free for the next agent (serve's exit stack).

Runs `serve` in-process with the shipped fake GPU and the stand-in MPS control program; a listener
that cannot bind (a port already in use) is the failure, after the GPU and its MPS daemon are up.
"""

from __future__ import annotations

import asyncio
import fcntl
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.agents import free_port

from freeride.agent.config import AgentConfig, ConfigError
from freeride.agent.server import serve
from freeride.gpu._fake_mps_control import read_log

STAND_IN = f"{sys.executable} -m freeride.gpu._fake_mps_control"


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


@pytest.mark.parametrize(("busy", "error"), [("tcp", "cannot listen on TCP"), ("metrics", "cannot serve metrics")])
def test_a_start_that_cannot_bind_stops_the_mps_daemon_it_started_and_frees_the_state_dir(
    short_dir: Path, busy_port: int, busy: str, error: str
) -> None:
    token = short_dir / "token"
    token.write_text("s3cret\n")
    config = AgentConfig(
        state_dir=short_dir / "state", socket=short_dir / "a.sock", fake_gpu="default", mps="start",
        mps_control=STAND_IN, mps_pipe_dir=short_dir / "pipe", mps_log_dir=short_dir / "log",
        tcp=f"127.0.0.1:{busy_port if busy == 'tcp' else free_port()}", token_file=token,
        metrics_port=busy_port if busy == "metrics" else 0,
    ).validate()

    with pytest.raises(ConfigError, match=error):
        asyncio.run(serve(config))

    control = read_log(short_dir / "log")
    assert "daemon started" in control  # the start got as far as the GPU...
    assert control[-2:] == ["quit", "daemon stopped"]  # ...and the daemon it started is stopped
    assert not config.socket_path.exists()
    with open(config.state_dir / "agent.lock") as lock:  # released: the next agent may use the state dir
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
