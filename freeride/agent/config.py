"""The agent's one frozen, validated configuration; every field has a FREERIDE_* twin."""

from __future__ import annotations

import grp
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from freeride.core.cpu import Placement, allowed_cpus, parse_cpu_list
from freeride.core.paths import default_socket
from freeride.core.units import parse_retention, parse_size
from freeride.errors import FreerideError, InvalidSpecError

# A submit's check may wait for a free slot (freeride.agent.engine.refcheck.QUEUE_WAIT_S), then run up to
# --check-timeout-s: the client's deadline for Submit (freeride.client.SUBMIT_TIMEOUT_S) exceeds both together.
MAX_CHECK_TIMEOUT_S = 40.0


class ConfigError(FreerideError):
    """A configuration value is invalid; the message says which and what to use."""


@dataclass(frozen=True)
class AgentConfig:
    gpu: int = 0
    state_dir: Path = Path("freeride-state")  # relative: to the agent's working directory (the units pass one)
    socket: Path | None = None  # default: default_socket(gpu)
    tcp: str = ""  # host:port; empty means unix socket only
    margin_ms: float = 0.2
    max_restarts: int = 3
    restart_backoff_s: float = 1.0
    checkpoint_interval_s: float = 60.0
    hang_timeout_s: float = 5.0
    shutdown_grace_s: float = 10.0
    # A worker asked to stop (pause, cancel) must exit this long after the request: its step in progress,
    # state_dict() and the checkpoint's write. On SIGTERM the shorter of this and shutdown_grace_s applies.
    # Any other checkpoint (the interval's, the task's last) must end this long after it began.
    checkpoint_timeout_s: float = 300.0
    memory_check_s: float = 0.25  # how often worker memory is checked against its cap
    log_format: str = "text"
    # Each task's log (<state-dir>/logs/task-N.log) becomes task-N.log.1 at this size and a new one starts:
    # at most twice this on disk per task, the newest output always kept.
    log_max_bytes: int = 16 << 20
    # All tasks' logs together (task-N.log and .log.1 of every task, finished ones too) stay under this: past it,
    # the least recently written files are removed first (freeride.agent.procs.logbudget). At least twice log_max_bytes.
    log_total_bytes: int = 1 << 30
    # The state directory's file system this full (percent of its space, as an unprivileged writer sees it):
    # `freeride doctor` warns, the agent says so at start, /metrics' freeride_state_disk_warning is 1.
    disk_warn_percent: int = 90
    # auto: each worker in a cgroup v2 group of its own where the agent may create one (freeride.agent.procs.cgroups);
    # off: contain workers by process group and environment mark only (docs/operations.md says what each covers)
    cgroups: str = "auto"
    # GPU layer (freeride.gpu): see docs/gpu.md
    fake_gpu: str = ""  # a FakeDevice spec ("default" or "name=...,total=16GiB,..."); empty: NVML
    headroom_bytes: int = 1 << 30  # kept free on the GPU beyond what the trainer needs
    memory_cap_restarts: int = 0  # restarts (with backoff) after memory_cap_exceeded; 0: FAILED at once
    mps: str = "off"  # off | start | use
    mps_control: str = "nvidia-cuda-mps-control"  # the control program (a command line)
    mps_pipe_dir: Path | None = None  # default: start -> <socket dir>/mps-gpu<N>/pipe; use -> $CUDA_MPS_PIPE_DIRECTORY
    mps_log_dir: Path | None = None  # default: start -> next to the pipe dir; use -> $CUDA_MPS_LOG_DIRECTORY
    mps_thread_percentage: int = 0  # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for workers; 0: not set
    metrics_port: int = 0  # Prometheus /metrics on this port; 0: off
    metrics_addr: str = "127.0.0.1"  # 0.0.0.0 for a ServiceMonitor scraping the pod or node
    socket_mode: str = "0660"  # octal permissions of the unix socket: submitting runs code
    socket_group: str = ""  # group (name or gid) given the socket; empty: the agent's own
    # A --socket-mode with "other" bits lets every local user list, cancel and submit code that runs as the
    # agent's user: refused unless this is set (env FREERIDE_ALLOW_WORLD_SOCKET=1), for a host whose users are all
    # trusted or a socket directory that already keeps them out.
    allow_world_socket: bool = False
    token_file: Path | None = None  # bearer token every TCP call must carry; required with --tcp
    bubble_path: str = "auto"  # auto: offer local trainers a shared-memory ring; grpc: edges stay on their streams
    # Resident side-task workers at once; more tasks wait (queued) and start, highest priority then oldest, as
    # workers exit. Each worker is a Python process (~40 MB of host memory before the task's own, plus a CUDA
    # context on a GPU) taking CPU time the trainer's host threads may need: 8 keeps a busy GPU's bubbles filled.
    max_workers: int = 8
    check_timeout_s: float = 20.0  # a submit's reference check (import + check_args) is killed after this long
    # Finished tasks (DONE, FAILED, CANCELLED) last changed longer ago than this are removed with their checkpoint
    # and logs, at start and then as they expire: a duration like 7d, 12h, 30m; "0" or "forever": keep them.
    retention: str = "forever"
    # Side-task workers on the CPU (freeride.core.cpu): training's own CPU work (data loading, kernel launches)
    # comes first, so workers run at the lowest priority by default; niceness costs nothing on an idle core.
    worker_nice: int = 19  # 0..19
    worker_cpus: str = ""  # CPU list like "0-3,8"; empty: the agent's own CPUs
    worker_sched: str = "other"  # other | idle (SCHED_IDLE: only CPU time nothing else wants)
    # The agent's own threads (event loop, gRPC's): a CPU list, or empty to stay where it was started. Off the
    # ranks' cores, the agent a bubble edge wakes runs beside training instead of preempting it in its hook.
    agent_cpus: str = ""

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

    def worker_placement(self) -> Placement:
        """--worker-nice/--worker-cpus/--worker-sched, checked against what this host allows."""
        try:
            cpus = parse_cpu_list(self.worker_cpus) if self.worker_cpus.strip() else None
            return Placement(self.worker_nice, cpus, self.worker_sched).check()
        except ValueError as exc:
            msg = str(exc)
            raise ConfigError(msg if msg.startswith("--") else f"--worker-cpus {msg}") from None

    def agent_cpu_set(self) -> frozenset[int] | None:
        """--agent-cpus, checked against the CPUs the agent may use; None: leave the agent where it is."""
        if not self.agent_cpus.strip():
            return None
        try:
            return allowed_cpus(parse_cpu_list(self.agent_cpus), "--agent-cpus")
        except ValueError as exc:
            msg = str(exc)
            raise ConfigError(msg if msg.startswith("--") else f"--agent-cpus {msg}") from None

    @property
    def retention_s(self) -> float | None:
        """--retention in seconds; None: keep finished tasks forever."""
        try:
            return parse_retention(self.retention)
        except InvalidSpecError as exc:
            raise ConfigError(f"--retention: {exc}") from None

    @property
    def worker_target(self) -> str:
        return f"unix:{self.socket_path}"

    def validate(self) -> AgentConfig:
        if self.gpu < 0:
            raise ConfigError(f"--gpu must be >= 0, got {self.gpu}")
        if self.margin_ms < 0:
            raise ConfigError(f"--margin-ms must be >= 0, got {self.margin_ms}")
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts must be >= 0, got {self.max_restarts}")
        if self.bubble_path not in ("auto", "grpc"):
            raise ConfigError(f"--bubble-path must be auto or grpc, got {self.bubble_path!r}")
        if self.max_workers < 1:
            raise ConfigError(f"--max-workers must be >= 1, got {self.max_workers}")
        if not 0 < self.check_timeout_s <= MAX_CHECK_TIMEOUT_S:
            raise ConfigError(f"--check-timeout-s must be > 0 and at most {MAX_CHECK_TIMEOUT_S:g} (so that a submit "
                              f"is answered within the client's deadline), got {self.check_timeout_s}")
        if self.memory_check_s <= 0:
            raise ConfigError(f"--memory-check-s must be > 0, got {self.memory_check_s}")
        if self.cgroups not in ("auto", "off"):
            raise ConfigError(f"--cgroups must be auto or off, got {self.cgroups!r}")
        if self.log_max_bytes < 4096:
            raise ConfigError(f"--log-max-bytes must be at least 4KiB (a traceback must fit), got {self.log_max_bytes}")
        if self.log_total_bytes < 2 * self.log_max_bytes:
            raise ConfigError(f"--log-total-bytes must be at least twice --log-max-bytes ({2 * self.log_max_bytes} "
                              f"bytes: one task's log and its rotated part), got {self.log_total_bytes}")
        if not 1 <= self.disk_warn_percent <= 100:
            raise ConfigError(f"--disk-warn-percent must be 1..100, got {self.disk_warn_percent}")
        if self.checkpoint_timeout_s <= 0:
            raise ConfigError(f"--checkpoint-timeout-s must be > 0, got {self.checkpoint_timeout_s}")
        for name in ("restart_backoff_s", "checkpoint_interval_s", "hang_timeout_s", "shutdown_grace_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"--log-format must be 'text' or 'json', got {self.log_format!r}")
        if self.mps not in ("off", "start", "use"):
            raise ConfigError(f"--mps must be off, start or use, got {self.mps!r}")
        if not 0 <= self.mps_thread_percentage <= 100:
            raise ConfigError(f"--mps-thread-percentage must be 0 (unset) .. 100, got {self.mps_thread_percentage}")
        if self.headroom_bytes < 0:
            raise ConfigError(f"--headroom must be >= 0, got {self.headroom_bytes} bytes")
        if self.memory_cap_restarts < 0:
            raise ConfigError(f"--memory-cap-restarts must be >= 0, got {self.memory_cap_restarts}")
        if not self.mps_control.strip():
            raise ConfigError("--mps-control is empty: give the MPS control program (nvidia-cuda-mps-control)")
        if self.mps != "off" and len(str(self.mps_pipe_path / "control")) > 100:
            raise ConfigError(f"MPS pipe dir {self.mps_pipe_path} is too long for its control socket; "
                              "pick a shorter --mps-pipe-dir")
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
        self.retention_s  # noqa: B018 - parsed to check it
        self.worker_placement()
        self.agent_cpu_set()
        if len(str(self.socket_path)) > 100:
            raise ConfigError(f"socket path {self.socket_path} is too long for a unix socket; pick a shorter --socket")
        return self

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


def env_defaults(env: Mapping[str, str]) -> dict[str, object]:
    """Values from FREERIDE_<FIELD> variables, converted to each field's type as its flag converts it: a
    `*_bytes` field takes a size like its flag (64KiB), a number must be finite."""
    out: dict[str, object] = {}
    for f in fields(AgentConfig):
        raw = env.get(f"FREERIDE_{f.name.upper()}")
        if raw is None or raw == "":
            continue
        kind = _ENV_TYPES.get(str(f.type))
        try:
            if "Path" in str(f.type):
                out[f.name] = Path(raw)
            elif f.name.endswith("_bytes"):
                out[f.name] = parse_size(raw)
            elif str(f.type) == "bool":
                out[f.name] = _flag(raw)
            elif kind is not None:
                out[f.name] = kind(raw)
            else:
                out[f.name] = raw
        except (ValueError, InvalidSpecError):
            what = ("size like 64KiB or 1GiB" if f.name.endswith("_bytes")
                    else "finite number" if str(f.type) == "float"
                    else "switch: 1, true, yes or 0, false, no" if str(f.type) == "bool" else str(f.type))
            raise ConfigError(f"FREERIDE_{f.name.upper()}={raw!r} is not a valid {what}") from None
    return out


def _finite(raw: str) -> float:
    """A float env value; ValueError for nan and the infinities (as the float flags refuse them)."""
    value = float(raw)
    if not math.isfinite(value):
        raise ValueError(raw)
    return value


def _flag(raw: str) -> bool:
    """A boolean env value, as systemd and Kubernetes write them; ValueError for anything else."""
    word = raw.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


_ENV_TYPES: dict[str, Callable[[str], object]] = {"int": int, "float": _finite, "str": str}
