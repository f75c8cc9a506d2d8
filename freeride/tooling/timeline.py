"""`freeride timeline`: draw a running agent's recent bubbles and side-task steps as a PNG."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from freeride.cli.common import UsageError, print_json
from freeride.cli.multi import one_client
from freeride.tooling import plot


def add_parser(sub: argparse._SubParsersAction, add_agent_args: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("timeline", help="draw an agent's recent bubbles and side-task steps (PNG)")
    add_agent_args(p)
    p.add_argument("--out", type=Path, required=True, metavar="FILE.png", help="where to write the picture")
    p.add_argument("--span-ms", type=float, default=1000.0,
                   help="how much of the most recent activity to draw (default 1000 ms)")
    p.set_defaults(func=cmd_timeline)


def cmd_timeline(ns: argparse.Namespace) -> int:
    if ns.span_ms <= 0:
        raise UsageError(f"--span-ms must be positive, got {ns.span_ms:g}")
    if ns.out.suffix.lower() != ".png":
        raise UsageError(f"--out {ns.out} must name a .png file")
    with one_client(ns) as c:
        resp = c.timeline()
    if not resp.bubbles:
        raise UsageError(f"the agent at {ns.target} has recorded no bubbles yet: is an instrumented trainer reporting "
                         "to it? (see docs/demo.md)")
    lanes = plot.lanes_from_timeline(resp)
    start_ns, end_ns = plot.busiest_range(lanes, int(ns.span_ms * 1e6))
    steps = sum(len(s) for ln in lanes for s in ln.steps.values())
    title = f"Agent of GPU {resp.gpu} ({ns.target}): recent bubbles and side-task steps"
    out = plot.plot(lanes, ns.out, start_ns, end_ns, title)
    if ns.json:
        print_json({"out": str(out), "gpu": resp.gpu, "bubbles": len(resp.bubbles), "windows": len(resp.windows),
                    "steps": steps, "start_ns": start_ns, "end_ns": end_ns})
    else:
        print(f"wrote {out}: {len(resp.bubbles)} bubbles, {len(resp.windows)} windows, {steps} side-task steps kept; "
              f"drew the last {ns.span_ms:g} ms")
    return 0
