"""`freeride profile`: a job's bubbles per stage and slot, its theory, and what a side task would harvest.

Measure first: it needs no side task. The bubbles come from one agent, every agent of the node (`--all`)
or a recording (`--from FILE`); `--record FILE` saves what was read, to analyse anywhere.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from freeride.cli.common import UsageError, print_json
from freeride.cli.multi import each_agent
from freeride.tooling.profile import analysis, recording, render
from freeride.tooling.whatif import StepSource

_DEFAULT_STEPS = "1,5,20"


def add_parser(sub: argparse._SubParsersAction, add_agent_args: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("profile", help="a job's bubbles per stage and slot, and what a side task would harvest")
    add_agent_args(p)
    p.add_argument("--from", dest="source", type=Path, metavar="FILE",
                   help="analyse this recording (from --record) instead of asking agents")
    p.add_argument("--record", type=Path, metavar="FILE", help="also save the bubbles read, to analyse anywhere")
    p.add_argument("--step-ms", default=_DEFAULT_STEPS, metavar="MS,MS,...",
                   help=f"step sizes for the what-if, in ms (default {_DEFAULT_STEPS})")
    p.add_argument("--task", action="append", default=[], metavar="ID",
                   help="also replay this task's measured steps (from the agent's recent windows); repeatable")
    p.add_argument("--out", type=Path, metavar="FILE.png", help="draw each stage's bubbles and what-if (PNG)")
    p.set_defaults(func=cmd_profile)


def _step_sizes(text: str) -> list[float]:
    try:
        sizes = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--step-ms {text!r}: give step sizes in ms separated by commas, like 1,5,20") from None
    if not sizes or any(not 0 < s < 1e6 for s in sizes):
        raise UsageError(f"--step-ms {text!r}: each step size must be a positive number of ms, like 1,5,20")
    return sizes


def cmd_profile(ns: argparse.Namespace) -> int:
    sizes = _step_sizes(ns.step_ms)
    if ns.out is not None and ns.out.suffix.lower() != ".png":
        raise UsageError(f"--out {ns.out} must name a .png file")
    if ns.source is not None:
        if ns.agent or ns.all_agents:
            raise UsageError("--from reads a recording: leave out --agent and --all")
        try:
            rec = recording.load(ns.source)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        where = str(ns.source)
    else:
        rec = recording.Recording()
        targets = []
        for target, resp in each_agent(ns, lambda c: c.timeline()):
            rec.add_timeline(resp)
            targets.append(target)
        where = ", ".join(targets)
    if not rec.bubbles:
        raise UsageError(f"no bubbles recorded at {where}: instrument the trainer (docs/profile.md) and let it run "
                         "a few iterations first")
    steps: list[tuple[str, float, StepSource]] = [analysis.steps_for(s) for s in sizes]
    for task_id in ns.task:
        durations = rec.task_steps.get(task_id)
        if not durations:
            raise UsageError(f"task {task_id} ran no step in the recorded windows; give --step-ms instead, or "
                             "profile again once it has run")
        steps.append(analysis.task_steps(task_id, durations))
    if ns.record is not None:
        recording.save(ns.record, rec)
    stages = analysis.profile(rec, steps)
    if ns.out is not None:
        render.plot(stages, ns.out)
    if ns.json:
        print_json({"source": where, **render.as_dict(stages), "out": str(ns.out) if ns.out else ""})
    else:
        render.print_tables(stages)
        for path, what in ((ns.record, "recording"), (ns.out, "picture")):
            if path is not None:
                print(f"wrote {what} {path}")
    return 0
