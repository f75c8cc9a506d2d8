"""Which agents a client command talks to: one (--agent, --gpu), several (--agent repeated) or --all."""

from __future__ import annotations

import argparse
import os
import re
import stat
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from freeride.cli.common import UsageError
from freeride.client import AgentClient
from freeride.core.auth import token_from
from freeride.core.paths import agent_target, default_runtime_dir, file_kind, socket_access_problem
from freeride.errors import AgentUnavailableError, TaskNotFoundError

T = TypeVar("T")
_NUMBER = re.compile(r"(\d+)")


@dataclass(frozen=True)
class AgentSet:
    targets: list[str]
    multi: bool  # the user asked for several agents: aggregate, and skip ones that do not answer


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agent", action="append", default=None,
                   help="agent address: a socket path, unix:PATH or HOST:PORT; repeat for several "
                        "(env FREERIDE_AGENT, comma-separated)")
    p.add_argument("--all", action="store_true", dest="all_agents",
                   help="every agent socket in the runtime directory (FREERIDE_SOCKET_DIR, "
                        "$XDG_RUNTIME_DIR/freeride or /tmp/freeride-UID)")
    p.add_argument("--token-file", default=None,
                   help="the agent's token, needed over TCP (env FREERIDE_TOKEN_FILE)")


def _gpu(ns: argparse.Namespace) -> int:
    gpu = getattr(ns, "gpu", None)
    if gpu is not None:
        return int(gpu)
    raw = os.environ.get("FREERIDE_GPU", "") or "0"
    if not raw.isdigit():
        raise UsageError(f"FREERIDE_GPU={raw!r} is not a GPU index; set it to a number like 0")
    return int(raw)


def _natural(path: object) -> list[object]:
    return [int(part) if part.isdigit() else part for part in _NUMBER.split(str(path))]


def resolve(ns: argparse.Namespace) -> AgentSet:
    given = list(getattr(ns, "agent", None) or [])
    if getattr(ns, "all_agents", False):
        if given:
            raise UsageError("--all and --agent do not mix: pick one")
        root = default_runtime_dir()
        sockets = sorted((p for p in root.glob("*.sock") if _is_socket(p)), key=_natural)
        if not sockets:
            raise UsageError(f"no agent sockets in {root}; start agents there or set FREERIDE_SOCKET_DIR")
        return AgentSet([f"unix:{s}" for s in sockets], multi=True)
    if not given:
        given = [a.strip() for a in os.environ.get("FREERIDE_AGENT", "").split(",") if a.strip()]
    if not given:
        given = [agent_target(None, _gpu(ns))]
    targets = list(dict.fromkeys(agent_target(a) for a in given))
    for target in targets:
        check_socket(target)
    return AgentSet(targets, multi=len(targets) > 1)


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.stat().st_mode)
    except OSError:
        return False


def check_socket(target: str) -> None:
    """A unix target whose path exists but is no socket is a usage error that says what it is instead (a
    missing path is left to the call: 'no agent answers')."""
    if not target.startswith("unix:") or target.startswith("unix-abstract:"):
        return
    path = Path(target.removeprefix("unix:").removeprefix("//"))
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if not stat.S_ISSOCK(mode):
        raise UsageError(f"{path} is not a socket: it is {file_kind(mode)}; pass the agent's socket "
                         "(the --socket it was started with)")


def client(ns: argparse.Namespace, target: str) -> AgentClient:
    return AgentClient(target, token=token_from(getattr(ns, "token_file", None)))


def one(ns: argparse.Namespace) -> AgentClient:
    """The client of the single agent this command addresses (sets ns.target for error messages)."""
    agents = resolve(ns)
    if len(agents.targets) != 1:
        raise UsageError(f"`freeride {ns.command}` talks to one agent; pass a single --agent (not --all)")
    ns.target = agents.targets[0]
    return client(ns, ns.target)


def each(ns: argparse.Namespace, agents: AgentSet, call: Callable[[AgentClient], T]) -> Iterator[tuple[str, T]]:
    """(target, result) per agent. With several agents one that does not answer is skipped with a warning
    (a stale socket of a dead agent); if none answers, that is the error."""
    answered = 0
    for target in agents.targets:
        ns.target = target
        with client(ns, target) as c:
            try:
                result = call(c)
            except AgentUnavailableError as exc:
                if not agents.multi:
                    raise
                why = exc.access_problem or f"no agent answers at {target}"
                print(f"freeride: warning: {why}; skipped", file=sys.stderr)
                continue
        answered += 1
        yield target, result
    if answered == 0 and agents.multi:
        raise UsageError(nobody_answers(agents.targets))


def nobody_answers(targets: list[str]) -> str:
    """The one line for "none of `targets` answered". A socket that keeps this user out is said as such: the
    fix is a group membership, not `freeride agent`."""
    denied = [why for why in map(socket_access_problem, targets) if why]
    if len(targets) == 1:
        return denied[0] if denied else f"no agent answers at {targets[0]}; start one with `freeride agent`"
    if denied:
        more = f" (and {len(denied) - 1} more socket(s) the same way)" if len(denied) > 1 else ""
        return f"none of the {len(targets)} agents answers; {denied[0]}{more}"
    return f"none of the {len(targets)} agents answers; start them with `freeride agent`"


def owner(ns: argparse.Namespace, task_id: str) -> AgentClient:
    """The client of the agent that holds `task_id`; one clear error if none or several do."""
    agents = resolve(ns)
    if not agents.multi:
        return one(ns)
    owners = []
    for target, found in each(ns, agents, lambda c: _has(c, task_id)):
        if found:
            owners.append(target)
    if not owners:
        raise UsageError(f"no agent of {len(agents.targets)} has task {task_id!r}; see `freeride ls --all`")
    if len(owners) > 1:
        raise UsageError(f"task id {task_id!r} exists on {', '.join(owners)}; pass the owner's --agent")
    ns.target = owners[0]
    return client(ns, owners[0])


def _has(c: AgentClient, task_id: str) -> bool:
    try:
        c.get(task_id)
    except TaskNotFoundError:
        return False
    return True
