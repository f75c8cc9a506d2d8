"""`freeride demo`: one agent per pipeline stage, a synthetic 1F1B trainer, a real side task in the bubbles.

Each stage's trainer thread replays that stage's schedule in real time (compute as sleeps,
bubbles reported through a real BubbleReporter); each agent runs a mini-batch k-means side
task in a real worker process. At the end: bubble time, harvested time and progress per stage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from freeride._stats import percentile
from freeride.bench import trace as tr
from freeride.cli.units import format_seconds
from freeride.harness import AgentProcess, WindowCollector, grant_latencies_us, replay, wait_for_task
from freeride.trainer.reporter import BubbleReporter
from freeride.v1 import tasks_pb2


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--forward-ms", type=float, default=20.0)
    p.add_argument("--backward-ms", type=float, default=40.0)
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the report as JSON here")


def _stage_thread(agent: AgentProcess, stage: int, iterations: list[list[tr.Segment]], progress: Any, bar: Any) -> None:
    reporter = BubbleReporter(agent.target, rank=stage, stage=stage)
    try:
        reporter.wait_connected(10)
        for it in iterations:
            replay(reporter, [it])
            progress.advance(bar)
    finally:
        reporter.close()


def cmd_demo(ns: argparse.Namespace) -> int:
    console = Console()
    # Four workers share this machine's cores with four agents: one BLAS thread each avoids oversubscription.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    p, m = ns.stages, ns.microbatches
    trace = tr.generate("1F1B", p, m, ns.forward_ms, ns.backward_ms, 0.02, ns.iterations)
    theory = (p - 1) / (m + p - 1)
    console.print(
        f"[bold]freeride demo[/]: 1F1B pipeline, p={p} stages, m={m} micro-batches, F={ns.forward_ms:g} ms, "
        f"B={ns.backward_ms:g} ms, {ns.iterations} iterations; each stage idles {theory:.1%} of the time.\n"
        "One agent per stage; each runs a mini-batch k-means side task (sidetasks.kmeans:KMeans) in its bubbles."
    )
    with contextlib.ExitStack() as stack:
        agents = []
        with console.status("starting agents and side-task workers"):
            for stage in range(p):
                agents.append(stack.enter_context(AgentProcess(gpu=stage)))
            clients = [stack.enter_context(a.client()) for a in agents]
            tasks = [
                c.submit(tasks_pb2.TaskSpec(name=f"kmeans-stage{s}", ref="sidetasks.kmeans:KMeans",
                                            args={"steps": "1000000", "seed": str(s)}))
                for s, c in enumerate(clients)
            ]
            for c, t in zip(clients, tasks, strict=True):
                wait_for_task(c, t.id, [tasks_pb2.TASK_STATE_READY])
        collectors = [stack.enter_context(WindowCollector(c)) for c in clients]
        start_inertia = [c.get(t.id).progress.get("inertia", 0.0) for c, t in zip(clients, tasks, strict=True)]
        t0 = time.monotonic()
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeRemainingColumn(), console=console) as progress:
            threads = []
            for s, agent in enumerate(agents):
                bar = progress.add_task(f"stage {s} iterations", total=ns.iterations)
                th = threading.Thread(target=_stage_thread, args=(agent, s, trace[s], progress, bar), daemon=True)
                th.start()
                threads.append(th)
            for th in threads:
                th.join()
        wall_s = time.monotonic() - t0
        for col, s in zip(collectors, range(p), strict=True):
            col.wait_for(sum(seg.bubble and seg.duration_s > 1e-3 for it in trace[s][2:] for seg in it), 2.0)
        report = _report(clients, tasks, collectors, start_inertia, wall_s, ns, theory)
    _print(console, report)
    if ns.json:
        ns.json.write_text(json.dumps(report, indent=2))
        console.print(f"report written to {ns.json}")
    return 0


def _report(clients: list[Any], tasks: list[Any], collectors: list[WindowCollector], start_inertia: list[float],
            wall_s: float, ns: argparse.Namespace, theory: float) -> dict[str, Any]:
    stages = []
    for s, (c, t, col) in enumerate(zip(clients, tasks, collectors, strict=True)):
        g = c.stats().gpu
        info = c.get(t.id)
        grant_p50_us = percentile(grant_latencies_us(col.windows), 0.5)
        stages.append({
            "stage": s,
            "bubbles": g.bubbles,
            "bubble_s": round(g.bubble_s, 3),
            "harvested_s": round(g.harvested_s, 3),
            "efficiency": round(g.harvested_s / g.bubble_s, 4) if g.bubble_s else 0.0,
            "steps": info.counters.steps,
            "overrun_steps": info.counters.overrun_steps,
            "grant_us_p50": round(grant_p50_us, 1),
            "kmeans_inertia_start": round(start_inertia[s], 2),
            "kmeans_inertia_end": round(info.progress.get("inertia", 0.0), 2),
        })
    bubble = sum(st["bubble_s"] for st in stages)
    harvested = sum(st["harvested_s"] for st in stages)
    return {
        "schedule": "1F1B", "p": ns.stages, "m": ns.microbatches, "F_ms": ns.forward_ms, "B_ms": ns.backward_ms,
        "iterations": ns.iterations, "wall_s": round(wall_s, 2), "bubble_fraction_theory": round(theory, 4),
        "stages": stages,
        "bubble_s": round(bubble, 3), "harvested_s": round(harvested, 3),
        "efficiency": round(harvested / bubble, 4) if bubble else 0.0,
    }


def _print(console: Console, r: dict[str, Any]) -> None:
    table = Table(title="harvested GPU time per stage")
    for col in ("stage", "idle", "harvested", "efficiency", "steps", "overruns", "grant p50", "k-means inertia"):
        table.add_column(col, justify="right")
    for st in r["stages"]:
        table.add_row(
            str(st["stage"]), format_seconds(st["bubble_s"]), format_seconds(st["harvested_s"]),
            f"{st['efficiency']:.1%}", str(st["steps"]), str(st["overrun_steps"]), f"{st['grant_us_p50']:.0f} µs",
            f"{st['kmeans_inertia_start']:.1f} → {st['kmeans_inertia_end']:.1f}",
        )
    table.add_row("all", format_seconds(r["bubble_s"]), format_seconds(r["harvested_s"]), f"{r['efficiency']:.1%}",
                  "", "", "", "", style="bold")
    console.print(table)
    console.print(
        f"In {r['wall_s']:.1f} s of training, the stages were idle {format_seconds(r['bubble_s'])} in total; "
        f"freeride turned {format_seconds(r['harvested_s'])} of it ({r['efficiency']:.1%}) into side-task steps. "
        "The first two iterations of each bubble slot are spent learning its length."
    )
