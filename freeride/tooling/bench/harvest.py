"""`freeride bench harvest`: replay a bubble trace through a real agent and worker; how much was harvested?

Beside the grant and event-delay figures, the machine's own floor at this trace's pace, in the same
run ("wake_delay_us", freeride.tooling.bench.wakefloor): a bare process woken through an eventfd
after the trace's median gap between edges. A core idle for tens of milliseconds wakes slower than
one idle for two (on a VM, the halted vCPU goes back to the hypervisor), and a grant takes two
wake-ups (trainer -> agent, agent -> worker).
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time
from pathlib import Path
from typing import Any

from freeride.core.stats import percentile
from freeride.tooling import trace as tr
from freeride.tooling import whatif
from freeride.tooling.bench import paths, wakefloor
from freeride.tooling.harness import (
    AgentProcess,
    WindowCollector,
    grant_latencies_us,
    grant_parts_summary,
    replay,
    wait_for_task,
)
from freeride.v1 import tasks_pb2

_ORACLE_DRAWS = 32
_MODEL_DRAWS = 5  # replays given the run's measurements, averaged
_FLOOR_WAKES = 300  # at most: at a 20-40 ms pace, 6-12 s


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--schedule", default="1F1B", choices=["1F1B", "GPipe", "1f1b", "gpipe"])
    p.add_argument("--stages", "-p", type=int, default=4)
    p.add_argument("--microbatches", "-m", type=int, default=4)
    p.add_argument("--forward-ms", "-F", type=float, default=20.0)
    p.add_argument("--backward-ms", "-B", type=float, default=40.0)
    p.add_argument("--stage", type=int, default=1, help="which stage's bubbles to replay")
    p.add_argument("--trace-jitter", type=float, default=0.02, help="relative jitter of F and B (0.02 = ±2%%)")
    p.add_argument("--step-ms", "-S", type=float, default=5.0)
    p.add_argument("--step-jitter-ms", type=float, default=0.25)
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--trace", type=Path, help="replay this recorded trace (JSON) instead of generating one")
    p.add_argument("--margin-ms", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    paths.add_arg(p)


def oracle_fill(length_s: float, step_s: float, jitter_s: float, rng: random.Random) -> float:
    """Expected busy time of a prescient scheduler: steps back to back from the bubble's first instant."""
    if jitter_s == 0:
        return int(length_s / step_s) * step_s
    total = 0.0
    for _ in range(_ORACLE_DRAWS):
        t = 0.0
        while True:
            d = step_s + rng.uniform(-jitter_s, jitter_s)
            if t + d > length_s:
                break
            t += d
        total += t
    return total / _ORACLE_DRAWS



def run(ns: argparse.Namespace) -> dict[str, Any]:
    return paths.run("harvest", ns, _run)


def _run(ns: argparse.Namespace, path: str) -> dict[str, Any]:
    if ns.trace is not None:
        stage_trace = tr.load(ns.trace)
        ns.iterations = len(stage_trace)
    else:
        if not 0 <= ns.stage < ns.stages:
            raise ValueError(f"--stage must be in 0..{ns.stages - 1}")
        stage_trace = tr.generate(
            ns.schedule, ns.stages, ns.microbatches, ns.forward_ms, ns.backward_ms, ns.trace_jitter,
            ns.iterations, ns.seed,
        )[ns.stage]
    extra = [*paths.AGENT_ARGS, *(["--margin-ms", str(ns.margin_ms)] if ns.margin_ms is not None else [])]
    with AgentProcess(extra_args=extra) as agent, agent.client() as client:
        spec = tasks_pb2.TaskSpec(
            name="synthetic", ref="freeride.tooling.tasks:SleepTask",
            args={"step_ms": str(ns.step_ms), "jitter_ms": str(ns.step_jitter_ms), "seed": str(ns.seed)},
        )
        task = client.submit(spec)
        wait_for_task(client, task.id, [tasks_pb2.TASK_STATE_READY])
        collector = WindowCollector(client)
        reporter = paths.connect("harvest", agent.target, path, rank=ns.stage, stage=ns.stage)
        t0 = time.monotonic()
        bubbles = replay(reporter, stage_trace)
        wall_s = time.monotonic() - t0
        paths.check("harvest", path, reporter.path)  # still on the road asked for (no reconnect on the way)
        dropped = reporter.dropped
        reporter.close()
        collector.wait_for(_expected_windows(stage_trace), 2.0)  # the last one is accounted when its worker idles
        stats = client.stats()
        timeline = client.timeline()  # the windows' steps, each with its duration
        collector.close()
        windows = collector.windows
    edges = sorted(t for _, s, e in bubbles for t in (s, e))
    gap_ms = percentile([b - a for a, b in itertools.pairwise(edges)], 0.5) / 1e6 if len(edges) > 1 else 0.0
    floor = wakefloor.measure(min(_FLOOR_WAKES, len(edges)), gap_ms) if gap_ms > 0 else {}
    rng = random.Random(ns.seed + 1)
    bubble_lengths = [(e - s) / 1e9 for _, s, e in bubbles]
    ideal = sum(oracle_fill(length, ns.step_ms / 1e3, ns.step_jitter_ms / 1e3, rng) for length in bubble_lengths)
    # The same bubbles, as the trainer measured them, through the agent's scheduler on a fake clock (what
    # `freeride profile` predicts): the two efficiencies after learning should agree within a few points.
    kinds = [seg.kind for it in stage_trace for seg in it if seg.bubble]
    played = [whatif.Bubble(slot, it, s, e, kind) for (slot, s, e), it, kind
              in zip(bubbles, _iterations_of(stage_trace), kinds, strict=True)]
    margin_ns = int(ns.margin_ms * 1e6) if ns.margin_ms is not None else None
    nominal = whatif.replay(played, whatif.fixed_steps(int(ns.step_ms * 1e6), int(ns.step_jitter_ms * 1e6), ns.seed),
                            margin_ns=margin_ns)
    # The same replay given what this machine did in this run: each grant's latency (START -> the worker ran: its
    # first step, or its wake-up where no step fitted) and each step's duration (a sleep overshoots on a busy
    # machine, and one long step raises the margin for many windows after it), averaged over a few draws. The
    # scheduler is then the only thing compared.
    step_ns = [sp.duration_ns for w in timeline.windows for sh in w.shares for sp in sh.step_spans] or \
        [sh.busy_ns // sh.steps for w in windows for sh in w.shares if sh.steps]
    grants_ns = [g for g in (_grant_ns(w) for w in windows) if g > 0]
    draws = [whatif.replay(played, whatif.drawn_steps(step_ns, ns.seed + k), margin_ns=margin_ns,
                           grant_latency_ns=whatif.drawn_steps(grants_ns, ns.seed + 100 + k)).share
             for k in range(_MODEL_DRAWS)] if step_ns and grants_ns else [nominal.share]
    g = stats.gpu
    t = stats.tasks[0].counters
    learned = [w for w in windows if w.iteration >= 2]
    steady_bubble_s = sum((e - s) / 1e9 for (_, s, e), it in zip(bubbles, _iterations_of(stage_trace), strict=True)
                          if it >= 2)
    steady_harvest_s = sum((sh.busy_ns - sh.overrun_ns) / 1e9 for w in learned for sh in w.shares)
    overruns_ms = [sum(sh.overrun_ns for sh in w.shares) / 1e6 for w in windows]
    grant_us = grant_latencies_us(windows)
    return {
        "benchmark": "harvest",
        "path": path,
        "schedule": ns.schedule, "p": ns.stages, "m": ns.microbatches, "F_ms": ns.forward_ms, "B_ms": ns.backward_ms,
        "stage": ns.stage, "trace_jitter": ns.trace_jitter, "S_ms": ns.step_ms, "step_jitter_ms": ns.step_jitter_ms,
        "iterations": ns.iterations, "wall_s": round(wall_s, 3),
        "bubbles": g.bubbles,
        "bubble_s": round(g.bubble_s, 4),
        "harvested_s": round(g.harvested_s, 4),
        "efficiency": round(g.harvested_s / g.bubble_s, 4) if g.bubble_s else 0.0,
        "ideal_efficiency": round(ideal / sum(bubble_lengths), 4) if bubble_lengths else 0.0,
        "efficiency_after_learning": round(steady_harvest_s / steady_bubble_s, 4) if steady_bubble_s else 0.0,
        "whatif_efficiency_after_learning": round(statistics.fmean(draws), 4),
        "whatif_nominal_efficiency_after_learning": round(nominal.share, 4),
        "steps": t.steps,
        # what the run's steps really took (each sleeps S_ms): over S_ms, the machine stretched them
        "step_ms_p50": round(percentile(step_ns, 0.5) / 1e6, 3) if step_ns else 0.0,
        "step_ms_p90": round(percentile(step_ns, 0.9) / 1e6, 3) if step_ns else 0.0,
        "overrun_steps": t.overrun_steps,
        "overrun_fraction": round(t.overrun_steps / t.steps, 5) if t.steps else 0.0,
        "overrun_time_fraction": round(g.overrun_s / g.bubble_s, 5) if g.bubble_s else 0.0,
        "overrun_ms_p99": round(percentile([o for o in overruns_ms if o > 0] or [0.0], 0.99), 3),
        "prediction_error_p50": round(g.prediction_error_p50, 4),
        "event_delay_us_p50": round(g.event_delay_us_p50, 1),
        "event_delay_us_p99": round(g.event_delay_us_p99, 1),
        "grant_us_p50": round(percentile(grant_us, 0.5), 1),
        "grant_us_p99": round(percentile(grant_us, 0.99), 1),
        **grant_parts_summary(windows),
        "edge_gap_ms_p50": round(gap_ms, 2),
        **floor,
        "windows": len(windows),
        "dropped_by_reporter": dropped,
    }


def _grant_ns(w: tasks_pb2.WindowRecord) -> int:
    """START stamped -> the worker ran in this window: its first step, else its wake-up (no step fitted); 0: neither."""
    s = w.shares[0] if w.shares else None
    if s is None:
        return 0
    if s.steps:
        return s.first_step_ns - w.bubble_start_ns
    return s.woke_ns - w.bubble_start_ns if s.woke_ns else 0


def _iterations_of(stage_trace: list[list[tr.Segment]]) -> list[int]:
    """The iteration of every bubble of the trace, in order."""
    return [i for i, it in enumerate(stage_trace) for seg in it if seg.bubble]


def _expected_windows(stage_trace: list[list[tr.Segment]]) -> int:
    """Windows the agent can grant: none while the first two iterations are learned."""
    return sum(seg.bubble for it in stage_trace[2:] for seg in it)
