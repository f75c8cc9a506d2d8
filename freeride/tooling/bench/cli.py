"""`freeride bench control|harvest`: each prints one JSON object on stdout."""

from __future__ import annotations

import argparse
import json


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from freeride.tooling.bench import control, harvest, overhead, trainer

    c = sub.add_parser("control", help="control-path latency: hook cost, grant and revoke latency")
    control.add_args(c)
    c.add_argument("--json", action="store_true", help="JSON output (the only format; kept for symmetry)")
    c.set_defaults(func=lambda ns: _emit(control.run(ns)))
    h = sub.add_parser("harvest", help="replay a bubble trace against a synthetic task")
    harvest.add_args(h)
    h.add_argument("--json", action="store_true", help="JSON output (the only format; kept for symmetry)")
    h.set_defaults(func=lambda ns: _emit(harvest.run(ns)))
    t = sub.add_parser("trainer", help="instrumentation overhead on a real CPU pipeline (needs torch)")
    trainer.add_args(t)
    t.add_argument("--json", action="store_true", help="JSON output (the only format; kept for symmetry)")
    t.set_defaults(func=lambda ns: _emit(trainer.run(ns)))
    o = sub.add_parser("overhead", help="side tasks' cost to a real stage's kernels on one GPU (needs CUDA)")
    overhead.add_args(o)
    o.add_argument("--json", action="store_true", help="JSON output (the only format; kept for symmetry)")
    o.set_defaults(func=lambda ns: _emit(overhead.run(ns)))


def _emit(result: dict[str, object]) -> int:
    print(json.dumps(result, indent=2))
    return 0
