"""Run one agent: open the state, serve gRPC on a unix socket, stop in order on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import gc
import grp
import logging
import os
import signal
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from freeride.agent import _systemd
from freeride.agent.config import AgentConfig, ConfigError
from freeride.agent.doctor import log_failures
from freeride.agent.edge.auth import TokenInterceptor
from freeride.agent.edge.ring import remove_stale_rings
from freeride.agent.edge.service import BubbleServicer, TaskServicer, WorkerServicer
from freeride.agent.edge.wire import RejectMalformed
from freeride.agent.engine.front import Agent
from freeride.agent.procs.cgroups import open_cgroups
from freeride.agent.procs.task_logs import TaskLogs
from freeride.agent.procs.workers import WorkerLauncher
from freeride.agent.state.registry import Registry
from freeride.core.auth import read_token
from freeride.core.cpu import format_cpu_list, pin_threads
from freeride.core.paths import file_kind
from freeride.core.private import create_private, private_dir, tighten
from freeride.gpu.control import GpuControl
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
    lock = os.fdopen(create_private(state_dir / "agent.lock", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise ConfigError(f"another agent is already using state dir {state_dir}; stop it or pick another") from None
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


def _private_state_dir(state_dir: Path) -> None:
    """The state directory and all in it readable by the agent's user only (task arguments may hold a pool's
    password); a tree left wider by an older freeride or a hand-made directory is tightened, said once."""
    private_dir(state_dir)
    changed = tighten(state_dir)
    if changed:
        modes = sorted({f"{mode:04o}" for _, mode in changed})
        log.warning("state dir %s was open to other users (modes %s): made %d paths in it owner-only",
                    state_dir, ", ".join(modes), len(changed))


def _claim_socket(path: Path, gid: int | None = None) -> None:
    """Make `path` free for this agent's socket. Only a stale socket (nobody listens: its agent died) is
    removed; anything else there is the user's and is left as it is (ConfigError)."""
    created = not path.parent.exists()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if created and gid is not None:  # the group must be able to reach the socket, not list the directory
        os.chown(path.parent, -1, gid)
        os.chmod(path.parent, 0o710)
    if not os.path.lexists(path):
        return
    what = _what_is_at(path)
    if what:
        raise ConfigError(f"--socket {path} is {what}, not a socket; move it away or pass another --socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()  # left behind by an agent that died: nobody listens
        return
    finally:
        probe.close()
    raise ConfigError(f"another agent is listening on {path}; stop it or pass another --socket")


def _what_is_at(path: Path) -> str:
    """"" for a socket (or a symlink to one), else what the path holds, in words."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "a symlink to nothing"
    if stat.S_ISSOCK(mode):
        return ""
    return f"a symlink to {file_kind(mode)}" if path.is_symlink() else file_kind(mode)


def _socket_gid(config: AgentConfig) -> int | None:
    """The socket's group, checked before anything is created: only a member (or root) may hand it over."""
    gid = config.socket_gid()
    if gid is not None and os.geteuid() != 0 and gid != os.getegid() and gid not in os.getgroups():
        raise ConfigError(
            f"--socket-group {config.socket_group}: the agent's user is not in that group; add it or run as root"
        )
    return gid


def _access_warning(config: AgentConfig, euid: int, gid: int) -> str:
    """One line for the start log when the socket lets others run code as root (or, allowed, as anyone)."""
    mode = config.socket_mode_bits()
    if mode & 0o007:
        return (f"the socket's mode {mode:04o} lets every local user submit code that runs as "
                f"{'root' if euid == 0 else 'the agent user'} (--allow-world-socket)")
    if euid == 0 and mode & 0o070:
        try:
            group = grp.getgrgid(gid).gr_name
        except KeyError:
            group = str(gid)
        return (f"the agent runs as root and its socket is open to group {group} (mode {mode:04o}): every member "
                "can submit code that runs as root; run the agent as an unprivileged user, or --socket-mode 0600")
    return ""


def _new_server(interceptors: list[grpc.aio.ServerInterceptor] | None = None) -> grpc.aio.Server:
    return grpc.aio.server(
        interceptors=[*(interceptors or []), RejectMalformed()],
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
    )


def _tcp_server(
    config: AgentConfig, token: str, tasks: TaskServicer, bubbles: BubbleServicer, health: HealthServicer
) -> grpc.aio.Server:
    """TCP gets its own server so that the token check never applies to the unix socket. No
    WorkerService there: workers are local children and attach over the socket."""
    server = _new_server([TokenInterceptor(token)])
    tasks_pb2_grpc.add_TaskServiceServicer_to_server(tasks, server)
    trainer_pb2_grpc.add_BubbleServiceServicer_to_server(bubbles, server)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    try:
        bound = server.add_insecure_port(config.tcp)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise ConfigError(f"cannot listen on TCP {config.tcp}; is the port in use?")
    return server


async def serve(config: AgentConfig, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None) -> int:
    """Run the agent until SIGTERM (or `stop`); its exit code. Whatever a start acquires (the state lock, the
    socket, the database, the GPU and its MPS daemon, listeners) is released in reverse order, also when a
    later step of the start fails."""
    token = read_token(config.token_file) if config.tcp and config.token_file is not None else None
    gid = _socket_gid(config)
    _private_state_dir(config.state_dir)
    loop = asyncio.get_running_loop()
    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(_hangups_ignored(loop))  # first: a hang-up during the start must not kill it either
        stack.enter_context(_lock_state_dir(config.state_dir))
        sock = config.socket_path
        _claim_socket(sock, gid)
        stack.callback(_unlink, sock)
        if remove_stale_rings(sock.parent, config.gpu):
            log.info("removed bubble rings a previous agent of GPU %d left in %s", config.gpu, sock.parent)
        registry = Registry(config.state_dir / "freeride.db")
        stack.callback(registry.close)
        log_failures(config)
        gpu = await loop.run_in_executor(None, GpuControl.open, config.gpu_layer)
        stack.callback(gpu.close)  # MPS `quit` if this agent started the daemon
        placement = config.worker_placement()
        agent_cpus = config.agent_cpu_set()
        if agent_cpus is not None:
            if placement.cpus is None:  # workers keep the CPUs the agent was started with, not the agent's own
                placement = dataclasses.replace(placement, cpus=frozenset(os.sched_getaffinity(0)))
            pin_threads(agent_cpus)  # before gRPC starts its threads; the executor's are swept up here
            log.info("the agent runs on CPUs %s", format_cpu_list(agent_cpus))
        cgroups, containment = (await loop.run_in_executor(None, open_cgroups, config.state_dir)
                                if config.cgroups == "auto" else (None, "--cgroups off"))
        if cgroups is not None:
            log.info("workers contained in %s: everything a task starts dies with it", containment)
        else:
            log.warning("workers contained by process group, environment mark and a record of their process trees "
                        "only (%s): a process a task starts that calls setsid(), clears its environment and leaves "
                        "the worker's tree within one memory check can outlive it", containment)
        task_logs = TaskLogs(config.state_dir / "logs", config.log_max_bytes, config.log_total_bytes)
        stack.callback(task_logs.close)  # after the workers are gone (agent.shutdown runs before)
        launcher = WorkerLauncher(config.worker_target, config.state_dir / "logs", config.gpu, placement=placement,
                                  logs=task_logs, cgroups=cgroups)
        gpu.count_groups(launcher.group_of)  # CPU mode: a worker's memory.current where its group accounts it
        # A killed predecessor's workers: each finishes its checkpoint, then whatever they left is killed.
        await launcher.reclaim(min(config.shutdown_grace_s, config.checkpoint_timeout_s))
        log.info("side-task workers run at %s", placement.describe())
        agent = Agent(config, registry, launcher, gpu=gpu, logs=task_logs, check_env=placement.to_env())
        health = HealthServicer()
        task_servicer, bubble_servicer = TaskServicer(agent), BubbleServicer(agent)
        server = _new_server()
        tasks_pb2_grpc.add_TaskServiceServicer_to_server(task_servicer, server)
        trainer_pb2_grpc.add_BubbleServiceServicer_to_server(bubble_servicer, server)
        worker_pb2_grpc.add_WorkerServiceServicer_to_server(WorkerServicer(agent), server)
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        stack.push_async_callback(server.stop, 1.0)
        # Listeners that can fail to bind go first, before the socket exists and before any worker starts.
        tcp_server = _tcp_server(config, token, task_servicer, bubble_servicer, health) if token is not None else None
        if tcp_server is not None:
            stack.push_async_callback(tcp_server.stop, 1.0)
        metrics = None
        if config.metrics_port:
            from freeride.agent.edge.metrics import MetricsServer

            metrics = MetricsServer(agent, loop).start(config.metrics_addr, config.metrics_port)
            stack.callback(metrics.stop)
        # The socket file is born with the umask's mode: keep it closed until chmod/chown set the real one.
        old_umask = os.umask(0o177)
        try:
            server.add_insecure_port(f"unix:{sock}")
            await server.start()
        finally:
            os.umask(old_umask)
        os.chmod(sock, config.socket_mode_bits())
        if gid is not None:
            os.chown(sock, -1, gid)
        warning = _access_warning(config, os.geteuid(), gid if gid is not None else os.getegid())
        if warning:
            log.warning("%s", warning)
        if tcp_server is not None:
            await tcp_server.start()
            log.info("listening on TCP %s; every call must carry the token from %s", config.tcp, config.token_file)
        stack.push_async_callback(agent.shutdown)  # workers checkpoint over the socket: before the servers stop
        await agent.start()
        # Everything allocated so far (modules, protobuf descriptors, gRPC) lives as long as the agent:
        # frozen, a full garbage collection never scans it again. Unfrozen, the first full collection
        # of a busy agent paused its loop ~40 ms (every bubble edge waiting behind it).
        gc.collect()
        gc.freeze()
        stop = stop or asyncio.Event()
        _stop_on_signals(stop)  # before anyone is told it serves: a SIGTERM from then on is an ordered shutdown
        for name in ("", *SERVICES):
            await health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("agent for GPU %d serving on unix:%s (state in %s)", config.gpu, sock, config.state_dir)
        await _serve_until_stopped(config, sock, ready, stop)
        _systemd.notify("STOPPING=1", "STATUS=stopping: checkpointing side tasks")
        await health.enter_graceful_shutdown()
        await bubble_servicer.close_streams()  # intake stops: trainers see their streams end with OK
        if metrics is not None:
            metrics.stop()
        code = await agent.shutdown()
    log.info("agent stopped")
    return code


def _stop_on_signals(stop: asyncio.Event) -> None:
    """SIGTERM or SIGINT sets `stop` (an ordered shutdown); a second one exits at once."""
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


async def _serve_until_stopped(config: AgentConfig, sock: Path, ready: asyncio.Event | None,
                               stop: asyncio.Event) -> None:
    _systemd.notify("READY=1", f"STATUS=serving GPU {config.gpu} on unix:{sock}")  # after the signal handlers
    if ready is not None:
        ready.set()
    await stop.wait()


@contextlib.contextmanager
def _hangups_ignored(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """SIGHUP's default action ends the process at once: no log line, no final state write, workers left to
    the next agent. It comes from a closed terminal (an agent started from a shell, then the shell closed)
    or from a habit of telling daemons to reopen their logs. The agent does neither: it logs to stderr,
    opened by whoever started it, so there is nothing to reopen; it says so and keeps running. SIGTERM stops it."""
    def on_hangup() -> None:
        log.warning("SIGHUP ignored (a closed terminal, or a request to reopen logs: the agent writes to the "
                    "stderr it was given and has none to reopen); stop the agent with SIGTERM")

    installed = False
    with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread (an in-process test)
        loop.add_signal_handler(signal.SIGHUP, on_hangup)
        installed = True
    try:
        yield
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGHUP)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
