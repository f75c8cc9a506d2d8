"""The demo's numbers: gather them from the ranks and agents, print them, draw the plot."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.table import Table

from freeride.core.stats import percentile
from freeride.core.units import format_seconds
from freeride.tooling import plot
from freeride.tooling.harness import WindowCollector, grant_latencies_us
from freeride.v1 import tasks_pb2, trainer_pb2

if TYPE_CHECKING:
    from pathlib import Path

    from freeride.tooling.demo.plan import Plan

_SHOWN_ITERATIONS = 3


def intro(plan: Plan) -> str:
    cfg = plan.pipeline
    names = sorted({t.name for ts in plan.tasks.values() for t in ts})
    theory = (cfg.stages - 1) / (cfg.microbatches + cfg.stages - 1)
    how = "at SCHED_IDLE" if plan.worker_sched == "idle" else f"at nice {plan.worker_nice}"
    where = (f"On this CPU each stage stands for one GPU: its rank and its agent's side-task workers ({how}) share "
             f"one core (stage:core {', '.join(f'{s}:{c}' for s, c in enumerate(plan.cpus))}).\n"
             if plan.cpus else "")
    return (
        f"[bold]freeride demo[/]: {cfg.stages}-stage 1F1B pipeline (torch.distributed.pipelining, "
        f"{'gloo on CPU' if cfg.device == 'cpu' else 'NCCL on GPUs'}) training a byte-level transformer "
        f"({cfg.stages * cfg.layers_per_stage} blocks, width {cfg.dim}) on Python's own source, "
        f"{cfg.microbatches} micro-batches: each stage idles ~{theory:.0%} of a step.\n"
        f"One agent per stage; side tasks in the bubbles: {', '.join(names)}. {cfg.iterations} iterations: "
        f"{cfg.warmup} warm-up, then blocks of {cfg.block} alternating baseline (bubbles not reported, side "
        f"tasks idle) and harvest.\n{where}Output: {plan.out_dir}"
    )


def _paired_slowdown(plan: Plan, its: list[float]) -> float:
    """The median over harvest blocks of (its median step / the mean of the neighbouring baseline blocks'), - 1.
    Pairing each block with its neighbours in time cancels the drift of a machine whose load changes
    from one block to the next, which a ratio of the two phases' medians inherits."""
    cfg = plan.pipeline
    meds = [statistics.median(its[i:i + cfg.block]) for i in range(cfg.warmup, cfg.iterations, cfg.block)]
    ratios = [meds[k] / statistics.mean(meds[j] for j in (k - 1, k + 1) if j < len(meds))
              for k in range(1, len(meds), 2)]
    return statistics.median(ratios) - 1.0


def _iteration_ms(ranks: list[dict[str, Any]]) -> list[float]:
    """An iteration lasts as long as its slowest rank's step."""
    return [max(ms) for ms in zip(*(r["step_ms"] for r in ranks), strict=True)]


def _progress(start: dict[str, float], end: dict[str, float]) -> dict[str, dict[str, float]]:
    return {k: {"start": round(start.get(k, 0.0), 4), "end": round(v, 4)} for k, v in sorted(end.items())}


def build(plan: Plan, ranks: list[dict[str, Any]], losses: list[float],
          submitted: dict[int, dict[str, tasks_pb2.TaskInfo]], finals: dict[int, dict[str, tasks_pb2.TaskInfo]],
          stats: list[tasks_pb2.StatsResponse], collectors: list[WindowCollector], train_s: float) -> dict[str, Any]:
    cfg = plan.pipeline
    its = _iteration_ms(ranks)
    warmup = [t for i, t in enumerate(its) if plan.phase(i) == "warmup"]
    baseline = [t for i, t in enumerate(its) if plan.phase(i) == "baseline"]
    harvest = [t for i, t in enumerate(its) if plan.phase(i) == "harvest"]
    base_med, harv_med = statistics.median(baseline), statistics.median(harvest)
    stages: list[dict[str, Any]] = []
    per_task: dict[str, dict[str, Any]] = {}
    for s, st in enumerate(stats):
        g = st.gpu
        task_rows = {}
        for name, info in finals[s].items():
            c = info.counters
            task_rows[name] = {
                "task_id": info.id, "state": tasks_pb2.TaskState.Name(info.state).removeprefix("TASK_STATE_"),
                "harvested_s": round(c.harvested_s, 3),
                "efficiency": round(c.harvested_s / g.bubble_s, 4) if g.bubble_s else 0.0,
                "steps": c.steps, "overrun_steps": c.overrun_steps, "step_p95_ms": round(c.step_estimate_s * 1e3, 2),
                "progress": _progress(dict(submitted[s][name].progress), dict(info.progress)),
            }
            agg = per_task.setdefault(name, {"name": name, "ref": info.spec.ref, "stages": [], "harvested_s": 0.0,
                                             "bubble_s": 0.0, "steps": 0})
            agg["stages"].append(s)
            agg["harvested_s"] += c.harvested_s
            agg["bubble_s"] += g.bubble_s
            agg["steps"] += c.steps
        stages.append({
            "stage": s, "bubbles": g.bubbles, "bubble_s": round(g.bubble_s, 3), "harvested_s": round(g.harvested_s, 3),
            "efficiency": round(g.harvested_s / g.bubble_s, 4) if g.bubble_s else 0.0,
            "steps": g.steps, "overrun_steps": g.overrun_steps, "overrun_s": round(g.overrun_s, 4),
            "grant_us_p50": round(percentile(grant_latencies_us(collectors[s].windows), 0.5), 1),
            "granted_s": round(_granted_s(collectors[s].windows), 3),
            "tasks": task_rows,
        })
    for agg in per_task.values():
        agg["efficiency"] = round(agg["harvested_s"] / agg["bubble_s"], 4) if agg["bubble_s"] else 0.0
        agg["harvested_s"], agg["bubble_s"] = round(agg["harvested_s"], 3), round(agg["bubble_s"], 3)
    bubble_s = sum(float(st["bubble_s"]) for st in stages)
    harvested_s = sum(float(st["harvested_s"]) for st in stages)
    return {
        "config": {
            "schedule": cfg.schedule, "stages": cfg.stages, "microbatches": cfg.microbatches, "device": cfg.device,
            "model": {"kind": "byte-level transformer", "blocks": cfg.stages * cfg.layers_per_stage, "dim": cfg.dim,
                      "heads": cfg.heads, "seq_len": cfg.seq_len, "microbatch_size": cfg.microbatch_size},
            "iterations": cfg.iterations, "warmup": cfg.warmup, "block": cfg.block, "worker_nice": plan.worker_nice,
            "worker_sched": plan.worker_sched, "cpus": list(plan.cpus),
            "side_tasks": {str(s): [t.ref for t in ts] for s, ts in plan.tasks.items()},
        },
        "training_s": round(train_s, 2),
        "step_ms": {
            "baseline_median": round(base_med, 2), "harvest_median": round(harv_med, 2),
            "warmup_median": round(statistics.median(warmup), 2) if warmup else None,
            "warmup": [round(t, 2) for t in warmup],
            "baseline": [round(t, 2) for t in baseline], "harvest": [round(t, 2) for t in harvest],
        },
        "slowdown": round(_paired_slowdown(plan, its), 4),
        "slowdown_of_medians": round(harv_med / base_med - 1.0, 4),
        "loss": {"first": round(losses[0], 4) if losses else None, "last": round(losses[-1], 4) if losses else None},
        "bubble_s": round(bubble_s, 3), "harvested_s": round(harvested_s, 3),
        "efficiency": round(harvested_s / bubble_s, 4) if bubble_s else 0.0,
        "stages": stages,
        "tasks": list(per_task.values()),
    }


def _granted_s(windows: list[tasks_pb2.WindowRecord]) -> float:
    """How much of the bubbles the agent offered as windows (its prediction, less its margin)."""
    return sum(max(0, min(w.until_ns, w.bubble_end_ns) - w.bubble_start_ns) for w in windows) / 1e9


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _progress_text(progress: dict[str, dict[str, float]]) -> str:
    """The keys that moved, as 'key start → end'; the others only when nothing moved."""
    moved = {k: v for k, v in progress.items() if v["start"] != v["end"]}
    if not moved:
        return ", ".join(f"{k} {_fmt(v['end'])}" for k, v in progress.items()) or "-"
    return ", ".join(f"{k} {_fmt(v['start'])} → {_fmt(v['end'])}" for k, v in moved.items())


def _table(title: str) -> Table:
    return Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)  # fits 80 columns


def show(console: Console, r: dict[str, Any]) -> None:
    sm = r["step_ms"]
    train = _table("training step time (median over each phase's iterations)")
    for col in ("phase", "iterations", "step time", "loss"):
        train.add_column(col, justify="right")
    if sm["warmup"]:
        train.add_row("warm-up: learning bubbles, side tasks' first steps", str(len(sm["warmup"])),
                      f"{sm['warmup_median']:.0f} ms", "", style="dim")
    train.add_row("baseline: side tasks idle", str(len(sm["baseline"])), f"{sm['baseline_median']:.0f} ms",
                  f"first {r['loss']['first']:.3f}" if r["loss"]["first"] is not None else "")
    train.add_row("harvest: side tasks in bubbles", str(len(sm["harvest"])), f"{sm['harvest_median']:.0f} ms",
                  f"last {r['loss']['last']:.3f}" if r["loss"]["last"] is not None else "")
    train.add_row("slowdown: each harvest block against", "", f"{r['slowdown']:+.1%}", "", style="bold")
    train.add_row("the baseline blocks on either side", "", "", "", style="bold")
    console.print(train)

    stages = _table("bubbles and harvested time per stage (harvest and warm-up iterations; grant: p50 latency)")
    for col in ("stage", "bubbles", "idle", "harvested", "efficiency", "steps", "overruns", "grant"):
        stages.add_column(col, justify="right")
    for st in r["stages"]:
        stages.add_row(str(st["stage"]), str(st["bubbles"]), format_seconds(st["bubble_s"]),
                       format_seconds(st["harvested_s"]), f"{st['efficiency']:.1%}", str(st["steps"]),
                       str(st["overrun_steps"]), f"{st['grant_us_p50']:.0f} µs")
    stages.add_row("all", "", format_seconds(r["bubble_s"]), format_seconds(r["harvested_s"]), f"{r['efficiency']:.1%}",
                   "", "", "", style="bold")
    console.print(stages)

    tasks = _table("side tasks: harvested time and its share of the stage's bubbles")
    for col in ("task", "stage", "harvested", "efficiency", "steps", "step p95"):
        tasks.add_column(col, justify="left" if col == "task" else "right")
    progress = _table("side tasks: progress made (start → end; what each task's progress() reports)")
    progress.add_column("task")
    progress.add_column("stage", justify="right")
    progress.add_column("progress")
    for st in r["stages"]:
        for name, t in st["tasks"].items():
            tasks.add_row(name, str(st["stage"]), format_seconds(t["harvested_s"]), f"{t['efficiency']:.1%}",
                          str(t["steps"]), f"{t['step_p95_ms']:.1f} ms")
            progress.add_row(name, str(st["stage"]), _progress_text(t["progress"]))
    for t in r["tasks"]:
        tasks.add_row(t["name"], "all", format_seconds(t["harvested_s"]), f"{t['efficiency']:.1%}", str(t["steps"]),
                      "", style="bold")
    console.print(tasks)
    console.print(progress)
    console.print(
        f"Training took {sm['baseline_median']:.0f} ms a step without side tasks and {sm['harvest_median']:.0f} ms "
        f"with them; block by block, against the baseline blocks on either side: {r['slowdown']:+.1%}. "
        f"The stages idled {format_seconds(r['bubble_s'])} in the iterations that "
        f"reported bubbles; side tasks used {format_seconds(r['harvested_s'])} of it ({r['efficiency']:.1%}).\n"
        f"Timeline: {r['timeline_png']}\nProfile:  {r['profile']['png']}   (the bubbles of each stage, by slot: "
        f"freeride profile --from {r['profile']['json']})\nReport:   {r['report_json']}   (whole demo: "
        f"{r['wall_s']:.0f} s)"
    )
    if r["config"]["cpus"]:
        console.print(f"[dim]{CPU_CAVEAT}[/]")


CPU_CAVEAT = (
    "On a CPU the demo shows the mechanism, not the GPU numbers: each stage's core idles in its bubbles as a GPU "
    "would, and side tasks run only there, at the lowest CPU priority. What it cannot isolate is what cores share: "
    "caches, memory bandwidth, the agents and this program, so a few % of slowdown is the floor here, and it "
    "swings with whatever else the machine runs. On GPUs MPS client priority does the isolation "
    "(`freeride bench overhead` measures it)."
)


def _shown_iterations(plan: Plan, ranks: list[dict[str, Any]], lanes: list[plot.Lane]) -> range:
    """The few consecutive harvest iterations in which side tasks ran longest: where there is most to see."""
    cfg = plan.pipeline
    starts = [i for i in range(cfg.warmup, cfg.iterations - _SHOWN_ITERATIONS + 1)
              if all(plan.phase(j) == "harvest" for j in range(i, i + _SHOWN_ITERATIONS))]
    if not starts:  # blocks shorter than the picture: the last harvest iterations
        last = max(i for i in range(cfg.iterations) if plan.phase(i) == "harvest")
        return range(max(0, last - _SHOWN_ITERATIONS + 1), last + 1)
    steps = sorted(a for ln in lanes for spans in ln.steps.values() for a, _ in spans)

    def busy(i: int) -> int:
        lo, hi = _span(ranks, range(i, i + _SHOWN_ITERATIONS))
        return sum(1 for a in steps if lo <= a < hi)

    best = max(starts, key=lambda i: (busy(i), i))
    return range(best, best + _SHOWN_ITERATIONS)


def _span(ranks: list[dict[str, Any]], shown: range) -> tuple[int, int]:
    start_ns = min(r["step_start_ns"][shown.start] for r in ranks)
    end_ns = max(r["step_start_ns"][shown[-1]] + int(r["step_ms"][shown[-1]] * 1e6) for r in ranks)
    return start_ns, end_ns


def draw(plan: Plan, ranks: list[dict[str, Any]], timelines: list[tasks_pb2.TimelineResponse], out: Path) -> Path:
    lanes = []
    for s, (resp, rank) in enumerate(zip(timelines, ranks, strict=True)):
        (lane,) = plot.lanes_from_timeline(resp, label=f"stage {s}") or [plot.Lane(f"stage {s}")]
        lane.compute = [(a, a + int(ms * 1e6)) for a, ms in zip(rank["step_start_ns"], rank["step_ms"], strict=True)]
        if not lane.bubbles:  # the agent saw none: use the trainer's own record
            lane.bubbles = [(b["start_ns"], b["end_ns"]) for b in rank["bubbles"]
                        if b["kind"] != trainer_pb2.BUBBLE_KIND_BETWEEN_STEPS]
        lanes.append(lane)
    shown = _shown_iterations(plan, ranks, lanes)
    start_ns, end_ns = _span(ranks, shown)
    marks = [(ranks[0]["step_start_ns"][i], f"iteration {i}") for i in shown]
    cfg = plan.pipeline
    title = (f"{cfg.stages}-stage 1F1B pipeline training a byte-level transformer ({cfg.device.upper()}), "
             f"iterations {shown.start}-{shown[-1]} (harvest): side-task steps run only inside bubbles")
    return plot.plot(lanes, out, start_ns, end_ns, title, marks)
