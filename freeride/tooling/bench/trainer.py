"""`freeride bench trainer`: the cost of instrumentation on a real CPU pipeline, plain and instrumented
steps alternated in one run (odd iterations instrumented), with an agent per rank. `--path` picks the
ranks' road to their agents (they get $FREERIDE_BUBBLE_PATH); each rank says which one it took."""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
from pathlib import Path
from typing import Any

from freeride.tooling.bench import paths
from freeride.tooling.bench.pipeline import SCHEDULES, SINGLE, PipelineConfig, launch
from freeride.tooling.harness import AgentProcess

_WARMUP = 2  # iterations left out: the first sets the pipeline up


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--schedule", default="1F1B", choices=SCHEDULES)
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--forward-ms", type=float, default=10.0)
    p.add_argument("--backward-ms", type=float, default=20.0)
    p.add_argument("--iterations", type=int, default=63)
    paths.add_arg(p)


def run(ns: argparse.Namespace) -> dict[str, Any]:
    return paths.run("trainer", ns, _run)


def _run(ns: argparse.Namespace, path: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="freeride-bench-") as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        for r in range(ns.stages):
            stack.enter_context(AgentProcess(state_dir=root / f"state{r}", gpu=r, extra_args=paths.AGENT_ARGS))
        cfg = PipelineConfig(
            schedule=ns.schedule, stages=ns.stages, microbatches=ns.microbatches, forward_ms=ns.forward_ms,
            backward_ms=ns.backward_ms, iterations=ns.iterations, instrument=True, socket_dir=str(root),
            alternate=True, bubble_path=paths.reporter_path(path),
        )
        results = launch(cfg, root / "run")
    plain, instrumented, paired = [], [], []
    per_rank = []
    v = 1 if ns.schedule in SINGLE else 2
    for res in results:
        paths.check("trainer", path, res["reporter_path"], f"rank {res['rank']}")
        steps = res["step_ms"]
        plain += [steps[i] for i in range(_WARMUP, len(steps)) if i % 2 == 0]
        instrumented += [steps[i] for i in range(_WARMUP, len(steps)) if i % 2 == 1]
        # Each instrumented step against the mean of the plain steps on either side: slow drifts cancel.
        paired += [steps[i] / ((steps[i - 1] + steps[i + 1]) / 2) for i in range(_WARMUP + 1, len(steps) - 1, 2)]
        iters = sorted({b["iteration"] for b in res["bubbles"] if b["iteration"] >= _WARMUP})
        waits = [b for b in res["bubbles"] if b["iteration"] in iters and b["kind"] != 5]
        idle_ms = sum((b["end_ns"] - b["start_ns"]) / 1e6 for b in waits)
        busy_ms = sum(steps[i] for i in iters)
        per_rank.append({
            "rank": res["rank"],
            "bubbles_per_iteration": len(waits) / len(iters) if iters else 0,
            "reported_per_iteration": sum(b["reported"] for b in waits) / len(iters) if iters else 0,
            "bubble_fraction_measured": round(idle_ms / busy_ms, 4) if busy_ms else 0.0,
            "path": res["reporter_path"],
            "dropped_by_reporter": res["reporter_dropped"],
        })
    step_plain = statistics.median(plain)
    step_inst = statistics.median(instrumented)
    m = ns.microbatches
    return {
        "benchmark": "trainer",
        "path": path,
        "schedule": ns.schedule, "p": ns.stages, "stages_per_rank": v, "m": ns.microbatches,
        "F_ms": ns.forward_ms, "B_ms": ns.backward_ms, "iterations": ns.iterations,
        "step_ms_plain": round(step_plain, 3),
        "step_ms_instrumented": round(step_inst, 3),
        "overhead_ratio": round(statistics.median(paired), 4),
        "overhead_ratio_of_medians": round(step_inst / step_plain, 4),
        "bubble_fraction_measured": round(statistics.mean(r["bubble_fraction_measured"] for r in per_rank), 4),
        "bubble_fraction_theory": round((ns.stages - 1) / (m * v + ns.stages - 1), 4),
        "dropped_by_reporter": sum(r["dropped_by_reporter"] for r in per_rank),
        "ranks": per_rank,
    }
