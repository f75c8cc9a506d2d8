"""`ls` and `stats` over several agents (a row per agent, and totals), and `submit` to each of them; the agents
a command addresses, for every command (and the tooling's): `one_client`, `each_agent`.

Their `--json` has one shape whatever the number of agents (one agent is a list of one), so that a script
written against one agent works against many: see docs/operations.md, *The CLI's output*.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from freeride.cli import _agents
from freeride.cli.common import console, message_dict, print_json, printable, table
from freeride.cli.value import WORTH_COLUMNS, Pricing, Worth, gpu_hours
from freeride.client import AgentClient
from freeride.core.units import format_seconds
from freeride.errors import AgentUnavailableError, FreerideError
from freeride.v1 import tasks_pb2

T = TypeVar("T")
STATE_NAMES = {v: k.removeprefix("TASK_STATE_") for k, v in tasks_pb2.TaskState.items()}
BUBBLE_PATHS = ("shm", "grpc")  # the roads a trainer's edges take (freeride.agent.domain.trainers)


def one_client(ns: argparse.Namespace) -> AgentClient:
    """The client of the single agent the command addresses (--agent, --gpu; sets ns.target)."""
    return _agents.one(ns)


def each_agent(ns: argparse.Namespace, call: Callable[[AgentClient], T]) -> Iterator[tuple[str, T]]:
    """(target, answer) of every agent the command addresses (--agent, --gpu, repeated --agent, --all); with
    several, one that does not answer is skipped with a warning."""
    return _agents.each(ns, _agents.resolve(ns), call)



def trainer_paths(streams: Iterable[tasks_pb2.TrainerStream]) -> dict[str, int]:
    """Open trainer streams by the road their edges take."""
    counts = dict.fromkeys(BUBBLE_PATHS, 0)
    for t in streams:
        counts[t.path] = counts.get(t.path, 0) + 1
    return counts


def trainers_text(count: int, paths: Mapping[str, int]) -> str:
    """'0', '1 (shm)', '3 (2 shm, 1 grpc)': the trainer streams and their roads, short."""
    used = [(p, n) for p, n in paths.items() if n]
    if not used:
        return str(count)
    if len(used) == 1:
        return f"{count} ({used[0][0]})"
    return f"{count} ({', '.join(f'{n} {p}' for p, n in used)})"


def stats_dict(stats: tasks_pb2.StatsResponse, pricing: Pricing | None = None) -> dict[str, Any]:
    """One agent's stats as `--json` prints them: efficiency added for the GPU and for each task (its share of
    the bubble time), GPU-hours for each, and the GPU's `worth` (freeride.cli.value)."""
    pricing = pricing or Pricing()
    out = message_dict(stats)
    out["gpu"]["efficiency"] = _ratio(stats.gpu.harvested_s, stats.gpu.bubble_s)
    out["gpu"]["worth"] = Worth.of(stats.gpu.harvested_s, stats.gpu.training_s, pricing).as_dict()
    for t, info in zip(out["tasks"], stats.tasks, strict=True):
        t["counters"]["efficiency"] = _ratio(info.counters.harvested_s, stats.gpu.bubble_s)
        t["counters"]["harvested_gpu_hours"] = info.counters.harvested_s / 3600
        if pricing.gpu_hour_price is not None:
            t["counters"]["value"] = info.counters.harvested_s / 3600 * pricing.gpu_hour_price
    return out


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def totals(stats: list[tasks_pb2.StatsResponse], pricing: Pricing | None = None) -> dict[str, Any]:
    """Sums over agents; efficiency is harvested over bubble time of all of them; `worth` their GPU-hours."""
    out: dict[str, Any] = {"agents": len(stats), "tasks": sum(len(s.tasks) for s in stats)}
    for name in ("bubbles", "bubble_s", "harvested_s", "overrun_s", "overrun_steps", "steps", "windows", "trainers",
                 "training_s"):
        out[name] = sum(getattr(s.gpu, name) for s in stats)
    out["trainer_paths"] = trainer_paths(t for s in stats for t in s.gpu.trainer_streams)
    out["efficiency"] = _ratio(out["harvested_s"], out["bubble_s"])
    out["worth"] = Worth.of(out["harvested_s"], out["training_s"], pricing or Pricing()).as_dict()
    return out


def cmd_stats(ns: argparse.Namespace, agents: _agents.AgentSet, pricing: Pricing) -> int:
    rows = list(_agents.each(ns, agents, lambda c: c.stats()))
    stats = [s for _, s in rows]
    total = totals(stats, pricing)
    if ns.json:
        print_json({"agents": [{**stats_dict(s, pricing), "agent": target} for target, s in rows], "total": total})
        return 0
    con = console()
    gt = table(f"{len(rows)} agents", "gpu", "agent", "trainers", "bubbles", "bubble time", "harvested", "efficiency",
               "steps", "overruns", "tasks")
    for target, s in rows:
        g = s.gpu
        gt.add_row(
            str(g.gpu), target, trainers_text(g.trainers, trainer_paths(g.trainer_streams)), str(g.bubbles),
            format_seconds(g.bubble_s), format_seconds(g.harvested_s), f"{_ratio(g.harvested_s, g.bubble_s):.1%}",
            str(g.steps),
            f"{g.overrun_steps} ({format_seconds(g.overrun_s)})", str(len(s.tasks)),
        )
    gt.add_section()
    gt.add_row(
        "all", "", trainers_text(total["trainers"], total["trainer_paths"]), str(total["bubbles"]),
        format_seconds(total["bubble_s"]), format_seconds(total["harvested_s"]), f"{total['efficiency']:.1%}",
        str(total["steps"]),
        f"{total['overrun_steps']} ({format_seconds(total['overrun_s'])})", str(total["tasks"]),
    )
    con.print(gt)
    wt = table("harvest in GPU-hours", "gpu", "agent", *WORTH_COLUMNS)
    for target, s in rows:
        wt.add_row(str(s.gpu.gpu), target, *Worth.of(s.gpu.harvested_s, s.gpu.training_s, pricing).cells())
    wt.add_section()
    worth = Worth.of(total["harvested_s"], total["training_s"], pricing)
    wt.add_row("all", "", *worth.cells())
    con.print(wt)
    tt = table("tasks", "gpu", "id", "name", "state", "steps", "harvested", "GPU-h", "share of bubbles", "overruns")
    for _, s in rows:
        for t in s.tasks:
            cnt = t.counters
            tt.add_row(
                str(s.gpu.gpu), t.id, t.spec.name, STATE_NAMES[t.state], str(cnt.steps),
                format_seconds(cnt.harvested_s), gpu_hours(cnt.harvested_s / 3600),
                f"{_ratio(cnt.harvested_s, s.gpu.bubble_s):.1%}",
                f"{cnt.overrun_steps} ({format_seconds(cnt.overrun_s)})",
            )
    con.print(tt)
    for line in worth.notes():
        con.print(line, highlight=False)
    return 0


def cmd_ls(ns: argparse.Namespace, agents: _agents.AgentSet, states: list[Any]) -> int:
    rows = [(target, t) for target, tasks in _agents.each(ns, agents, lambda c: c.list(states)) for t in tasks]
    if ns.json:
        print_json([{**message_dict(t), "agent": target} for target, t in rows])
        return 0
    out = table(f"tasks on {len(agents.targets)} agents",
                "agent", "id", "name", "state", "prio", "steps", "harvested", "restarts", "reason")
    for target, t in rows:
        out.add_row(
            target, t.id, t.spec.name, STATE_NAMES[t.state], str(t.spec.priority), str(t.counters.steps),
            format_seconds(t.counters.harvested_s), str(t.restarts), t.reason,
        )
    console().print(out)
    return 0


def _submit_one(ns: argparse.Namespace, target: str, spec: tasks_pb2.TaskSpec) -> tasks_pb2.TaskInfo | str:
    """The new task, or why this agent has none (one line)."""
    try:
        with _agents.client(ns, target) as c:
            return c.submit(spec)
    except AgentUnavailableError as exc:
        return exc.access_problem or "no agent answers there: start it with `freeride agent` or leave it out"
    except FreerideError as exc:
        return str(exc)


def cmd_submit(ns: argparse.Namespace, agents: _agents.AgentSet, spec: tasks_pb2.TaskSpec) -> int:
    """The same task to every agent, side by side (each checks the reference itself): a line per agent; exit 2
    if any of them has no task (the others keep theirs)."""
    with ThreadPoolExecutor(max_workers=min(8, len(agents.targets))) as pool:
        results = list(pool.map(lambda t: (t, _submit_one(ns, t, spec)), agents.targets))
    for target, result in results:
        if isinstance(result, str):
            print(printable(f"freeride: error: agent {target}: {result}"), file=sys.stderr)
        elif not ns.json:
            print(printable(f"agent {target}: submitted task {result.id} ({result.spec.name}): "
                            f"{STATE_NAMES[result.state]}"))
    if ns.json:
        print_json([{"agent": target, "task": None if isinstance(result, str) else message_dict(result),
                     "error": result if isinstance(result, str) else None} for target, result in results])
    return 2 if any(isinstance(result, str) for _, result in results) else 0
