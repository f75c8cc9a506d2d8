"""The product's commands (agent, submit, ls, ..., doctor, stats, top, health, pool) and how they run.

The `freeride` entry point (freeride.main) adds the tooling's commands (bench, demo, timeline) to
these. Configures logging; everything below it only uses loggers.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable, Collection, Sequence
from typing import NoReturn

from freeride.cli import _agents, daemon, manage, tasks
from freeride.cli import ledger as ledger_cli
from freeride.cli import logs as logs_cli
from freeride.cli import pool as pool_cli
from freeride.cli import stats as stats_cli
from freeride.cli import top as top_view
from freeride.cli import value as value_cli
from freeride.cli.common import printable, seconds, whole
from freeride.core.paths import socket_access_problem
from freeride.errors import AgentNotReadyError, AgentUnavailableError, FreerideError

_AGENT_HINT = "start one with `freeride agent --gpu N --state-dir DIR` (or pass --agent ADDRESS)"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def add_agent_args(p: argparse.ArgumentParser) -> None:
    """The flags that pick the agent(s) a command talks to."""
    _agents.add_args(p)
    p.add_argument("--gpu", type=whole(0), default=None,
                   help="GPU whose default agent socket to use when --agent is not given (env FREERIDE_GPU)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


AddCommands = Callable[[argparse._SubParsersAction], None]


def subcommands(p: argparse.ArgumentParser, dest: str) -> argparse._SubParsersAction:
    """A command's own subcommands (e.g. `bench control`), with the CLI's one-line usage errors."""
    return p.add_subparsers(dest=dest, required=True, parser_class=_Parser)


def build_parser(more: AddCommands | None = None) -> argparse.ArgumentParser:
    """The product's commands, then whatever `more` adds (the entry point adds the tooling's)."""
    parser = _Parser(
        prog="freeride", description="Run side tasks in the bubbles of pipeline-parallel training.",
        epilog="The agent keeps its tasks, checkpoints and logs in --state-dir (FREERIDE_STATE_DIR), by default "
               "./freeride-state: relative to the directory it starts in. Commands reach agents through their "
               "sockets in $FREERIDE_SOCKET_DIR, else $XDG_RUNTIME_DIR/freeride, else /tmp/freeride-UID.",
    )
    parser.add_argument("--log-level", default=os.environ.get("FREERIDE_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    a = sub.add_parser("agent", help="run the agent for one GPU (a daemon)")
    daemon.add_agent_args(a)
    a.set_defaults(func=daemon.cmd_agent)

    s = sub.add_parser("submit", help="submit a side task (to every agent with --all or --agent repeated)")
    add_agent_args(s)
    s.add_argument("ref", help="package.module:Class or path/to/file.py:Class")
    s.add_argument("args", nargs="*", metavar="key=value", help="arguments for the task's constructor")
    s.add_argument("--name", default="")
    s.add_argument("--priority", type=whole(0, 100), default=0, metavar="0..100",
                   help="higher runs first (default: the task's own)")
    s.add_argument("--mem", default="", metavar="SIZE",
                   help="memory cap, e.g. 4GiB; left out: the task's own (its mem_limit_bytes, else none)")
    s.add_argument("--max-restarts", type=whole(0, 1000, hint="; leave it out for the agent's default"), default=None,
                   metavar="0..1000",
                   help="crash restarts before FAILED (default: the agent's --max-restarts)")
    s.add_argument("--checkpoint-interval", type=seconds(0, 7 * 86400), default=0.0, metavar="SECONDS",
                   help="periodic checkpoint interval (default: the agent's --checkpoint-interval-s)")
    s.add_argument("--no-mps", action="store_true",
                   help="run outside MPS, time-sliced: for untrusted tasks (an MPS client's GPU fault reaches all)")
    s.add_argument("--python", default="", metavar="PATH",
                   help="run the task in this interpreter (e.g. /opt/hf/bin/python: a venv with the task's own "
                        "dependencies and freeride at the agent's version); a bare name is looked up on PATH; "
                        "default: the agent's own")
    s.set_defaults(func=tasks.cmd_submit)

    ls = sub.add_parser("ls", help="list tasks")
    add_agent_args(ls)
    ls.add_argument("--state", action="append", default=[], help="only tasks in this state (repeatable)")
    ls.set_defaults(func=tasks.cmd_ls)

    show = sub.add_parser("show", help="show one task")
    add_agent_args(show)
    show.add_argument("task_id")
    show.set_defaults(func=tasks.cmd_show)
    manage.add_parsers(sub, add_agent_args)  # cancel, pause, resume (several ids, --all), rm, prune

    lg = sub.add_parser("logs", help="a task's output and traceback; -f follows it until the task is over")
    add_agent_args(lg)
    logs_cli.add_args(lg)
    lg.set_defaults(func=logs_cli.cmd_logs)

    doc = sub.add_parser("doctor", help="check driver, NVML, GPU mode, MPS and directories; say how to fix them")
    daemon.add_doctor_args(doc)  # the agent's GPU settings, --socket, --state-dir, --disk-warn-percent
    doc.add_argument("--json", action="store_true", help="print JSON")
    doc.set_defaults(func=daemon.cmd_doctor)

    st = sub.add_parser("stats", help="harvested GPU time per task and per GPU, in GPU-hours and what they are worth")
    add_agent_args(st)
    value_cli.add_args(st)
    st.set_defaults(func=stats_cli.cmd_stats)

    top = sub.add_parser("top", help="a live view of tasks and GPUs (Ctrl-C to quit)")
    add_agent_args(top)
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--interval", type=seconds(0, above=True), default=1.0, metavar="SECONDS",
                     help="redraw at least this often (events redraw sooner; default 1)")
    top.set_defaults(func=top_view.cmd_top)

    h = sub.add_parser("health", help="exit 0 when the agent serves (for probes: systemd, Kubernetes, Slurm)")
    add_agent_args(h)
    h.add_argument("--timeout-s", type=seconds(0, above=True), default=5.0, help="give up after this long (default 5)")
    h.add_argument("--wait-s", type=seconds(0), default=0.0, help="first wait up to this long for the agent to come up")
    h.set_defaults(func=daemon.cmd_health)

    led = sub.add_parser("ledger", help="a GPU's harvest ledger in a state directory: show it; reset its bubble "
                                        "figures (agent stopped)")
    ledger_cli.add_parsers(subcommands(led, "subcommand"))

    pool = sub.add_parser("pool", help="work pools on Redis: create, status, retry-failed, delete")
    pool_cli.add_parsers(subcommands(pool, "subcommand"))

    if more is not None:
        more(sub)
    return parser


def _fail(message: str) -> int:
    print(f"freeride: error: {printable(message)}", file=sys.stderr)
    return 2


def run(func: Callable[[argparse.Namespace], int], ns: argparse.Namespace) -> int:
    try:
        return func(ns)
    except AgentNotReadyError as exc:  # (health --wait-s) its message says it all
        return _fail(str(exc))
    except AgentUnavailableError as exc:
        if exc.reason.startswith("the agent"):  # the agent's own word on why it cannot answer
            return _fail(exc.reason)
        target = getattr(ns, "target", "")
        denied = socket_access_problem(target) if target else ""
        return _fail(denied or f"no agent answers at {target or 'the agent address'}: {_AGENT_HINT}")
    except FreerideError as exc:
        return _fail(str(exc))
    except BrokenPipeError:
        raise  # not an error to report: main() ends quietly
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        return _fail(f"{exc.strerror or exc}:{where}")
    except KeyboardInterrupt:
        return 130


def main(argv: Sequence[str] | None = None, more: AddCommands | None = None) -> int:
    try:
        code = _main(argv, more)
        sys.stdout.flush()  # here, not at exit: a reader that went away (`| head`) is caught below
    except BrokenPipeError:
        # The reader of stdout stopped reading: end quietly, as a Unix tool killed by SIGPIPE would.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit goes nowhere
        return 128 + signal.SIGPIPE
    return code


def _main(argv: Sequence[str] | None, more: AddCommands | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if more is not None and _command(args) not in _commands(parser):
        parser = build_parser(more)  # a tooling command, --help or a typo: every command is needed
    ns = parse(parser, args)
    level = getattr(logging, str(ns.log_level).upper(), None)
    if not isinstance(level, int):
        return _fail(f"--log-level {ns.log_level!r} is not one of DEBUG, INFO, WARNING, ERROR")
    if ns.command != "agent":
        logging.basicConfig(level=max(level, logging.WARNING), format="%(levelname)s %(name)s: %(message)s")
    return run(ns.func, ns)


def parse(parser: argparse.ArgumentParser, args: Sequence[str]) -> argparse.Namespace:
    """`parser.parse_args`, except that `submit` takes its key=value words after flags too
    (`submit REF --mem 4GiB n=1`): argparse fills a `*` positional from the words before the first flag and
    leaves the rest over. (`parse_intermixed_args` would, but refuses a parser with subcommands.)"""
    ns, extra = parser.parse_known_args(args)
    if extra and getattr(ns, "command", None) == "submit" and not any(w.startswith("-") for w in extra):
        ns.args = [*ns.args, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return ns


def _command(args: Sequence[str]) -> str | None:
    """The command word of a command line (`freeride [--log-level L] COMMAND ...`)."""
    skip = False
    for word in args:
        if skip:
            skip = False
        elif word == "--log-level":
            skip = True
        elif not word.startswith("-"):
            return word
    return None


def _commands(parser: argparse.ArgumentParser) -> Collection[str]:
    """The product's command words: for them the tooling's parsers (bench imports psutil and the harness,
    ~20 ms) are not built, so that `health`, `ls` and `stats` start fast."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.keys()
    return ()
