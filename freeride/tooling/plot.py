"""Draw what each pipeline stage did over a few iterations: training compute, bubbles, side-task steps.

One picture for `freeride demo` and `freeride timeline`: a row per stage, time in milliseconds
on the x axis. The data comes from agents' Timeline RPC (bubbles, windows, each side-task step)
and, when the caller has it, from the trainer (its step spans). matplotlib is imported lazily
with the Agg backend, so nothing here needs a display and the rest of freeride does not need
matplotlib.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from freeride.errors import FreerideError
from freeride.v1 import tasks_pb2

Span = tuple[int, int]  # (start_ns, end_ns)

_COMPUTE = "#4a6fa5"
_BUBBLE = "#f3d9a4"
_WINDOW = "#7a5c1e"
_TASK_COLORS = ("#2ca02c", "#d62728", "#9467bd", "#17becf", "#e377c2", "#8c564b", "#bcbd22", "#ff7f0e")


class PlotUnavailableError(FreerideError):
    """matplotlib is not installed."""


@dataclass
class Lane:
    """One stage's row: where it trained, where it idled, and the side-task steps in its bubbles."""

    label: str
    bubbles: list[Span] = field(default_factory=list)
    windows: list[Span] = field(default_factory=list)  # (bubble start, until): what the agent granted
    steps: dict[str, list[Span]] = field(default_factory=dict)  # task label -> steps
    compute: list[Span] | None = None  # None: everything between bubbles counts as training


def task_labels(tasks: Iterable[tasks_pb2.TaskInfo]) -> dict[str, str]:
    """Task id -> a short label for legends: the task's name (or class), with its id where names repeat."""
    tasks = list(tasks)
    names = {t.id: t.spec.name or t.spec.ref.rpartition(":")[2] or t.id for t in tasks}
    repeated = {n for n in names.values() if list(names.values()).count(n) > 1}
    return {i: f"{n} ({i})" if n in repeated else n for i, n in names.items()}


def lanes_from_timeline(resp: tasks_pb2.TimelineResponse, label: str | None = None,
                        names: dict[str, str] | None = None) -> list[Lane]:
    """One lane per trainer rank the agent saw (usually one per agent)."""
    names = {**task_labels(resp.tasks), **(names or {})}
    by_rank: dict[int, Lane] = {}

    def lane(rank: int) -> Lane:
        if rank not in by_rank:
            text = label if label is not None else f"GPU {resp.gpu}"
            by_rank[rank] = Lane(text if len({b.rank for b in resp.bubbles}) <= 1 else f"{text} rank {rank}")
        return by_rank[rank]

    for b in resp.bubbles:
        lane(b.rank).bubbles.append((b.start_ns, b.end_ns))
    for w in resp.windows:
        ln = lane(w.rank)
        ln.windows.append((w.bubble_start_ns, w.until_ns))
        for share in w.shares:
            spans = ln.steps.setdefault(names.get(share.task_id, share.task_id), [])
            spans.extend((s.start_ns, s.start_ns + s.duration_ns) for s in share.step_spans)
    return [by_rank[r] for r in sorted(by_rank)]


def busiest_range(lanes: Sequence[Lane], span_ns: int) -> tuple[int, int]:
    """The most recent `span_ns` of the lanes' bubbles that shows side-task steps (or just bubbles)."""
    ends = [e for ln in lanes for spans in ln.steps.values() for _, e in spans]
    ends = ends or [e for ln in lanes for _, e in ln.bubbles]
    if not ends:
        return 0, span_ns
    end = max(ends)
    return end - span_ns, end


def _clip(spans: Iterable[Span], lo: int, hi: int) -> list[Span]:
    return [(max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi and b > a]


def _complement(spans: list[Span], lo: int, hi: int) -> list[Span]:
    out, t = [], lo
    for a, b in sorted(spans):
        if a > t:
            out.append((t, a))
        t = max(t, b)
    if t < hi:
        out.append((t, hi))
    return out


def _busy_ns(spans: Iterable[Span]) -> int:
    return sum(b - a for a, b in spans)


def plot(lanes: Sequence[Lane], out: Path, start_ns: int, end_ns: int, title: str,
         marks: Sequence[tuple[int, str]] = ()) -> Path:
    """Write the timeline of `lanes` between `start_ns` and `end_ns` as a PNG; `marks`: labelled instants."""
    plt = _pyplot()
    tasks = sorted({name for ln in lanes for name, spans in ln.steps.items() if _clip(spans, start_ns, end_ns)})
    colors = {name: _TASK_COLORS[i % len(_TASK_COLORS)] for i, name in enumerate(tasks)}
    ms = 1e6
    fig, ax = plt.subplots(figsize=(13, 1.8 + 1.05 * len(lanes)), dpi=110)
    for row, ln in enumerate(lanes):
        y = len(lanes) - 1 - row  # first stage on top
        bubbles = _clip(ln.bubbles, start_ns, end_ns)
        if ln.compute is not None:
            compute = _clip(ln.compute, start_ns, end_ns)
        else:  # the agent only knows bubbles: the stage trained in between
            first = min((a for a, _ in bubbles), default=start_ns)
            last = max((b for _, b in bubbles), default=end_ns)
            compute = _complement(bubbles, first, last)
        ax.broken_barh([((a - start_ns) / ms, (b - a) / ms) for a, b in compute], (y - 0.4, 0.8), color=_COMPUTE)
        ax.broken_barh([((a - start_ns) / ms, (b - a) / ms) for a, b in bubbles], (y - 0.4, 0.8), color=_BUBBLE)
        windows = _clip(ln.windows, start_ns, end_ns)
        ax.broken_barh([((a - start_ns) / ms, (b - a) / ms) for a, b in windows], (y - 0.4, 0.07), color=_WINDOW)
        harvested = 0
        for name, spans in ln.steps.items():
            clipped = _clip(spans, start_ns, end_ns)
            if not clipped:
                continue
            harvested += _busy_ns(clipped)
            # A hairline gap between consecutive steps keeps short steps countable.
            bars = [((a - start_ns) / ms, max((b - a) / ms * 0.97, 0.05)) for a, b in clipped]
            ax.broken_barh(bars, (y - 0.28, 0.56), color=colors[name])
        idle = _busy_ns(bubbles)
        note = f"idle {idle / ms:.0f} ms"
        if idle:
            note += f"\nside tasks {harvested / ms:.0f} ms ({harvested / idle:.0%})"
        ax.text(1.005, y, note, transform=ax.get_yaxis_transform(), va="center", fontsize=8)
    for at, text in marks:
        if start_ns <= at <= end_ns:
            x = (at - start_ns) / ms
            ax.axvline(x, color="black", linewidth=0.8, linestyle=":")
            ax.text(x, len(lanes) - 0.45, f" {text}", fontsize=8, va="bottom")
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([ln.label for ln in reversed(lanes)])
    ax.set_ylim(-0.6, len(lanes) - 0.2)
    ax.set_xlim(0, (end_ns - start_ns) / ms)
    ax.set_xlabel("time (ms)")
    ax.set_title(title, fontsize=11)
    from matplotlib.patches import Patch

    handles = [
        Patch(color=_COMPUTE, label="training compute"),
        Patch(color=_BUBBLE, label="bubble: stage idle, waiting for a neighbour"),
        Patch(color=_WINDOW, label="window granted (a task starts a step only if it fits)"),
        *(Patch(color=colors[n], label=f"side-task step: {n}") for n in tasks),
    ]
    legend_in = 0.45 * ((len(handles) + 3) // 4)
    fig.legend(handles=handles, loc="lower center", ncol=min(4, len(handles)), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, legend_in / fig.get_figheight(), 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailableError(
            "drawing a timeline needs matplotlib: pip install matplotlib (or pip install 'freeride[plots]')"
        ) from None
    return plt
