"""`--path shm|grpc|both` for the benchmarks that report bubbles: which road the edges take.

"shm" is the fast path (the agent's shared-memory ring, reporter path "auto") and a run that
asked for it fails rather than silently measuring the gRPC fallback; "grpc" keeps the edges on
the gRPC stream; "both" runs the gRPC variant, then the shm one, in the same invocation and
reports {"benchmark": ..., "runs": {"grpc": {...}, "shm": {...}}}. A single-path run prints the
same object as before, with a "path" key added.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from freeride.errors import FreerideError
from freeride.trainer.reporter import BubbleReporter

CHOICES = ("shm", "grpc", "both")
ORDER = ("grpc", "shm")  # "both": the slower road first, so a warm machine never favours the fast one
AGENT_ARGS = ("--bubble-path", "auto")  # the bench's agents offer the ring whatever the environment says


def add_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--path", choices=CHOICES, default="shm",
                   help="how bubble edges reach the agent: shm (shared-memory ring, the default; the run fails "
                        "if the reporter falls back to gRPC), grpc (the gRPC stream), both (grpc then shm, "
                        "one JSON object with both runs)")


def reporter_path(path: str) -> str:
    """The BubbleReporter `path` argument (and $FREERIDE_BUBBLE_PATH value) for a bench path."""
    if path not in ORDER:
        raise ValueError(f"bench path must be one of {', '.join(ORDER)}, not {path!r}")
    return "auto" if path == "shm" else "grpc"


def check(bench: str, path: str, actual: str, who: str = "the reporter") -> None:
    """Fail when the edges do not take the road asked for: a silent fallback would give misleading numbers."""
    if actual != path:
        raise FreerideError(f"bench {bench}: --path {path} asked for, but {who} reports over "
                            f"{actual or 'nothing (not connected)'}; no numbers for a path that was not measured")


def connect(bench: str, target: str, path: str, **kwargs: Any) -> BubbleReporter:
    """A connected reporter on `path` ("shm" or "grpc"), or FreerideError."""
    reporter = BubbleReporter(target, path=reporter_path(path), **kwargs)
    if not reporter.wait_connected(10):
        reporter.close()
        raise FreerideError(f"bench {bench}: the reporter could not connect to the agent")
    try:
        check(bench, path, reporter.path)
    except FreerideError:
        reporter.close()
        raise
    return reporter


def run(bench: str, ns: argparse.Namespace, run_one: Callable[[argparse.Namespace, str], dict[str, Any]]
        ) -> dict[str, Any]:
    """`run_one(ns, path)` once for a single path, or for each path of ORDER under "both"."""
    if ns.path != "both":
        return run_one(ns, ns.path)
    return {"benchmark": bench, "runs": {path: run_one(ns, path) for path in ORDER}}
