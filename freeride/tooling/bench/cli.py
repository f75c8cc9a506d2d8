"""`freeride bench control|harvest|trainer|overhead|pool`: each prints one JSON object on stdout."""

from __future__ import annotations

import argparse
import json


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from freeride.tooling.bench import control, harvest, overhead, pool, trainer

    for name, bench, help_text in (
        ("control", control, "control-path latency: hook cost, grant and revoke latency"),
        ("harvest", harvest, "replay a bubble trace against a synthetic task"),
        ("trainer", trainer, "instrumentation overhead on a real CPU pipeline (needs torch)"),
        ("overhead", overhead, "side tasks' cost to a real stage's kernels on one GPU (needs CUDA)"),
        ("pool", pool, "one work pool drained by several agents: items per second, the queue's cost"),
    ):
        p = sub.add_parser(name, help=help_text)
        bench.add_args(p)
        p.add_argument("--json", action="store_true", help="JSON output (the only format; kept for symmetry)")
        p.set_defaults(func=lambda ns, run=bench.run: _emit(run(ns)))


def _emit(result: dict[str, object]) -> int:
    print(json.dumps(result, indent=2))
    return 0
