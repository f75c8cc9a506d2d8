"""The task commands that make and read tasks: `submit`, `ls`, `show` (cancel, pause, resume, rm and prune:
freeride.cli.manage; logs: freeride.cli.logs)."""

from __future__ import annotations

import argparse
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

from freeride.cli import _agents, multi
from freeride.cli.common import (
    UsageError,
    absolute_ref,
    console,
    message_dict,
    print_json,
    printable,
    progress_text,
    table,
)
from freeride.cli.multi import STATE_NAMES, one_client
from freeride.core.secrets import mask
from freeride.core.units import format_seconds, format_size, parse_size
from freeride.v1 import tasks_pb2


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


def interpreter_path(text: str) -> str:
    """--python as the absolute path the agent needs: a bare name (`python3.11`) as found on this shell's PATH,
    a relative path from this directory; the agent checks the rest (that it runs, its freeride)."""
    if not text or os.sep in text:
        return str(Path(text).absolute()) if text else ""
    found = shutil.which(text)
    if found is None:
        raise UsageError(f"--python {text}: no such command on PATH; give the interpreter's path, "
                         "e.g. --python /opt/hf/bin/python")
    return str(Path(found).absolute())


def cmd_submit(ns: argparse.Namespace) -> int:
    spec = tasks_pb2.TaskSpec(
        name=ns.name, ref=absolute_ref(ns.ref), args=task_args(ns.args), priority=ns.priority,
        mem_limit_bytes=mem_cap_bytes(ns.mem), max_restarts=ns.max_restarts,
        checkpoint_interval_s=ns.checkpoint_interval, no_mps=ns.no_mps, python=interpreter_path(ns.python),
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
        ("python", info.spec.python or "the agent's own"),
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

