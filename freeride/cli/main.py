"""The `freeride` command line. Configures logging; everything below it only uses loggers."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from freeride.errors import FreerideError

_AGENT_HINT = "start one with `freeride agent --gpu N --state-dir DIR` (or pass --agent ADDRESS)"


class UsageError(FreerideError):
    """Bad command-line input."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _add_agent_args(p: argparse.ArgumentParser) -> None:
    from freeride.cli import _agents

    _agents.add_args(p)
    p.add_argument("--gpu", type=int, default=None,
                   help="GPU whose default agent socket to use when --agent is not given (env FREERIDE_GPU)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def build_parser() -> argparse.ArgumentParser:
    from freeride.cli import commands, timeline

    parser = _Parser(prog="freeride", description="Run side tasks in the bubbles of pipeline-parallel training.")
    parser.add_argument("--log-level", default=os.environ.get("FREERIDE_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    a = sub.add_parser("agent", help="run the agent for one GPU (a daemon)")
    commands.add_agent_args(a)
    a.set_defaults(func=commands.cmd_agent)

    s = sub.add_parser("submit", help="submit a side task")
    _add_agent_args(s)
    s.add_argument("ref", help="package.module:Class or path/to/file.py:Class")
    s.add_argument("args", nargs="*", metavar="key=value", help="arguments for the task's constructor")
    s.add_argument("--name", default="")
    s.add_argument("--priority", type=int, default=0, help="0..100, higher runs first (default: the task's own)")
    s.add_argument("--mem", default="", help="memory cap, e.g. 4GiB (default: the task's own)")
    s.add_argument("--max-restarts", type=int, default=-1, help="crash restarts before FAILED (default: agent's)")
    s.add_argument("--checkpoint-interval", type=float, default=0.0, metavar="SECONDS")
    s.add_argument("--no-mps", action="store_true",
                   help="run outside MPS, time-sliced: for untrusted tasks (an MPS client's GPU fault reaches all)")
    s.set_defaults(func=commands.cmd_submit)

    ls = sub.add_parser("ls", help="list tasks")
    _add_agent_args(ls)
    ls.add_argument("--state", action="append", default=[], help="only tasks in this state (repeatable)")
    ls.set_defaults(func=commands.cmd_ls)

    for name, helptext in (
        ("show", "show one task"),
        ("cancel", "cancel a task (it checkpoints first)"),
        ("pause", "pause a task (it checkpoints and frees its memory)"),
        ("resume", "resume a paused task from its checkpoint"),
    ):
        p = sub.add_parser(name, help=helptext)
        _add_agent_args(p)
        p.add_argument("task_id")
        p.set_defaults(func=commands.cmd_task_action, action=name)

    doc = sub.add_parser("doctor", help="check driver, NVML, GPU mode, MPS and directories; say how to fix them")
    commands.add_gpu_args(doc)
    doc.add_argument("--gpu", type=int, help="GPU index to check (env FREERIDE_GPU)")
    doc.add_argument("--state-dir", type=Path, help="the agent's state dir (env FREERIDE_STATE_DIR)")
    doc.add_argument("--socket", type=Path, help="the agent's socket path (env FREERIDE_SOCKET)")
    doc.add_argument("--json", action="store_true", help="print JSON")
    doc.set_defaults(func=commands.cmd_doctor)

    st = sub.add_parser("stats", help="harvested GPU time per task and per GPU")
    _add_agent_args(st)
    st.set_defaults(func=commands.cmd_stats)

    top = sub.add_parser("top", help="a live view of tasks and GPUs (Ctrl-C to quit)")
    _add_agent_args(top)
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                     help="redraw at least this often (events redraw sooner; default 1)")
    from freeride.cli import top as top_view

    top.set_defaults(func=top_view.cmd_top)

    h = sub.add_parser("health", help="exit 0 when the agent serves (for probes: systemd, Kubernetes, Slurm)")
    _add_agent_args(h)
    h.add_argument("--timeout-s", type=float, default=5.0, help="give up after this long (default 5)")
    h.add_argument("--wait-s", type=float, default=0.0, help="first wait up to this long for the agent to come up")
    h.set_defaults(func=commands.cmd_health)

    timeline.add_parser(sub, _add_agent_args)

    b = sub.add_parser("bench", help="benchmarks (JSON on stdout)")
    bsub = b.add_subparsers(dest="bench", required=True, parser_class=_Parser)
    from freeride.bench import cli as bench_cli

    bench_cli.add_parsers(bsub)

    d = sub.add_parser("demo", help="the main demo: a real pipeline training a transformer, side tasks in its bubbles")
    from freeride import demo

    demo.add_args(d)
    d.set_defaults(func=demo.cmd_demo)
    return parser


def message_dict(msg: Message) -> dict[str, Any]:
    """A message as `--json` prints it: proto field names, every field present."""
    return MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def print_json(obj: Message | dict[str, Any] | list[Any]) -> None:
    print(json.dumps(message_dict(obj) if isinstance(obj, Message) else obj, indent=2, sort_keys=True))


def _fail(message: str) -> int:
    print(f"freeride: error: {message}", file=sys.stderr)
    return 2


def run(func: Callable[[argparse.Namespace], int], ns: argparse.Namespace) -> int:
    try:
        return func(ns)
    except FreerideError as exc:
        return _fail(str(exc))
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and not getattr(
            exc, "details", lambda: ""
        )().startswith("the agent"):
            return _fail(f"no agent answers at {getattr(ns, 'target', 'the agent address')}: {_AGENT_HINT}")
        return _fail(exc.details() if hasattr(exc, "details") else str(exc))
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        return _fail(f"{exc.strerror or exc}:{where}")
    except KeyboardInterrupt:
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    level = getattr(logging, str(ns.log_level).upper(), None)
    if not isinstance(level, int):
        return _fail(f"--log-level {ns.log_level!r} is not one of DEBUG, INFO, WARNING, ERROR")
    if ns.command != "agent":
        logging.basicConfig(level=max(level, logging.WARNING), format="%(levelname)s %(name)s: %(message)s")
    return run(ns.func, ns)


def absolute_ref(ref: str) -> str:
    """Make a file reference absolute: the agent resolves paths from its own directory."""
    path, sep, cls = ref.rpartition(":")
    if sep and path.endswith(".py"):
        return f"{Path(path).absolute()}:{cls}"
    return ref


if __name__ == "__main__":
    sys.exit(main())
