"""freeride.Client reaches the agent at the address it resolved: a bare socket path, or the default socket."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

import freeride


@pytest.fixture
def health_socket(tmp_path: Path) -> Iterator[Path]:
    """A gRPC server answering the standard health check on a unix socket in `tmp_path`."""
    path = tmp_path / "agent-gpu0.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{path}")
    server.start()
    try:
        yield path
    finally:
        server.stop(None)


def test_a_bare_socket_path_reaches_the_agent(health_socket: Path) -> None:
    with freeride.Client(str(health_socket), timeout_s=5) as c:
        assert c.target == f"unix:{health_socket}"
        assert c.health() == health_pb2.HealthCheckResponse.SERVING


def test_no_target_reaches_the_default_socket(health_socket: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FREERIDE_AGENT", raising=False)
    monkeypatch.setenv("FREERIDE_SOCKET_DIR", str(health_socket.parent))
    with freeride.Client(timeout_s=5) as c:
        assert c.health() == health_pb2.HealthCheckResponse.SERVING


def _relay(a: socket.socket, b: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := a.recv(65536):
            b.sendall(data)
    with contextlib.suppress(OSError):
        b.shutdown(socket.SHUT_WR)


@pytest.fixture
def slow_handshake(health_socket: Path) -> Iterator[Path]:
    """A socket in front of `health_socket` that accepts at once but passes nothing on for a second: an agent
    on a loaded machine, whose answer to the connection (HTTP/2's SETTINGS) comes late."""
    path = health_socket.parent / "slow.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen()
    closing = threading.Event()
    threads: list[threading.Thread] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = listener.accept()
                if closing.wait(1.0):  # the late answer (and the test's end)
                    client.close()
                    return
                agent = socket.socket(socket.AF_UNIX)
                agent.connect(str(health_socket))
                for a, b in ((client, agent), (agent, client)):
                    t = threading.Thread(target=_relay, args=(a, b), daemon=True)
                    t.start()
                    threads.append(t)

    acceptor = threading.Thread(target=serve, daemon=True)
    acceptor.start()
    try:
        yield path
    finally:
        closing.set()
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        acceptor.join(5)


def test_an_agent_that_answers_the_connection_late_is_waited_for_not_called_unavailable(slow_handshake: Path) -> None:
    # Reliability fix 67: the client's channel set gRPC's min_reconnect_backoff_ms to 50, which is also its
    # connect timeout (raised to 100 ms): on a loaded machine a live agent that answered the connection later was
    # reported as "no agent answers" (UNAVAILABLE: timed out before receiving SETTINGS frame).
    with freeride.Client(str(slow_handshake), timeout_s=10) as c:
        assert c.health() == health_pb2.HealthCheckResponse.SERVING


def test_no_agent_at_the_socket_is_said_at_once(tmp_path: Path) -> None:
    path = tmp_path / "agent-gpu0.sock"
    socket.socket(socket.AF_UNIX).bind(str(path))  # the socket file of an agent that died: nobody listens
    with freeride.Client(str(path), timeout_s=30) as c:
        started = time.monotonic()
        with pytest.raises(freeride.AgentUnavailableError):
            c.health()
        assert time.monotonic() - started < 10  # refused at once, not after the call's 30 s
