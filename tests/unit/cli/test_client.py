"""freeride.Client reaches the agent at the address it resolved: a bare socket path, or the default socket."""

from __future__ import annotations

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
