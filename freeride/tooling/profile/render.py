"""A profile shown three ways: tables, one JSON shape (numbers as numbers), and a PNG per stage."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from freeride.cli.common import console, table
from freeride.tooling.profile.analysis import StageProfile


def as_dict(stages: list[StageProfile]) -> dict[str, Any]:
    return {"stages": [asdict(s) for s in stages]}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def print_tables(stages: list[StageProfile]) -> None:
    out = console()
    for s in stages:
        th = s.theory
        declared = f"{th.schedule}, p={th.p}, m={th.m}" + (f", v={th.v}" if th.v > 1 else "") if th.schedule \
            else "no schedule declared"
        out.print(f"GPU {s.gpu}, rank {s.rank} (stage {s.stage}; {declared}): {s.iterations} iterations of "
                  f"{s.iteration_ms:.1f} ms; idle {_pct(s.bubble_fraction)} measured, theory "
                  f"{_pct(th.fraction)} ({th.formula})")
        t = table(None, "slot", "kind", "count", "mean ms", "p50 ms", "p95 ms", "share")
        for sl in s.slots:
            t.add_row(str(sl.slot), sl.kind, str(sl.count), f"{sl.mean_ms:.2f}", f"{sl.p50_ms:.2f}",
                      f"{sl.p95_ms:.2f}", _pct(sl.share))
        out.print(t)
        if s.whatif:
            w = table(None, "step", "harvested share of idle time", "overrun steps")
            for r in s.whatif:
                w.add_row(r.step, _pct(r.share), str(r.overrun_steps))
            out.print(w)
        elif s.whatif_note:
            out.print(f"what-if: {s.whatif_note}")


def plot(stages: list[StageProfile], out: Path) -> Path:
    """Per stage: mean bubble length by slot (p95 as a whisker), and the harvestable share per step size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(stages), 2, figsize=(11, 2.6 * len(stages)), squeeze=False)
    for row, s in zip(axes, stages, strict=True):
        left, right = row
        xs = [str(sl.slot) for sl in s.slots]
        means = [sl.mean_ms for sl in s.slots]
        left.bar(xs, means, yerr=[[0.0] * len(means), [sl.p95_ms - sl.mean_ms for sl in s.slots]], color="#d62728",
                 alpha=0.8, capsize=3)
        left.set_title(f"GPU {s.gpu} rank {s.rank} (stage {s.stage}): bubble length by slot", fontsize=9)
        left.set_xlabel("slot")
        left.set_ylabel("ms (mean, p95)")
        right.bar([r.step for r in s.whatif], [100 * r.share for r in s.whatif], color="#2ca02c")
        right.set_ylim(0, 100)
        right.set_title("harvestable share of idle time by step size"
                        + ("" if s.whatif else f" ({s.whatif_note})"), fontsize=9)
        right.set_ylabel("%")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
