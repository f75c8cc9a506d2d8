"""Tasks in bulk: `cancel`, `pause`, `resume` of several ids (or --all), `rm` and `prune` of finished tasks.

Each id is acted on by itself: every valid one is done, each refusal is one line on stderr, and the
exit code is 2 if any was refused. Removal is the agent's (freeride.agent.engine.retention): only finished
tasks (DONE, FAILED, CANCELLED), with their checkpoint and logs.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable
from typing import Any

from freeride.agent.domain.model import TaskState
from freeride.cli import _agents
from freeride.cli.common import UsageError, message_dict, print_json, printable
from freeride.cli.multi import STATE_NAMES
from freeride.client import AgentClient
from freeride.core.units import format_duration, format_size, parse_duration
from freeride.errors import FreerideError, InvalidSpecError, InvalidStateError, TaskNotFoundError, TaskRefError

_FINISHED_NAMES = sorted(s.value for s in TaskState if s.terminal)  # what rm and prune remove
# Which tasks `ACTION --all` acts on (by their stored state: a RUNNING task is stored READY).
_BULK_STATES = {
    "cancel": ("SUBMITTED", "STARTING", "READY", "PAUSED"),
    "pause": ("SUBMITTED", "STARTING", "READY"),
    "resume": ("PAUSED",),
}
_BULK_WORDS = {"cancel": "unfinished", "pause": "live", "resume": "paused"}
# The agent's refusals of one task: said per task; anything else (no agent answers) is the command's error.
_REFUSED = (TaskNotFoundError, InvalidStateError, InvalidSpecError, TaskRefError)


def add_parsers(sub: argparse._SubParsersAction, add_agent_args: Callable[[argparse.ArgumentParser], None]) -> None:
    for name, helptext in (
        ("cancel", "cancel tasks (each checkpoints first); --all without ids: every unfinished task"),
        ("pause", "pause tasks (each checkpoints and frees its memory); --all without ids: every live task"),
        ("resume", "resume paused tasks from their checkpoints; --all without ids: every paused task"),
    ):
        p = sub.add_parser(name, help=helptext)
        add_agent_args(p)
        p.add_argument("task_ids", nargs="*", metavar="ID")
        p.set_defaults(func=cmd_task_actions, action=name)

    rm = sub.add_parser("rm", help="remove finished tasks (DONE, FAILED, CANCELLED) with their checkpoint and logs")
    add_agent_args(rm)
    rm.add_argument("task_ids", nargs="+", metavar="ID")
    rm.set_defaults(func=cmd_rm)

    pr = sub.add_parser("prune", help="remove finished tasks last changed longer ago than a duration")
    add_agent_args(pr)
    pr.add_argument("--older-than", required=True, type=_duration, metavar="DURATION",
                    help="like 30m, 12h, 7d, 2w (0: every finished task)")
    pr.add_argument("--state", action="append", default=[], metavar="STATE",
                    help=f"only tasks in this state: {', '.join(_FINISHED_NAMES)} (repeatable; default all three)")
    pr.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")
    pr.set_defaults(func=cmd_prune)


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except FreerideError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# -- cancel / pause / resume ------------------------------------------------------------------------
def cmd_task_actions(ns: argparse.Namespace) -> int:
    if not ns.task_ids and not ns.all_agents:
        raise UsageError(f"name the tasks to {ns.action} (freeride {ns.action} ID ...), or pass --all for every "
                         f"{_BULK_WORDS[ns.action]} task")
    if ns.task_ids:
        jobs: list[tuple[str | None, str]] = [(None, task_id) for task_id in dict.fromkeys(ns.task_ids)]
        multi = _agents.resolve(ns).multi
    else:
        jobs, multi = _every_task(ns)
    single = len(ns.task_ids) == 1
    results: list[dict[str, Any]] = []
    for target, task_id in jobs:
        result = _act(ns, target, task_id)
        results.append(result)
        if result["error"] is not None:
            skipped = not ns.task_ids  # --all: it changed state since the list (finished, say): not a failure
            print(f"freeride: {'note' if skipped else 'error'}: {result['error']}{'; skipped' if skipped else ''}",
                  file=sys.stderr)
        elif not ns.json:
            info = result["info"]
            where = f"agent {result['agent']}: " if multi else ""
            print(printable(f"{where}task {info.id} ({info.spec.name}): {STATE_NAMES[info.state]}"))
    if not jobs and not ns.json:
        print(f"no {_BULK_WORDS[ns.action]} tasks to {ns.action}")
    if ns.json:
        if single and results and results[0]["error"] is None:
            print_json({**message_dict(results[0]["info"]), "agent": results[0]["agent"]})
        else:
            print_json([{"agent": r["agent"], "id": r["id"], "error": r["error"],
                         "task": message_dict(r["info"]) if r["info"] is not None else None} for r in results])
    refused = any(r["error"] is not None for r in results) and bool(ns.task_ids)
    return 2 if refused else 0


def _every_task(ns: argparse.Namespace) -> tuple[list[tuple[str | None, str]], bool]:
    """(agent, id) of every task `--all` means: of the agents named with --agent, else of every agent here;
    and whether there are several agents."""
    agents = _agents.resolve(_without_all(ns) if ns.agent else ns)
    listed = _agents.each(ns, agents, lambda c: c.list(_BULK_STATES[ns.action]))
    return [(target, t.id) for target, tasks in listed for t in tasks], len(agents.targets) > 1


def _without_all(ns: argparse.Namespace) -> argparse.Namespace:
    plain = copy.copy(ns)
    plain.all_agents = False
    return plain


def _client_for(ns: argparse.Namespace, target: str | None, task_id: str) -> AgentClient:
    if target is not None:
        ns.target = target
        return _agents.client(ns, target)
    return _agents.owner(ns, task_id)


def _act(ns: argparse.Namespace, target: str | None, task_id: str) -> dict[str, Any]:
    agent, info, error = _on_task(ns, target, task_id, lambda c: {"cancel": c.cancel, "pause": c.pause,
                                                                   "resume": c.resume}[ns.action](task_id))
    return {"agent": agent, "id": task_id, "info": info, "error": error}


def _on_task(ns: argparse.Namespace, target: str | None, task_id: str,
             call: Callable[[AgentClient], Any]) -> tuple[str | None, Any, str | None]:
    """`call` on the client of the task's agent: (that agent, its answer, None), or (the agent if one was found,
    None, why this one task was refused). Anything but a refusal (no agent answers) is raised."""
    agent = target
    try:
        with _client_for(ns, target, task_id) as c:
            agent = ns.target
            return agent, call(c), None
    except (UsageError, *_REFUSED) as exc:  # (UsageError: several agents, and none or more than one has it)
        return agent, None, str(exc)


# -- rm ---------------------------------------------------------------------------------------------
def cmd_rm(ns: argparse.Namespace) -> int:
    out: list[dict[str, Any]] = []
    refused = False
    for task_id in dict.fromkeys(ns.task_ids):
        agent, removed, error = _on_task(ns, None, task_id, lambda c: c.delete(task_id))  # noqa: B023 - called now
        entry: dict[str, Any] = {"agent": agent, "id": task_id,
                                 "removed": message_dict(removed) if removed is not None else None, "error": error}
        if removed is not None and not ns.json:
            t = removed.task
            print(printable(f"removed task {t.id} ({t.spec.name}, {STATE_NAMES[t.state]}): "
                            f"{_files(removed.files_removed, removed.bytes_freed)}"))
        if entry["error"] is not None:
            refused = True
            print(f"freeride: error: {entry['error']}", file=sys.stderr)
        out.append(entry)
    if ns.json:
        print_json(out)
    return 2 if refused else 0


def _files(count: int, size_bytes: int) -> str:
    return f"{count} file{'s' if count != 1 else ''}, {format_size(size_bytes) if size_bytes else '0 B'}"


# -- prune ------------------------------------------------------------------------------------------
def cmd_prune(ns: argparse.Namespace) -> int:
    states = []
    for name in ns.state:
        if name.upper() not in _FINISHED_NAMES:
            raise UsageError(f"prune removes finished tasks: --state is one of {', '.join(_FINISHED_NAMES)}, "
                             f"not {name!r} (cancel unfinished tasks first)")
        states.append(name.upper())
    agents = _agents.resolve(ns)
    rows = list(_agents.each(ns, agents, lambda c: c.prune(ns.older_than, states, ns.dry_run)))
    age = format_duration(ns.older_than)
    if ns.json:
        print_json({
            "dry_run": ns.dry_run, "older_than_s": ns.older_than,
            "agents": [{**message_dict(r), "agent": target} for target, r in rows],
            "total": {"tasks": sum(len(r.tasks) for _, r in rows),
                      "files_removed": sum(r.files_removed for _, r in rows),
                      "bytes_freed": sum(r.bytes_freed for _, r in rows)},
        })
        return 0
    for target, r in rows:
        where = f"agent {target}: " if agents.multi else ""
        if not r.tasks:
            print(f"{where}no finished tasks older than {age}")
            continue
        verb = "would remove" if ns.dry_run else "removed"
        print(f"{where}{verb} {len(r.tasks)} finished task{'s' if len(r.tasks) != 1 else ''} older than {age}: "
              f"{', '.join(t.id for t in r.tasks)} ({_files(r.files_removed, r.bytes_freed)})")
    return 0
