"""The CLI's subcommands: parse, call the agent, print a table or JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from grpc_health.v1 import health_pb2

from freeride.agent.config import AgentConfig, ConfigError, env_defaults
from freeride.cli import _agents, multi
from freeride.cli.common import (
    UsageError,
    absolute_ref,
    console,
    message_dict,
    number,
    print_json,
    printable,
    table,
    whole,
)
from freeride.cli.multi import STATE_NAMES
from freeride.cli.value import WORTH_COLUMNS, Pricing, Worth, gpu_hours
from freeride.client import AgentClient
from freeride.core.secrets import mask
from freeride.core.units import format_seconds, format_size, parse_size
from freeride.v1 import tasks_pb2

T = TypeVar("T")

if TYPE_CHECKING:
    from rich.table import Table


# -- agent ----------------------------------------------------------------------------------------
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


# -- client commands ------------------------------------------------------------------------------
def one_client(ns: argparse.Namespace) -> AgentClient:
    return _agents.one(ns)


def each_agent(ns: argparse.Namespace, call: Callable[[AgentClient], T]) -> Iterator[tuple[str, T]]:
    """(target, answer) of every agent the command addresses (--agent, --gpu, repeated --agent, --all); with
    several, one that does not answer is skipped with a warning."""
    return _agents.each(ns, _agents.resolve(ns), call)


def task_args(pairs: Iterable[str]) -> dict[str, str]:
    """`key=value` words as the task's arguments; a word without `=` or a key given twice is a usage error."""
    args: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"task argument {pair!r} must be key=value")
        if key in args:
            raise UsageError(f"task argument {key!r} is given twice ({key}={args[key]}, {pair}); give it once")
        args[key] = value
    return args


def mem_cap_bytes(text: str) -> int:
    """--mem as bytes; left out ("") is 0 on the wire: the task's own cap. `--mem 0` is refused, not read
    as "no cap": a task that declares a cap keeps it."""
    if not text:
        return 0
    mem = parse_size(text)
    if mem <= 0:
        raise UsageError(f"--mem {text} is no memory cap: give a size like 4GiB, or leave --mem out for the "
                         "task's own cap")
    return mem


def cmd_submit(ns: argparse.Namespace) -> int:
    spec = tasks_pb2.TaskSpec(
        name=ns.name, ref=absolute_ref(ns.ref), args=task_args(ns.args), priority=ns.priority,
        mem_limit_bytes=mem_cap_bytes(ns.mem), max_restarts=ns.max_restarts,
        checkpoint_interval_s=ns.checkpoint_interval, no_mps=ns.no_mps,
    )
    agents = _agents.resolve(ns)
    if agents.multi or ns.json:
        return multi.cmd_submit(ns, agents, spec)
    with one_client(ns) as c:
        info = c.submit(spec)
    print(printable(f"submitted task {info.id} ({info.spec.name}): {STATE_NAMES[info.state]}"))
    return 0


def cmd_ls(ns: argparse.Namespace) -> int:
    states = []
    known = sorted(set(STATE_NAMES.values()) - {"UNSPECIFIED"})
    for name in ns.state:
        if name.upper() not in known:
            raise UsageError(f"unknown state {name!r}; one of {', '.join(known)}")
        states.append(tasks_pb2.TaskState.Value(f"TASK_STATE_{name.upper()}"))
    agents = _agents.resolve(ns)
    if agents.multi or ns.json:
        return multi.cmd_ls(ns, agents, states)
    with one_client(ns) as c:
        tasks = c.list(states)
    out = table(f"tasks on {ns.target}",
                "id", "name", "state", "prio", "steps", "harvested", "progress", "restarts", "reason")
    for t in tasks:
        out.add_row(
            t.id, t.spec.name, STATE_NAMES[t.state], str(t.spec.priority), str(t.counters.steps),
            format_seconds(t.counters.harvested_s), progress_text(t.progress), str(t.restarts), t.reason,
        )
    console().print(out)
    return 0


def cmd_show(ns: argparse.Namespace) -> int:
    with _agents.owner(ns, ns.task_id) as c:
        info = c.get(ns.task_id)
    if ns.json:
        print_json({**message_dict(info), "agent": ns.target})
        return 0
    cnt = info.counters
    rows = [
        ("id", info.id), ("name", info.spec.name), ("task", info.spec.ref), ("kind", info.kind),
        ("args", mask(" ".join(f"{k}={v}" for k, v in sorted(info.spec.args.items()))) or "-"),
        ("state", STATE_NAMES[info.state]), ("reason", info.reason or "-"),
        ("priority", str(info.spec.priority)), ("memory cap", format_size(info.spec.mem_limit_bytes)),
        ("memory now", format_size(info.memory_bytes)), ("isolation", "time-sliced (--no-mps)" if info.spec.no_mps
                                                         else "MPS client when the agent runs MPS"),
        ("restarts", str(info.restarts)), ("pid", str(info.pid or "-")),
        ("log", f"{info.log_path} (freeride logs {info.id})" if info.log_path else "-"),
        ("steps", str(cnt.steps)), ("harvested", format_seconds(cnt.harvested_s)),
        ("overruns", f"{cnt.overrun_steps} steps, {format_seconds(cnt.overrun_s)}"),
        ("windows", str(cnt.windows)), ("killed steps", str(cnt.killed_steps)),
        ("step estimate (p95)", format_seconds(cnt.step_estimate_s)),
        ("peak memory", format_size(cnt.peak_memory_bytes)),
        ("checkpoint", f"at step {info.checkpoint_steps}" if info.checkpoint_steps else "-"),
        ("submitted", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.created_unix_s))),
    ]
    rows += [(f"progress.{k}", f"{v:g}") for k, v in sorted(info.progress.items())]
    out = table(None, "", "", show_header=False)
    out.columns[0].style = "bold"
    for k, v in rows:
        out.add_row(k, v)
    console().print(out)
    return 0


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


def cmd_stats(ns: argparse.Namespace) -> int:
    pricing = Pricing.from_args(ns)
    agents = _agents.resolve(ns)
    if agents.multi or ns.json:
        return multi.cmd_stats(ns, agents, pricing)
    with one_client(ns) as c:
        stats = c.stats()
    g = stats.gpu
    con = console()
    gt = table(f"GPU {g.gpu} ({ns.target}), up {format_seconds(g.uptime_s)}, {g.trainers} trainer stream(s)",
               "bubbles", "bubble time", "harvested", "efficiency", "steps", "overruns", "prediction error p50")
    gt.add_row(
        str(g.bubbles), format_seconds(g.bubble_s), format_seconds(g.harvested_s),
        f"{g.harvested_s / g.bubble_s:.1%}" if g.bubble_s else "-", str(g.steps),
        f"{g.overrun_steps} ({format_seconds(g.overrun_s)})", f"{g.prediction_error_p50:.1%}",
    )
    con.print(gt)
    con.print(_memory_table(g.memory))
    if g.trainer_streams:
        con.print(_trainers_table(g.trainer_streams))
    worth = Worth.of(g.harvested_s, g.training_s, pricing)
    wt = table("harvest in GPU-hours", *WORTH_COLUMNS)
    wt.add_row(*worth.cells())
    con.print(wt)
    tt = table("tasks", "id", "name", "state", "steps", "harvested", "GPU-h", "share of bubbles", "overruns",
               "step p95", "memory", "progress")
    for t in stats.tasks:
        cnt = t.counters
        tt.add_row(
            t.id, t.spec.name, STATE_NAMES[t.state], str(cnt.steps), format_seconds(cnt.harvested_s),
            gpu_hours(cnt.harvested_s / 3600), f"{cnt.harvested_s / g.bubble_s:.1%}" if g.bubble_s else "-",
            f"{cnt.overrun_steps} ({format_seconds(cnt.overrun_s)})", format_seconds(cnt.step_estimate_s),
            f"{format_size(t.memory_bytes)} / {format_size(t.spec.mem_limit_bytes)}",
            progress_text(t.progress),
        )
    con.print(tt)
    for line in worth.notes():
        con.print(line, highlight=False)
    return 0


def _trainers_table(streams: Iterable[tasks_pb2.TrainerStream]) -> Table:
    """One row per open trainer stream: the road its edges take (shm: the same-host ring) and what came."""
    t = table("trainers", "rank", "stage", "pid", "path", "edges", "rejected", "dropped", "peer")
    for s in sorted(streams, key=lambda s: (s.rank, s.stage, s.pid, s.peer)):
        peer = "this host" if s.peer.startswith("unix:") else s.peer  # a unix socket's peer has no address
        t.add_row(str(s.rank), str(s.stage), str(s.pid or "?"), s.path, str(s.edges), str(s.rejected),
                  str(s.dropped), peer)
    return t


def _memory_table(m: tasks_pb2.GpuMemory) -> Table:
    where = f"{m.name} ({m.uuid}), compute mode {m.compute_mode}" if m.mode != "cpu" else "CPU mode: resident memory"
    t = table(f"memory: {where}, MPS {m.mps or 'off'}" + (" [fake GPU]" if m.mode == "fake" else ""),
              "total", "used", "free", "trainer & others", "trainer peak", "side tasks (now / reserved)",
              "usable for side tasks", "waiting")
    t.add_row(
        format_size(m.total_bytes), format_size(m.used_bytes), format_size(m.free_bytes),
        format_size(m.others_used_bytes), format_size(m.trainer_peak_bytes),
        f"{format_size(m.side_tasks_used_bytes)} / {format_size(m.side_tasks_reserved_bytes)}",
        "unbounded" if m.usable_bytes < 0 else format_size(m.usable_bytes) if m.usable_bytes else "0",
        str(m.waiting_tasks),
    )
    return t


def progress_text(progress: Mapping[str, float], limit: int | None = None) -> str:
    """A task's latest progress map (what its progress() returned), compact: 'accuracy=0.91 loss=0.32'."""
    return " ".join(f"{k}={v:.4g}" for k, v in sorted(progress.items())[:limit]) or "-"
