"""`freeride stats` of one agent: the GPU's harvest, its memory, its trainer streams, what the harvest is worth
and every task's share (several agents: freeride.cli.multi)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import TYPE_CHECKING

from freeride.cli import _agents, multi
from freeride.cli.common import console, progress_text, table
from freeride.cli.multi import STATE_NAMES, one_client
from freeride.cli.value import WORTH_COLUMNS, Pricing, Worth, gpu_hours
from freeride.core.units import format_seconds, format_size
from freeride.v1 import tasks_pb2

if TYPE_CHECKING:
    from rich.table import Table


def cmd_stats(ns: argparse.Namespace) -> int:
    pricing = Pricing.from_args(ns)
    agents = _agents.resolve(ns)
    if agents.multi or ns.json:
        return multi.cmd_stats(ns, agents, pricing)
    with one_client(ns) as c:
        stats = c.stats()
    g = stats.gpu
    con = console()
    gt = table(f"GPU {g.gpu} ({ns.target}), up {format_seconds(g.uptime_s)}, {g.trainers} trainer stream(s)",
               "bubbles", "bubble time", "harvested", "efficiency", "steps", "overruns", "prediction error p50")
    gt.add_row(
        str(g.bubbles), format_seconds(g.bubble_s), format_seconds(g.harvested_s),
        f"{g.harvested_s / g.bubble_s:.1%}" if g.bubble_s else "-", str(g.steps),
        f"{g.overrun_steps} ({format_seconds(g.overrun_s)})", f"{g.prediction_error_p50:.1%}",
    )
    con.print(gt)
    con.print(_memory_table(g.memory))
    if g.trainer_streams:
        con.print(_trainers_table(g.trainer_streams))
    worth = Worth.of(g.harvested_s, g.training_s, pricing)
    wt = table("harvest in GPU-hours", *WORTH_COLUMNS)
    wt.add_row(*worth.cells())
    con.print(wt)
    tt = table("tasks", "id", "name", "state", "steps", "harvested", "GPU-h", "share of bubbles", "overruns",
               "step p95", "memory", "progress")
    for t in stats.tasks:
        cnt = t.counters
        tt.add_row(
            t.id, t.spec.name, STATE_NAMES[t.state], str(cnt.steps), format_seconds(cnt.harvested_s),
            gpu_hours(cnt.harvested_s / 3600), f"{cnt.harvested_s / g.bubble_s:.1%}" if g.bubble_s else "-",
            f"{cnt.overrun_steps} ({format_seconds(cnt.overrun_s)})", format_seconds(cnt.step_estimate_s),
            f"{format_size(t.memory_bytes)} / {format_size(t.spec.mem_limit_bytes)}",
            progress_text(t.progress),
        )
    con.print(tt)
    for line in worth.notes():
        con.print(line, highlight=False)
    return 0


def _trainers_table(streams: Iterable[tasks_pb2.TrainerStream]) -> Table:
    """One row per open trainer stream: the road its edges take (shm: the same-host ring) and what came."""
    t = table("trainers", "rank", "stage", "pid", "path", "edges", "rejected", "dropped", "peer")
    for s in sorted(streams, key=lambda s: (s.rank, s.stage, s.pid, s.peer)):
        peer = "this host" if s.peer.startswith("unix:") else s.peer  # a unix socket's peer has no address
        t.add_row(str(s.rank), str(s.stage), str(s.pid or "?"), s.path, str(s.edges), str(s.rejected),
                  str(s.dropped), peer)
    return t


def _memory_table(m: tasks_pb2.GpuMemory) -> Table:
    where = f"{m.name} ({m.uuid}), compute mode {m.compute_mode}" if m.mode != "cpu" else "CPU mode: resident memory"
    t = table(f"memory: {where}, MPS {m.mps or 'off'}" + (" [fake GPU]" if m.mode == "fake" else ""),
              "total", "used", "free", "trainer & others", "trainer peak", "side tasks (now / reserved)",
              "usable for side tasks", "waiting")
    t.add_row(
        format_size(m.total_bytes), format_size(m.used_bytes), format_size(m.free_bytes),
        format_size(m.others_used_bytes), format_size(m.trainer_peak_bytes),
        f"{format_size(m.side_tasks_used_bytes)} / {format_size(m.side_tasks_reserved_bytes)}",
        "unbounded" if m.usable_bytes < 0 else format_size(m.usable_bytes) if m.usable_bytes else "0",
        str(m.waiting_tasks),
    )
    return t

