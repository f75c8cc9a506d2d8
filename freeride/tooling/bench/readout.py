"""What one `bench overhead` configuration measured: the trainer replay's rows and the agent's windows, read.

- **slowdown**: each harvested iteration against the mean of the plain ones on either side; the median, its
  bootstrap 95 % interval, and an A/A null from the plain iterations alone (freeride.tooling.bench.stats), with a
  verdict against the target.
- **segments**: the same pairing per segment class (the gaps, the first compute after a gap, the other compute):
  where a slowdown went.
- **harvest**: busy (the worker's step time in the windows, less overruns) and useful (side steps x the step's
  time on an idle GPU, from the solo iterations) over the gaps the replay made.
- **edges**: the agent's stamped START and END against the GPU's real ones (from the segment events), how far
  the window's end sits from the real END, and side work after the real END (the worker's idle stamp, an upper
  bound: it includes the worker's wake-up after its step's synchronise).
- **clock**: NVML SM clock, power and clock-event reasons in plain and harvested iterations.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from freeride.core.stats import percentile
from freeride.tooling.bench import stats
from freeride.tooling.harness import grant_latencies_us
from freeride.v1 import tasks_pb2

LEARN = 2  # reported iterations the agent needs before it grants windows

# NVML clock-event reason bits (nvmlClocksEventReason*): the ones that lower the SM clock under load.
_REASONS = {"sw_power_cap": 0x4, "hw_slowdown": 0x8, "sw_thermal": 0x20, "hw_thermal": 0x40, "hw_power_brake": 0x80}


def summarise(trainer: dict[str, Any], windows: Sequence[tasks_pb2.WindowRecord], info: tasks_pb2.TaskInfo,
              target: float = 0.005) -> dict[str, Any]:
    rows = trainer["rows"]
    main = [r for r in rows if not r["solo"]]
    solo_its = {r["it"] for r in rows if r["solo"]}
    steps = [r["step_ms"] for r in main]
    n = len(steps)
    harvested_its = [i for i in range(n) if i % 2 == 1][LEARN:]
    plain_its = [i for i in range(LEARN, n) if i % 2 == 0]
    effect = stats.bootstrap_median(stats.paired_ratios(steps, harvested_its))
    null = stats.bootstrap_median(stats.null_ratios(steps, plain_its))
    paired = stats.paired_ratios(steps, harvested_its)
    kinds = stats.classify_segments(trainer["seg_bubble"])
    segments = stats.segment_deltas(main, kinds, harvested_its)

    wanted = set(harvested_its)
    bubble_s = sum((e - s) / 1e9 for it, _, s, e in trainer["bubbles"] if it in wanted)
    trace_bubble_s = sum(trainer["trace_bubble_s"][i] for i in harvested_its)  # the gaps the replay made
    mine = [w for w in windows if w.iteration in wanted]
    alone = [w for w in windows if w.iteration in solo_its]
    harvested_s = sum((sh.busy_ns - sh.overrun_ns) / 1e9 for w in mine for sh in w.shares)
    side_steps = sum(sh.steps for w in mine for sh in w.shares)
    solo_steps = sum(sh.steps for w in alone for sh in w.shares)
    idle_step_ms = sum(sh.busy_ns for w in alone for sh in w.shares) / 1e6 / solo_steps if solo_steps else 0.0
    useful_s = side_steps * idle_step_ms / 1e3
    # After END (the trainer needs the GPU back), how long the side task's work kept running: against the stamp.
    tails_ms = [max(0.0, (sh.idle_ns - w.bubble_end_ns) / 1e6) for w in mine for sh in w.shares if sh.steps]
    grant_us = grant_latencies_us(mine)
    neighbour = trainer.get("neighbour", {})
    return {
        "device_name": trainer["device_name"],
        "F_ms": round(trainer["F_ms"], 3), "B_ms": round(trainer["B_ms"], 3),
        "neighbour_info": neighbour,
        "neighbour_sleep_ghz": round(neighbour.get("sleep_ghz", 0.0), 3),  # 0: no _sleep neighbour ran
        "step_ms_plain": _r(statistics.median([steps[i] for i in plain_its])) if plain_its else 0.0,
        "step_ms_harvested": _r(statistics.median([steps[i] for i in harvested_its])) if harvested_its else 0.0,
        "slowdown": round(effect.estimate, 5),
        "slowdown_interval": effect.as_dict(),
        "null": null.as_dict(),
        "verdict": stats.verdict(effect, null, target),
        "slowdown_first_harvested": round(paired[0], 5) if paired else 0.0,
        "segment_delta_ms": {k: v.as_dict(4) for k, v in segments.items()},
        "bubble_s": round(bubble_s, 4),
        "harvested_s": round(harvested_s, 4),
        "efficiency": round(harvested_s / bubble_s, 4) if bubble_s else 0.0,
        # Against the gaps themselves: what the edges' mode found of them does not enter (`off` on a GPU
        # neighbour finds next to nothing).
        "trace_bubble_s": round(trace_bubble_s, 4),
        "efficiency_of_trace": round(harvested_s / trace_bubble_s, 4) if trace_bubble_s else 0.0,
        "side_steps": side_steps,
        "idle_step_ms": round(idle_step_ms, 4),
        "bubble_step_ms": round(harvested_s * 1e3 / side_steps, 4) if side_steps else 0.0,
        "useful_s": round(useful_s, 4),
        "useful_harvest": round(useful_s / trace_bubble_s, 4) if trace_bubble_s else 0.0,
        "solo_steps": solo_steps,
        "stop_after_end_ms_p50": _pct(tails_ms, 0.5, 3),
        "stop_after_end_ms_p99": _pct(tails_ms, 0.99, 3),
        "stop_after_end_ms_max": round(max(tails_ms), 3) if tails_ms else 0.0,
        **real_edges(mine, main),
        "grant_us_p50": _pct(grant_us, 0.5, 1),
        "grant_us_p99": _pct(grant_us, 0.99, 1),
        "windows": len(mine),
        "clock": clock(trainer.get("nvml", {}), set(harvested_its), set(plain_its)),
        "side_task_state": tasks_pb2.TaskState.Name(info.state),
        "side_task_progress": dict(info.progress),
        "side_task_peak_memory_bytes": info.counters.peak_memory_bytes,
        "rows": rows,
        "windows_rows": [window_row(w) for w in windows],
        "nvml": trainer.get("nvml", {}),
    }


def real_edges(windows: Iterable[tasks_pb2.WindowRecord], rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The stamped edges against the GPU's (each window matched to its iteration's gap whose end is nearest its
    stamped END): how late START and END were stamped, where the window's end fell, side work after the real END."""
    start_late, end_late, until_vs_end, tail = [], [], [], []
    for w in windows:
        gaps = rows[w.iteration]["gaps"] if w.iteration < len(rows) else []
        if not gaps:
            continue
        g_start, g_end = min(gaps, key=lambda g: abs(g[1] - w.bubble_end_ns))
        start_late.append((w.bubble_start_ns - g_start) / 1e3)
        end_late.append((w.bubble_end_ns - g_end) / 1e3)
        until_vs_end.append((w.until_ns - g_end) / 1e3)
        tail += [max(0.0, (sh.idle_ns - g_end) / 1e6) for sh in w.shares if sh.steps]
    return {
        "start_stamp_late_us_p50": _pct(start_late, 0.5, 1), "start_stamp_late_us_p99": _pct(start_late, 0.99, 1),
        "end_stamp_late_us_p50": _pct(end_late, 0.5, 1), "end_stamp_late_us_p99": _pct(end_late, 0.99, 1),
        "until_vs_real_end_us_p50": _pct(until_vs_end, 0.5, 1),
        "until_vs_real_end_us_p99": _pct(until_vs_end, 0.99, 1),
        "after_real_end_ms_p50": _pct(tail, 0.5, 3), "after_real_end_ms_p99": _pct(tail, 0.99, 3),
        "after_real_end_ms_max": round(max(tail), 3) if tail else 0.0,
    }


def clock(nvml: dict[str, Any], harvested: set[int], plain: set[int]) -> dict[str, Any]:
    """Mean SM clock and power, and the share of samples with each clock-lowering reason, plain vs harvested."""
    its = nvml.get("it") or []
    if not its:
        return {"samples": 0, "reason": nvml.get("reason", "no samples")}
    out: dict[str, Any] = {"samples": len(its), "reason": nvml.get("reason", "")}
    for name, group in (("plain", plain), ("harvested", harvested)):
        idx = [k for k, it in enumerate(its) if it in group]
        if not idx:
            continue
        reasons = [nvml["reasons"][k] for k in idx]
        out[name] = {
            "samples": len(idx),
            "sm_mhz_mean": round(statistics.fmean(nvml["sm_mhz"][k] for k in idx), 1),
            "sm_mhz_min": min(nvml["sm_mhz"][k] for k in idx),
            "power_w_mean": round(statistics.fmean(nvml["power_mw"][k] for k in idx) / 1e3, 1),
            "reasons_share": {r: round(sum(1 for v in reasons if v & bit) / len(reasons), 3)
                              for r, bit in _REASONS.items()},
        }
    return out


def window_row(w: tasks_pb2.WindowRecord) -> dict[str, Any]:
    return {"it": w.iteration, "slot": w.slot, "start_ns": w.bubble_start_ns, "end_ns": w.bubble_end_ns,
            "until_ns": w.until_ns, "predicted_ns": w.predicted_ns, "seen_ns": w.seen_ns,
            "shares": [{"steps": sh.steps, "busy_ns": sh.busy_ns, "overrun_ns": sh.overrun_ns,
                        "first_step_ns": sh.first_step_ns, "idle_ns": sh.idle_ns} for sh in w.shares]}


def _pct(values: list[float], q: float, digits: int) -> float:
    return round(percentile(values, q), digits) if values else 0.0


def _r(v: float) -> float:
    return round(v, 3)
