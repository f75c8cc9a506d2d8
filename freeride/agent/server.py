"""Run one agent: open the state, serve gRPC on a unix socket, stop in order on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import socket
from pathlib import Path
from typing import IO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from freeride.agent.config import AgentConfig, ConfigError
from freeride.agent.core import Agent
from freeride.agent.registry import Registry
from freeride.agent.service import BubbleServicer, TaskServicer, WorkerServicer
from freeride.agent.wire import RejectMalformed
from freeride.agent.workers import WorkerLauncher
from freeride.v1 import tasks_pb2, tasks_pb2_grpc, trainer_pb2, trainer_pb2_grpc, worker_pb2, worker_pb2_grpc

log = logging.getLogger("freeride.agent")

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
SERVICES = (
    tasks_pb2.DESCRIPTOR.services_by_name["TaskService"].full_name,
    trainer_pb2.DESCRIPTOR.services_by_name["BubbleService"].full_name,
    worker_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
)


def _lock_state_dir(state_dir: Path) -> IO[str]:
    """One agent per state directory: a second one would corrupt the ledger's meaning."""
    lock = open(state_dir / "agent.lock", "w")  # noqa: SIM115 - held for the agent's lifetime
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ConfigError(f"another agent is already using state dir {state_dir}; stop it or pick another") from None
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


def _claim_socket(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()  # left behind by an agent that died: nobody listens
        return
    finally:
        probe.close()
    raise ConfigError(f"another agent is listening on {path}; stop it or pass another --socket")


async def serve(config: AgentConfig, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None) -> int:
    config.state_dir.mkdir(parents=True, exist_ok=True)
    lock = _lock_state_dir(config.state_dir)
    sock = config.socket_path
    _claim_socket(sock)
    registry = Registry(config.state_dir / "freeride.db")
    server = grpc.aio.server(
        interceptors=[RejectMalformed()],
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
    )
    agent = Agent(config, registry, WorkerLauncher(config.worker_target, config.state_dir / "logs"))
    health = HealthServicer()
    tasks_pb2_grpc.add_TaskServiceServicer_to_server(TaskServicer(agent), server)
    trainer_pb2_grpc.add_BubbleServiceServicer_to_server(BubbleServicer(agent), server)
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(WorkerServicer(agent), server)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    server.add_insecure_port(f"unix:{sock}")
    if config.tcp:
        log.warning("listening on TCP %s without authentication: only do this on a trusted network", config.tcp)
        server.add_insecure_port(config.tcp)
    await server.start()
    os.chmod(sock, 0o660)
    await agent.start()
    for name in ("", *SERVICES):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("agent for GPU %d serving on unix:%s (state in %s)", config.gpu, sock, config.state_dir)

    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            log.warning("second %s: exiting now", signal.Signals(signum).name)
            os._exit(1)
        log.info("%s: shutting down", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal, sig)
    if ready is not None:
        ready.set()
    await stop.wait()
    await health.enter_graceful_shutdown()
    code = await agent.shutdown()
    await server.stop(grace=1.0)
    registry.close()
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()
    lock.close()
    log.info("agent stopped")
    return code
