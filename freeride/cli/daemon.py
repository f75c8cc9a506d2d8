"""The daemon's commands: `agent` runs it, `doctor` checks what it needs, `health` probes a running one."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging

from grpc_health.v1 import health_pb2

from freeride.cli.common import print_json, printable
from freeride.cli.multi import one_client
from freeride.cli.settings import add_settings, agent_config


def add_agent_args(p: argparse.ArgumentParser) -> None:
    """Every setting's flag (freeride.cli.settings)."""
    add_settings(p)


def add_doctor_args(p: argparse.ArgumentParser) -> None:
    """The flags `freeride doctor` shares with the agent: the GPU layer's (docs/gpu.md), the GPU, its paths."""
    add_settings(p, doctor=True)


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

