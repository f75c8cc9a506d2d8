"""The daemon's commands: `agent` runs it, `doctor` checks what it needs, `health` probes a running one."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
from pathlib import Path

from grpc_health.v1 import health_pb2

from freeride.agent.config import AgentConfig, ConfigError, env_defaults
from freeride.cli.common import number, print_json, printable, whole
from freeride.cli.multi import one_client
from freeride.core.units import format_size, parse_size


def add_agent_args(p: argparse.ArgumentParser) -> None:
    d = AgentConfig()
    p.add_argument("--gpu", type=whole(), help=f"GPU index this agent serves (env FREERIDE_GPU, default {d.gpu})")
    p.add_argument("--state-dir", type=Path,
                   help=f"registry, ledger, checkpoints, logs (env FREERIDE_STATE_DIR; default ./{d.state_dir}: "
                        "relative to the directory the agent starts in)")
    p.add_argument("--socket", type=Path, help="unix socket path (env FREERIDE_SOCKET; default per GPU)")
    p.add_argument("--tcp", help="also listen on HOST:PORT; needs --token-file (env FREERIDE_TCP; off by default)")
    p.add_argument("--margin-ms", type=number, help=f"safety margin cut from each window (default {d.margin_ms})")
    p.add_argument("--max-restarts", type=whole(), help=f"crash restarts before FAILED (default {d.max_restarts})")
    p.add_argument("--restart-backoff-s", type=number, help=f"first restart delay (default {d.restart_backoff_s})")
    p.add_argument("--checkpoint-interval-s", type=number,
                   help=f"periodic checkpoint interval (default {d.checkpoint_interval_s})")
    p.add_argument("--hang-timeout-s", type=number,
                   help=f"kill a step this long after its window closed (default {d.hang_timeout_s})")
    p.add_argument("--shutdown-grace-s", type=number,
                   help=f"time to checkpoint on SIGTERM (default {d.shutdown_grace_s})")
    p.add_argument("--checkpoint-timeout-s", type=number,
                   help="time a paused or cancelled task's worker gets to finish its step and checkpoint, and "
                        "any checkpoint gets, before it is killed "
                        f"(default {d.checkpoint_timeout_s:g}; env FREERIDE_CHECKPOINT_TIMEOUT_S)")
    p.add_argument("--max-workers", type=whole(),
                   help=f"side-task workers resident at once; more tasks wait, queued (default {d.max_workers}; "
                        "env FREERIDE_MAX_WORKERS)")
    p.add_argument("--check-timeout-s", type=number,
                   help="a submitted task's import and check_args must finish within this, else the submit is "
                        f"refused (default {d.check_timeout_s:g}, at most 40; env FREERIDE_CHECK_TIMEOUT_S)")
    p.add_argument("--memory-check-s", type=number,
                   help=f"how often worker memory is checked against its cap (default {d.memory_check_s})")
    p.add_argument("--log-format", choices=["text", "json"], help="log line format (env FREERIDE_LOG_FORMAT)")
    p.add_argument("--cgroups", choices=["auto", "off"],
                   help="auto (default): each worker in a cgroup of its own, killed with all it started, where the "
                        "agent may create cgroups; off: process group and environment mark only (env FREERIDE_CGROUPS)")
    p.add_argument("--log-max-bytes", type=parse_size, metavar="SIZE",
                   help=f"each task's log rotates at this size, at most 2x kept (default "
                        f"{format_size(d.log_max_bytes)}; env FREERIDE_LOG_MAX_BYTES)")
    p.add_argument("--log-total-bytes", type=parse_size, metavar="SIZE",
                   help="all tasks' logs together stay under this; past it the least recently written files go "
                        f"first (default {format_size(d.log_total_bytes)}, at least 2x --log-max-bytes; "
                        "env FREERIDE_LOG_TOTAL_BYTES)")
    p.add_argument("--disk-warn-percent", type=whole(), metavar="PCT",
                   help="warn (doctor, the start-up log, /metrics) once the state directory's file system is this "
                        f"full (default {d.disk_warn_percent}; env FREERIDE_DISK_WARN_PERCENT)")
    p.add_argument("--metrics-port", type=whole(),
                   help="serve Prometheus /metrics on this port (env FREERIDE_METRICS_PORT; default off)")
    p.add_argument("--metrics-addr",
                   help=f"address /metrics binds to; 0.0.0.0 for a scraper on another host (default {d.metrics_addr})")
    p.add_argument("--socket-mode",
                   help=f"octal permissions of the unix socket (env FREERIDE_SOCKET_MODE, default {d.socket_mode})")
    p.add_argument("--socket-group", help="group that may use the socket: submit, report (env FREERIDE_SOCKET_GROUP)")
    p.add_argument("--allow-world-socket", action="store_true", default=None,
                   help="accept a --socket-mode that lets every local user submit code running as the agent's user "
                        "(refused without it; env FREERIDE_ALLOW_WORLD_SOCKET=1)")
    p.add_argument("--token-file", type=Path,
                   help="bearer token every TCP call must carry; required with --tcp (env FREERIDE_TOKEN_FILE)")
    p.add_argument("--bubble-path", choices=["auto", "grpc"],
                   help="auto (default): trainers on this host report through a shared-memory ring; grpc: keep "
                        "every trainer on its gRPC stream, e.g. where shared memory is not allowed "
                        "(env FREERIDE_BUBBLE_PATH)")
    p.add_argument("--retention", metavar="DURATION",
                   help="remove finished tasks (with checkpoint and logs) last changed longer ago than this, like "
                        "7d or 12h: at start, then as they expire (env FREERIDE_RETENTION; default forever)")
    w = p.add_argument_group("the agent and its side-task workers on the CPU (docs/operations.md)")
    w.add_argument("--worker-nice", type=whole(), metavar="0..19",
                   help=f"niceness of every worker and what it starts (default {d.worker_nice}: training's CPU work "
                        "comes first; env FREERIDE_WORKER_NICE)")
    w.add_argument("--worker-cpus", metavar="LIST",
                   help="CPUs workers may run on, e.g. 0-3,8 (default: the agent's own; env FREERIDE_WORKER_CPUS)")
    w.add_argument("--worker-sched", choices=["other", "idle"],
                   help="other (default): normal scheduling at --worker-nice; idle: SCHED_IDLE, only CPU time "
                        "nothing else wants (env FREERIDE_WORKER_SCHED)")
    w.add_argument("--agent-cpus", metavar="LIST",
                   help="CPUs the agent itself runs on, e.g. a core no training rank uses, so that a bubble edge's "
                        "wake-up never preempts a rank in its hook (default: where it was started; workers keep "
                        "those CPUs unless --worker-cpus says otherwise; env FREERIDE_AGENT_CPUS)")
    add_gpu_args(p)


def add_gpu_args(p: argparse.ArgumentParser) -> None:
    """The GPU layer's agent flags (docs/gpu.md); `freeride doctor` takes the same."""
    d = AgentConfig()
    g = p.add_argument_group("GPU (docs/gpu.md)")
    g.add_argument("--fake-gpu", nargs="?", const="default", metavar="SPEC",
                   help="run on a fake GPU, e.g. 'name=Fake H100,total=80GiB,used=60GiB' (env FREERIDE_FAKE_GPU)")
    g.add_argument("--headroom", dest="headroom_bytes", type=parse_size, metavar="SIZE",
                   help=f"GPU memory kept free beyond the trainer's needs (default {format_size(d.headroom_bytes)}; "
                        "env FREERIDE_HEADROOM_BYTES)")
    g.add_argument("--memory-cap-restarts", type=whole(),
                   help="restarts after memory_cap_exceeded before FAILED (default 0: FAILED at once)")
    g.add_argument("--mps", choices=["off", "start", "use"],
                   help="CUDA MPS: off (default), start a control daemon, or use a running one (env FREERIDE_MPS)")
    g.add_argument("--mps-control", metavar="PROGRAM",
                   help=f"MPS control program (default {d.mps_control}; env FREERIDE_MPS_CONTROL)")
    g.add_argument("--mps-pipe-dir", type=Path, help="MPS pipe directory (default: per GPU beside the socket)")
    g.add_argument("--mps-log-dir", type=Path, help="MPS log directory (default: beside the pipe directory)")
    g.add_argument("--mps-thread-percentage", type=whole(), metavar="PCT",
                   help="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for side tasks (default: not set)")


class _JsonFormatter(logging.Formatter):
    """One JSON object per line; `gpu` tells apart the agents of a node in one log stream."""

    def __init__(self, gpu: int | None = None) -> None:
        super().__init__()
        self._gpu = gpu

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": record.created, "level": record.levelname, "logger": record.name, "msg": record.getMessage(),
        }
        if self._gpu is not None:
            out["gpu"] = self._gpu
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


class _LineFormatter(logging.Formatter):
    """One event, one line: a task's name or exception message cannot start a forged line or drive the terminal
    (its control characters are escaped; a traceback keeps its own lines). JSON lines escape them anyway."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)


def agent_config(ns: argparse.Namespace) -> AgentConfig:
    values = env_defaults(os.environ)
    for name in AgentConfig.__dataclass_fields__:
        given = getattr(ns, name, None)
        if given is not None:
            values[name] = given
    try:
        return AgentConfig(**values).validate()  # type: ignore[arg-type]
    except TypeError as exc:
        raise ConfigError(str(exc)) from None


def cmd_agent(ns: argparse.Namespace) -> int:
    from freeride.agent.server import serve

    config = agent_config(ns)
    handler = logging.StreamHandler()
    if config.log_format == "json":
        handler.setFormatter(_JsonFormatter(config.gpu))
    else:
        handler.setFormatter(_LineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=ns.log_level.upper(), handlers=[handler], force=True)
    return asyncio.run(serve(config))


def cmd_doctor(ns: argparse.Namespace) -> int:
    from freeride.agent.doctor import as_json, failed, format_line, run_checks

    checks = run_checks(agent_config(ns))
    if ns.json:
        print(json.dumps(as_json(checks), indent=2))
    else:
        for c in checks:
            print(format_line(c))
    return 1 if failed(checks) else 0



def cmd_health(ns: argparse.Namespace) -> int:
    """The standard gRPC health check, as a command: 0 SERVING, 1 anything else, 2 no agent answers."""
    with one_client(ns) as c:
        c.timeout_s = ns.timeout_s
        if ns.wait_s > 0:
            c.wait_ready(ns.wait_s)
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(c.health())
    if ns.json:
        print_json({"agent": ns.target, "status": status})
    else:
        print(f"{ns.target}: {status}")
    return 0 if status == "SERVING" else 1

