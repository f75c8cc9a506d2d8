"""`freeride ledger show|reset`: read or correct a GPU's harvest ledger in a state directory, its agent stopped.

The GPU's ledger (its bubbles, bubble time, harvest, training time: `stats`, /metrics) lives in the agent's
memory and is written behind into the state database, so it can only be corrected while no agent holds the
state directory: a running agent would write its own figures over the correction at its next write. The
command takes the agent's lock for the whole change, so an agent cannot start in the middle of it either.

`reset` zeroes the figures a wrong or forged trainer can inflate (bubbles, bubble time, edges seen), and with
`--all` every figure of the GPU. The tasks, and each task's own counters, are never touched.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path

from freeride.agent.domain.model import Counters
from freeride.agent.state.registry import Registry
from freeride.cli.common import UsageError, console, print_json, table
from freeride.core.private import create_private
from freeride.core.units import format_seconds

DATABASE = "freeride.db"  # (freeride.agent.server opens it under this name)
LOCK = "agent.lock"  # the agent's own: held while it runs (freeride.agent.server._lock_state_dir)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    for name, what in (("show", "print a GPU's harvest ledger from a state directory (the agent may run)"),
                       ("reset", "zero a GPU's bubble figures (--all: every figure) in a stopped agent's state "
                                 "directory; tasks are kept")):
        p = sub.add_parser(name, help=what)
        p.add_argument("--state-dir", type=Path, default=Path(os.environ.get("FREERIDE_STATE_DIR") or "freeride-state"),
                       help="the agent's --state-dir (default: $FREERIDE_STATE_DIR, else ./freeride-state)")
        p.add_argument("--gpu", type=int, default=None, help="only this GPU's ledger (default: every one there)")
        p.add_argument("--json", action="store_true", help="print JSON")
        if name == "reset":
            p.add_argument("--all", action="store_true", dest="everything",
                           help="zero every figure of the GPU (harvest and training time too), not only its bubbles")
        p.set_defaults(func=cmd_show if name == "show" else cmd_reset)


def cmd_show(ns: argparse.Namespace) -> int:
    with _registry(ns.state_dir) as reg:
        _print(ns, {gpu: reg.load_ledger(gpu) for gpu in _gpus(reg, ns)}, "ledger")
    return 0


def cmd_reset(ns: argparse.Namespace) -> int:
    _database(ns.state_dir)  # first: no lock file is left where the user pointed by mistake
    with _agent_stopped(ns.state_dir), _registry(ns.state_dir) as reg:
        after: dict[int, Counters] = {}
        for gpu in _gpus(reg, ns):
            before = reg.load_ledger(gpu)
            after[gpu] = Counters() if ns.everything else replace(before, bubbles=0, bubble_ns=0, events=0)
            reg.save([], gpu, after[gpu])
        _print(ns, after, "ledger after the reset")
    return 0


def _gpus(reg: Registry, ns: argparse.Namespace) -> list[int]:
    gpus = reg.ledger_gpus()
    if ns.gpu is None:
        return gpus
    if ns.gpu not in gpus:
        raise UsageError(f"{ns.state_dir} holds no ledger of GPU {ns.gpu} (it has: "
                         f"{', '.join(map(str, gpus)) or 'none'}): give the GPU its agent runs with")
    return [ns.gpu]


def _database(state_dir: Path) -> Path:
    path = state_dir / DATABASE
    if not path.is_file():  # never create a database where the user pointed by mistake
        raise UsageError(f"no state database at {path}: give the agent's --state-dir (or FREERIDE_STATE_DIR)")
    return path


@contextlib.contextmanager
def _registry(state_dir: Path) -> Iterator[Registry]:
    reg = Registry(_database(state_dir))
    try:
        yield reg
    finally:
        reg.close()


@contextlib.contextmanager
def _agent_stopped(state_dir: Path) -> Iterator[None]:
    """Hold the agent's lock: none runs on this state directory now, and none starts until the change is made."""
    fd = create_private(state_dir / LOCK, os.O_RDWR | os.O_CREAT)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise UsageError(f"an agent (pid {pid}) is running on {state_dir}: stop it first (it keeps the ledger in "
                             "memory and would write it back over the reset), then run this again") from None
        yield
    finally:
        os.close(fd)  # (releases the lock)


def _print(ns: argparse.Namespace, ledgers: dict[int, Counters], title: str) -> None:
    if ns.json:
        print_json({"state_dir": str(ns.state_dir), "ledgers": {str(g): asdict(c) for g, c in ledgers.items()}})
        return
    t = table(f"{title}: {ns.state_dir}", "GPU", "bubbles", "bubble time", "harvested", "steps", "windows",
              "training time", "edges")
    for gpu, c in sorted(ledgers.items()):
        t.add_row(str(gpu), str(c.bubbles), format_seconds(c.bubble_ns / 1e9), format_seconds(c.harvested_ns / 1e9),
                  str(c.steps), str(c.windows), format_seconds(c.training_ns / 1e9), str(c.events))
    console().print(t)
