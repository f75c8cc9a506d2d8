"""The agent's one frozen, validated configuration: each setting declared once, on its field.

A field's `Setting` (its metadata) names its flag, its FREERIDE_* environment twin, its help line, the unit it is
given in and its concern (access, workers, CPU, GPU, state), as freeride.agent.settings defines them;
freeride.cli.settings builds the argparse groups from them and `env_defaults` reads the twins. Flags override
the environment, the environment the defaults.

Each concern is also a type of its own, built from those fields: `config.access`, `.workers`, `.cpu`, `.gpu_layer`
(freeride.gpu.config.GpuConfig) and `.state`, frozen, each checking itself; `validate()` asks each in turn. A
component takes its own concern (GpuControl.open the GPU layer's; the scheduler, the supervisor, its
watchdog and the worker streams the workers'), not the whole: only the agent's front, which builds them, holds it.
"""

from __future__ import annotations

import grp
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from freeride.agent.settings import ConfigError, Declared, declarations, read_env, setting
from freeride.core.cpu import Placement, allowed_cpus, parse_cpu_list
from freeride.core.paths import default_socket
from freeride.core.units import parse_retention
from freeride.errors import InvalidSpecError

if TYPE_CHECKING:  # (imported where used: the CLI's light commands read the settings, never the GPU layer)
    from freeride.gpu.config import GpuConfig

__all__ = ["MAX_CHECK_TIMEOUT_S", "AccessConfig", "AgentConfig", "ConfigError", "CpuConfig", "StateConfig",
           "WorkerConfig", "declared", "env_defaults"]

# A submit's check may wait for a free slot (freeride.agent.engine.refcheck.QUEUE_WAIT_S), then run up to
# --check-timeout-s, twice for a task with its own interpreter (its protocol probe, then the check): the client's
# deadline for Submit (freeride.client.SUBMIT_TIMEOUT_S) exceeds all together.
MAX_CHECK_TIMEOUT_S = 40.0


def _cpu_list_error(exc: ValueError, flag: str) -> ConfigError:
    msg = str(exc)
    return ConfigError(msg if msg.startswith("--") else f"{flag} {msg}")


@dataclass(frozen=True)
class AccessConfig:
    """Who reaches the agent, and how: its socket, TCP with a token, /metrics, the trainers' road."""

    socket_path: Path
    tcp: str = ""
    socket_mode: str = "0660"
    socket_group: str = ""
    allow_world_socket: bool = False
    token_file: Path | None = None
    metrics_port: int = 0
    metrics_addr: str = "127.0.0.1"
    bubble_path: str = "auto"

    @property
    def worker_target(self) -> str:
        return f"unix:{self.socket_path}"

    def check(self) -> None:
        if self.tcp:
            host, sep, port = self.tcp.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ConfigError(f"--tcp must be HOST:PORT, got {self.tcp!r}")
            if self.token_file is None:
                raise ConfigError(
                    "--tcp needs --token-file PATH (env FREERIDE_TOKEN_FILE): TCP callers could submit code, "
                    "so every TCP call must carry the token; create one with `head -c 32 /dev/urandom | base64 > PATH`"
                )
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"--metrics-port must be between 0 (off) and 65535, got {self.metrics_port}")
        self.socket_mode_bits()
        self.socket_gid()
        if len(str(self.socket_path)) > 100:
            raise ConfigError(f"socket path {self.socket_path} is too long for a unix socket; pick a shorter --socket")

    def socket_mode_bits(self) -> int:
        """--socket-mode as permission bits; owner read/write is always kept (the agent's workers use it)."""
        try:
            mode = int(self.socket_mode, 8)
        except ValueError:
            mode = -1
        if not 0 <= mode <= 0o777 or mode & 0o600 != 0o600:
            raise ConfigError(
                "--socket-mode must be octal permissions that keep owner rw, like 0660 or 0600; "
                f"got {self.socket_mode!r}"
            )
        if mode & 0o007 and not self.allow_world_socket:
            raise ConfigError(
                f"--socket-mode {self.socket_mode} lets every local user use the socket: list and cancel every task, "
                "and submit code that runs as the agent's user; use 0660 with --socket-group for the users who may, "
                "or pass --allow-world-socket (env FREERIDE_ALLOW_WORLD_SOCKET=1) if every local user is trusted"
            )
        return mode

    def socket_gid(self) -> int | None:
        """--socket-group as a gid (None: leave the agent's own group)."""
        if not self.socket_group:
            return None
        try:
            return grp.getgrnam(self.socket_group).gr_gid
        except KeyError:
            pass
        if self.socket_group.isdigit():
            return int(self.socket_group)
        raise ConfigError(
            f"--socket-group {self.socket_group!r} is not a group on this host; create it or pick another"
        )


@dataclass(frozen=True)
class WorkerConfig:
    """The side-task workers: how many, their restarts, checkpoints, timeouts and containment."""

    margin_ms: float = 0.2
    max_workers: int = 8
    max_restarts: int = 3
    restart_backoff_s: float = 1.0
    checkpoint_interval_s: float = 60.0
    hang_timeout_s: float = 5.0
    shutdown_grace_s: float = 10.0
    checkpoint_timeout_s: float = 300.0
    check_timeout_s: float = 20.0
    memory_check_s: float = 0.25
    cgroups: str = "auto"

    def check(self) -> None:
        if self.margin_ms < 0:
            raise ConfigError(f"--margin-ms must be >= 0, got {self.margin_ms}")
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts must be >= 0, got {self.max_restarts}")
        if self.max_workers < 1:
            raise ConfigError(f"--max-workers must be >= 1, got {self.max_workers}")
        if not 0 < self.check_timeout_s <= MAX_CHECK_TIMEOUT_S:
            raise ConfigError(f"--check-timeout-s must be > 0 and at most {MAX_CHECK_TIMEOUT_S:g} (so that a submit "
                              f"is answered within the client's deadline), got {self.check_timeout_s}")
        if self.memory_check_s <= 0:
            raise ConfigError(f"--memory-check-s must be > 0, got {self.memory_check_s}")
        if self.checkpoint_timeout_s <= 0:
            raise ConfigError(f"--checkpoint-timeout-s must be > 0, got {self.checkpoint_timeout_s}")
        for name in ("restart_backoff_s", "checkpoint_interval_s", "hang_timeout_s", "shutdown_grace_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class CpuConfig:
    """Where the workers and the agent itself run on the host's CPUs (freeride.core.cpu)."""

    worker_nice: int = 19
    worker_cpus: str = ""
    worker_sched: str = "other"
    agent_cpus: str = ""

    def check(self) -> None:
        self.worker_placement()
        self.agent_cpu_set()

    def worker_placement(self) -> Placement:
        """--worker-nice/--worker-cpus/--worker-sched, checked against what this host allows."""
        try:
            cpus = parse_cpu_list(self.worker_cpus) if self.worker_cpus.strip() else None
            return Placement(self.worker_nice, cpus, self.worker_sched).check()
        except ValueError as exc:
            raise _cpu_list_error(exc, "--worker-cpus") from None

    def agent_cpu_set(self) -> frozenset[int] | None:
        """--agent-cpus, checked against the CPUs the agent may use; None: leave the agent where it is."""
        if not self.agent_cpus.strip():
            return None
        try:
            return allowed_cpus(parse_cpu_list(self.agent_cpus), "--agent-cpus")
        except ValueError as exc:
            raise _cpu_list_error(exc, "--agent-cpus") from None


@dataclass(frozen=True)
class StateConfig:
    """What the agent keeps on disk: its state directory, how long finished tasks stay, the task logs' bounds."""

    state_dir: Path = Path("freeride-state")
    retention: str = "forever"
    disk_warn_percent: int = 90
    log_format: str = "text"
    log_max_bytes: int = 16 << 20
    log_total_bytes: int = 1 << 30

    @property
    def retention_s(self) -> float | None:
        """--retention in seconds; None: keep finished tasks forever."""
        try:
            return parse_retention(self.retention)
        except InvalidSpecError as exc:
            raise ConfigError(f"--retention: {exc}") from None

    def check(self) -> None:
        if self.log_max_bytes < 4096:
            raise ConfigError(f"--log-max-bytes must be at least 4KiB (a traceback must fit), got {self.log_max_bytes}")
        if self.log_total_bytes < 2 * self.log_max_bytes:
            raise ConfigError(f"--log-total-bytes must be at least twice --log-max-bytes ({2 * self.log_max_bytes} "
                              f"bytes: one task's log and its rotated part), got {self.log_total_bytes}")
        if not 1 <= self.disk_warn_percent <= 100:
            raise ConfigError(f"--disk-warn-percent must be 1..100, got {self.disk_warn_percent}")
        self.retention_s  # noqa: B018 - parsed to check it


@dataclass(frozen=True)
class AgentConfig:
    # -- access -----------------------------------------------------------------------------------
    socket: Path | None = setting(  # default: default_socket(gpu)
        None, "access", "unix socket path (default: per GPU)", metavar="PATH", doctor=True)
    tcp: str = setting(  # host:port; empty means unix socket only
        "", "access", "also listen on HOST:PORT; needs --token-file (default: off)", metavar="HOST:PORT")
    socket_mode: str = setting(  # octal permissions of the unix socket: submitting runs code
        "0660", "access", "octal permissions of the unix socket (default {default})", metavar="MODE")
    socket_group: str = setting(  # group (name or gid) given the socket; empty: the agent's own
        "", "access", "group that may use the socket: submit, report (default: the agent's own)", metavar="GROUP")
    # A --socket-mode with "other" bits lets every local user list, cancel and submit code that runs as the
    # agent's user: refused unless this is set (env FREERIDE_ALLOW_WORLD_SOCKET=1), for a host whose users are all
    # trusted or a socket directory that already keeps them out.
    allow_world_socket: bool = setting(
        False, "access", "accept a --socket-mode that lets every local user submit code running as the agent's "
                         "user (refused without it)")
    token_file: Path | None = setting(  # bearer token every TCP call must carry; required with --tcp
        None, "access", "bearer token every TCP call must carry; required with --tcp", metavar="PATH")
    metrics_port: int = setting(  # Prometheus /metrics on this port; 0: off
        0, "access", "serve Prometheus /metrics on this port (default: off)", metavar="PORT")
    metrics_addr: str = setting(  # 0.0.0.0 for a ServiceMonitor scraping the pod or node
        "127.0.0.1", "access", "address /metrics binds to; 0.0.0.0 for a scraper on another host "
                               "(default {default})", metavar="ADDR")
    # auto: offer local trainers a shared-memory ring; grpc: edges stay on their streams
    bubble_path: Literal["auto", "grpc"] = setting(
        "auto", "access", "auto (default): trainers on this host report through a shared-memory ring; grpc: keep "
                          "every trainer on its gRPC stream, e.g. where shared memory is not allowed")
    # -- side-task workers ------------------------------------------------------------------------
    margin_ms: float = setting(
        0.2, "workers", "safety margin cut from each window (default {default})", metavar="MS")
    # Resident side-task workers at once; more tasks wait (queued) and start, highest priority then oldest, as
    # workers exit. Each worker is a Python process (~40 MB of host memory before the task's own, plus a CUDA
    # context on a GPU) taking CPU time the trainer's host threads may need: 8 keeps a busy GPU's bubbles filled.
    max_workers: int = setting(
        8, "workers", "side-task workers resident at once; more tasks wait, queued (default {default})", metavar="N")
    max_restarts: int = setting(
        3, "workers", "crash restarts before FAILED (default {default})", metavar="N")
    restart_backoff_s: float = setting(
        1.0, "workers", "first restart delay (default {default})", metavar="SECONDS")
    checkpoint_interval_s: float = setting(
        60.0, "workers", "periodic checkpoint interval (default {default})", metavar="SECONDS")
    hang_timeout_s: float = setting(
        5.0, "workers", "kill a step this long after its window closed (default {default})", metavar="SECONDS")
    shutdown_grace_s: float = setting(
        10.0, "workers", "time to checkpoint on SIGTERM (default {default})", metavar="SECONDS")
    # A worker asked to stop (pause, cancel) must exit this long after the request: its step in progress,
    # state_dict() and the checkpoint's write. On SIGTERM the shorter of this and shutdown_grace_s applies.
    # Any other checkpoint (the interval's, the task's last) must end this long after it began.
    checkpoint_timeout_s: float = setting(
        300.0, "workers", "time a paused or cancelled task's worker gets to finish its step and checkpoint, and any "
                          "checkpoint gets, before it is killed (default {default})", metavar="SECONDS")
    check_timeout_s: float = setting(  # a submit's reference check (import + check_args) is killed after this long
        20.0, "workers", "a submitted task's import and check_args must finish within this, else the submit is "
                         "refused (default {default}, at most 40)", metavar="SECONDS")
    memory_check_s: float = setting(  # how often worker memory is checked against its cap
        0.25, "workers", "how often worker memory is checked against its cap (default {default})",
        metavar="SECONDS")
    # auto: each worker in a cgroup v2 group of its own where the agent may create one (freeride.agent.procs.cgroups);
    # off: contain workers by process group and environment mark only (docs/operations.md says what each covers)
    cgroups: Literal["auto", "off"] = setting(
        "auto", "workers", "auto (default): each worker in a cgroup of its own, killed with all it started, where "
                           "the agent may create cgroups; off: process group and environment mark only")
    # -- CPU placement (freeride.core.cpu) --------------------------------------------------------
    # Training's own CPU work (data loading, kernel launches) comes first, so workers run at the lowest priority by
    # default; niceness costs nothing on an idle core.
    worker_nice: int = setting(
        19, "cpu", "niceness of every worker and what it starts (default {default}: training's CPU work comes "
                   "first)", metavar="0..19")
    worker_cpus: str = setting(  # CPU list like "0-3,8"; empty: the agent's own CPUs
        "", "cpu", "CPUs workers may run on, e.g. 0-3,8 (default: the agent's own)", metavar="LIST")
    worker_sched: Literal["other", "idle"] = setting(  # idle: SCHED_IDLE, only CPU time nothing else wants
        "other", "cpu", "other (default): normal scheduling at --worker-nice; idle: SCHED_IDLE, only CPU time "
                        "nothing else wants")
    # The agent's own threads (event loop, gRPC's): a CPU list, or empty to stay where it was started. Off the
    # ranks' cores, the agent a bubble edge wakes runs beside training instead of preempting it in its hook.
    agent_cpus: str = setting(
        "", "cpu", "CPUs the agent itself runs on, e.g. a core no training rank uses, so that a bubble edge's "
                   "wake-up never preempts a rank in its hook (default: where it was started; workers keep those "
                   "CPUs unless --worker-cpus says otherwise)", metavar="LIST")
    # -- GPU layer (freeride.gpu): see docs/gpu.md ------------------------------------------------
    gpu: int = setting(0, "gpu", "GPU index this agent serves (default {default})", metavar="N", doctor=True)
    fake_gpu: str = setting(  # a FakeDevice spec ("default" or "name=...,total=16GiB,..."); empty: NVML
        "", "gpu", "run on a fake GPU, e.g. 'name=Fake H100,total=80GiB,used=60GiB' (alone: a default one)",
        metavar="SPEC", const="default", doctor=True)
    headroom_bytes: int = setting(  # kept free on the GPU beyond what the trainer needs
        1 << 30, "gpu", "GPU memory kept free beyond the trainer's needs (default {default})", flag="--headroom",
        metavar="SIZE", doctor=True)
    memory_cap_restarts: int = setting(  # restarts (with backoff) after memory_cap_exceeded; 0: FAILED at once
        0, "gpu", "restarts after memory_cap_exceeded before FAILED (default 0: FAILED at once)", metavar="N",
        doctor=True)
    mps: Literal["off", "start", "use"] = setting(
        "off", "gpu", "CUDA MPS: off (default), start a control daemon, or use a running one", doctor=True)
    mps_control: str = setting(  # the control program (a command line)
        "nvidia-cuda-mps-control", "gpu", "MPS control program (default {default})", metavar="PROGRAM", doctor=True)
    # default: start -> <socket dir>/mps-gpu<N>/pipe; use -> $CUDA_MPS_PIPE_DIRECTORY
    mps_pipe_dir: Path | None = setting(
        None, "gpu", "MPS pipe directory (default: per GPU beside the socket)", metavar="PATH", doctor=True)
    mps_log_dir: Path | None = setting(  # default: start -> next to the pipe dir; use -> $CUDA_MPS_LOG_DIRECTORY
        None, "gpu", "MPS log directory (default: beside the pipe directory)", metavar="PATH", doctor=True)
    # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for workers under MPS; 0: not set (every SM). 50 by default: on an H200 (run of
    # 2026-11-28, docs/benchmarks.md) it took the trainer's slowdown from +0.27 % [0.16, 0.40] to -0.07 % [-0.21,
    # 0.21] for 6 points of useful harvest (81 % -> 75 %).
    mps_thread_percentage: int = setting(
        50, "gpu", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for side tasks under MPS (default {default}; 0: not set, every "
                   "SM)", metavar="PCT", doctor=True)
    # A side task's kernels in a CUDA green context of N SMs (freeride.worker.green; torch >= 2.10); 0: off.
    green_sms: int = setting(
        0, "gpu", "run side tasks' kernels in a CUDA green context of N SMs (torch >= 2.10; default 0: off)",
        metavar="N")
    # -- state and logs ---------------------------------------------------------------------------
    state_dir: Path = setting(  # relative: to the agent's working directory (the units pass one)
        Path("freeride-state"), "state", "registry, ledger, checkpoints, logs (default ./{default}: relative to the "
                                         "directory the agent starts in)", metavar="PATH", doctor=True)
    # Finished tasks (DONE, FAILED, CANCELLED) last changed longer ago than this are removed with their checkpoint
    # and logs, at start and then as they expire: a duration like 7d, 12h, 30m; "0" or "forever": keep them.
    retention: str = setting(
        "forever", "state", "remove finished tasks (with checkpoint and logs) last changed longer ago than this, "
                            "like 7d or 12h: at start, then as they expire (default {default})", metavar="DURATION")
    # The state directory's file system this full (percent of its space, as an unprivileged writer sees it):
    # `freeride doctor` warns, the agent says so at start, /metrics' freeride_state_disk_warning is 1.
    disk_warn_percent: int = setting(
        90, "state", "warn (doctor, the start-up log, /metrics) once the state directory's file system is this "
                     "full (default {default})", metavar="PCT", doctor=True)
    log_format: Literal["text", "json"] = setting("text", "state", "log line format (default {default})")
    # Each task's log (<state-dir>/logs/task-N.log) becomes task-N.log.1 at this size and a new one starts:
    # at most twice this on disk per task, the newest output always kept.
    log_max_bytes: int = setting(
        16 << 20, "state", "each task's log rotates at this size, at most 2x kept (default {default})",
        metavar="SIZE")
    # All tasks' logs together (task-N.log and .log.1 of every task, finished ones too) stay under this: past it,
    # the least recently written files are removed first (freeride.agent.procs.logbudget). At least twice log_max_bytes.
    log_total_bytes: int = setting(
        1 << 30, "state", "all tasks' logs together stay under this; past it the least recently written files go "
                          "first (default {default}, at least 2x --log-max-bytes)", metavar="SIZE")

    # -- each concern as its own type ---------------------------------------------------------------
    @cached_property
    def access(self) -> AccessConfig:
        return AccessConfig(self.socket_path, self.tcp, self.socket_mode, self.socket_group, self.allow_world_socket,
                            self.token_file, self.metrics_port, self.metrics_addr, self.bubble_path)

    @cached_property
    def workers(self) -> WorkerConfig:
        return WorkerConfig(self.margin_ms, self.max_workers, self.max_restarts, self.restart_backoff_s,
                            self.checkpoint_interval_s, self.hang_timeout_s, self.shutdown_grace_s,
                            self.checkpoint_timeout_s, self.check_timeout_s, self.memory_check_s, self.cgroups)

    @cached_property
    def cpu(self) -> CpuConfig:
        return CpuConfig(self.worker_nice, self.worker_cpus, self.worker_sched, self.agent_cpus)

    @cached_property
    def gpu_layer(self) -> GpuConfig:
        from freeride.gpu.config import GpuConfig

        return GpuConfig(self.gpu, self.fake_gpu, self.headroom_bytes, self.memory_cap_restarts, self.mps,
                         self.mps_control, self.mps_pipe_path if self.mps != "off" else None, self.mps_log_path,
                         self.mps_thread_percentage, self.green_sms)

    @cached_property
    def state(self) -> StateConfig:
        return StateConfig(self.state_dir, self.retention, self.disk_warn_percent, self.log_format,
                           self.log_max_bytes, self.log_total_bytes)

    @property
    def socket_path(self) -> Path:
        return self.socket if self.socket is not None else default_socket(self.gpu)

    @property
    def mps_pipe_path(self) -> Path:
        if self.mps_pipe_dir is not None:
            return self.mps_pipe_dir
        if self.mps == "use":
            return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")
        return self.socket_path.parent / f"mps-gpu{self.gpu}" / "pipe"

    @property
    def mps_log_path(self) -> Path:
        if self.mps_log_dir is not None:
            return self.mps_log_dir
        if self.mps == "use":
            return Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY") or "/var/log/nvidia-mps")
        return self.mps_pipe_path.parent / "log"

    # (the concerns' own answers, for the callers that hold the whole configuration)
    def worker_placement(self) -> Placement:
        return self.cpu.worker_placement()

    def agent_cpu_set(self) -> frozenset[int] | None:
        return self.cpu.agent_cpu_set()

    @property
    def retention_s(self) -> float | None:
        return self.state.retention_s

    @property
    def worker_target(self) -> str:
        return self.access.worker_target

    def socket_mode_bits(self) -> int:
        return self.access.socket_mode_bits()

    def socket_gid(self) -> int | None:
        return self.access.socket_gid()

    def validate(self) -> AgentConfig:
        """Each setting against its choices, then each concern checks itself (the first problem is raised)."""
        for d in declared():
            if d.choices and getattr(self, d.name) not in d.choices:
                *first, last = d.choices
                raise ConfigError(f"{d.flag} must be {', '.join(first)} or {last}, got {getattr(self, d.name)!r}")
        if problems := self.gpu_layer.problems():
            raise ConfigError(problems[0])
        self.workers.check()
        self.state.check()
        self.access.check()
        self.cpu.check()
        return self


@cache
def declared() -> tuple[Declared, ...]:
    """Every setting of AgentConfig, in field order."""
    return declarations(AgentConfig)


def env_defaults(env: Mapping[str, str]) -> dict[str, object]:
    """Values from the settings' FREERIDE_* twins, converted as each flag converts its value: a size like 64KiB,
    a number that must be finite, a switch as systemd and Kubernetes write one."""
    return read_env(declared(), env)
