"""Prometheus `/metrics` for one agent: a collector that reads the agent's state at scrape time.

Nothing is added to the bubble path: counters come from the ledger the scheduler keeps anyway,
the bubble-length histogram from bucket counts the scheduler keeps (freeride.agent.control.histogram).
A scrape asks the agent's loop for one consistent view (Agent.metrics: domain objects, copied in
microseconds of loop time) and renders it in prometheus-client's HTTP thread, so rendering never
blocks the loop; one small function per concern (the agent, its trainers, the ledger, the bubbles,
memory, tasks, the state disk) makes its typed families. No protobuf here.

Labels follow dcgm-exporter: `gpu` (index) and `UUID` on every series, plus `task` (id) and
`task_name` on per-task series, so dashboards can join freeride's series with DCGM's. Per-trainer
series add `rank`, `stage` and `path` (shm: the same-host ring, grpc: the stream); they count
from 0 for each stream, so a trainer that reconnects starts them again (Prometheus sees a reset).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from freeride.agent.config import ConfigError
from freeride.agent.domain.events import TaskView
from freeride.agent.domain.model import TaskState
from freeride.agent.domain.trainers import GRPC, SHM, TrainerStream
from freeride.agent.domain.views import GpuMemory, GpuStats
from freeride.agent.engine.front import Agent, MetricsView
from freeride.core import disk
from freeride.core.text import printable
from freeride.core.version import __version__

log = logging.getLogger("freeride.agent")

_SNAPSHOT_TIMEOUT_S = 5.0
_PATHS = (SHM, GRPC)  # the roads a trainer's edges take
_STATES = [s.value for s in TaskState]
_GPU = ["gpu", "UUID"]  # on every series but the build's
_TASK = [*_GPU, "task", "task_name"]


def families(view: MetricsView, usage: disk.Usage | None = None) -> Iterator[Metric]:
    """Every freeride_* metric family for one view (and the state disk's `usage`, when it could be read)."""
    g = view.stats.gpu
    gl = [str(g.gpu), g.memory.device.uuid if g.memory.device is not None else ""]
    yield from _agent(view, gl)
    yield from _trainers(g.trainer_streams, gl)
    yield from _ledger(view, gl)
    yield from _bubbles(view, gl)
    yield from _memory(g, gl)
    yield from _tasks(view, gl)
    if usage is not None:
        yield from _disk(usage, view.disk_warn_percent, gl)


def _counter(name: str, doc: str, gl: list[str], value: float) -> CounterMetricFamily:
    m = CounterMetricFamily(name, doc, labels=_GPU)
    m.add_metric(gl, value)
    return m


def _gauge(name: str, doc: str, gl: list[str], value: float) -> GaugeMetricFamily:
    m = GaugeMetricFamily(name, doc, labels=_GPU)
    m.add_metric(gl, value)
    return m


def _agent(view: MetricsView, gl: list[str]) -> Iterator[Metric]:
    """The agent itself: its version and when it started."""
    info = GaugeMetricFamily("freeride_build_info", "Always 1; the agent's version.", labels=["version"])
    info.add_metric([__version__], 1)
    yield info
    yield _gauge("freeride_agent_start_time_seconds", "Unix time the agent started.", gl, view.start_time_unix_s)


def _trainers(streams: Sequence[TrainerStream], gl: list[str]) -> Iterator[Metric]:
    """The trainer streams open now: how many on each road, and each rank's edge counters."""
    open_now = GaugeMetricFamily("freeride_trainer_streams", "Trainer bubble streams connected now, by the road "
                                 "their edges take (shm: the same-host ring; grpc: the stream).",
                                 labels=[*_GPU, "path"])
    per_path = dict.fromkeys(_PATHS, 0)  # both series always: dashboards keep stable series
    for ts in streams:
        per_path[ts.path] = per_path.get(ts.path, 0) + 1
    for path, n in per_path.items():
        open_now.add_metric([*gl, path], n)
    yield open_now
    labels = [*_GPU, "rank", "stage", "path"]
    edges = CounterMetricFamily("freeride_trainer_edges", "Bubble edges taken from the trainer (ring or stream).",
                                labels=labels)
    rejected = CounterMetricFamily("freeride_trainer_edges_rejected", "The trainer's bubble edges refused (out of "
                                   "bounds, torn or scribbled ring records).", labels=labels)
    dropped = CounterMetricFamily("freeride_trainer_edges_dropped", "Bubble edges the trainer dropped because its "
                                  "ring was full.", labels=labels)
    by_labels: dict[tuple[str, str, str], list[int]] = {}  # a rank reconnecting may briefly hold two streams
    for ts in streams:
        sums = by_labels.setdefault((str(ts.rank), str(ts.stage), ts.path), [0, 0, 0])
        sums[0] += ts.edges
        sums[1] += ts.rejected
        sums[2] += ts.dropped
    for key, (n_edges, n_rejected, n_dropped) in sorted(by_labels.items()):
        edges.add_metric([*gl, *key], n_edges)
        rejected.add_metric([*gl, *key], n_rejected)
        dropped.add_metric([*gl, *key], n_dropped)
    yield from (edges, rejected, dropped)


def _ledger(view: MetricsView, gl: list[str]) -> Iterator[Metric]:
    """The GPU's harvest ledger and the agent's event counters."""
    g = view.stats.gpu
    yield _counter("freeride_bubbles", "Bubbles seen (START..END pairs of harvestable kinds).", gl, g.bubbles)
    yield _counter("freeride_bubble_seconds", "Idle time seen in bubbles.", gl, g.bubble_ns / 1e9)
    yield _counter("freeride_bubble_refused_seconds", "Bubble time trainers claimed and the agent did not count: "
                   "more than had passed since the rank's first bubble (a wrong or forged weight).", gl,
                   view.bubble_refused_ns / 1e9)
    yield _counter("freeride_harvested_seconds", "Bubble time spent in side-task steps that ended in time.", gl,
                   g.harvested_ns / 1e9)
    yield _counter("freeride_overrun_seconds", "Side-task step time past the end of a bubble.", gl, g.overrun_ns / 1e9)
    yield _counter("freeride_overrun_steps", "Side-task steps that ended after their bubble.", gl, g.overrun_steps)
    yield _counter("freeride_training_seconds", "Time a trainer stream was open: the training the side tasks ran "
                   "beside, the time a training slowdown applies to.", gl, g.training_ns / 1e9)
    yield _counter("freeride_steps", "Side-task steps run in bubbles.", gl, g.steps)
    yield _counter("freeride_windows", "Bubble windows granted and accounted.", gl, g.windows)
    yield _counter("freeride_bubble_events", "Bubble edges received from trainers.", gl, g.events)
    yield _counter("freeride_bubble_events_rejected", "Bubble edges refused (unknown edge, time far from now, "
                   "negative values).", gl, g.rejected_events)
    yield _counter("freeride_watch_events_dropped", "Live-view events dropped for slow watchers.", gl,
                   g.dropped_events)


class QuantileSummary(Metric):
    """A summary of quantile samples alone, over the recent values the agent computes them from: no _sum and
    _count, which are optional in a summary (the agent keeps the last values only, not a total since it
    started). A gauge may not carry a `quantile` label: promtool check metrics fails the scrape."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str]) -> None:
        super().__init__(name, documentation, "summary")
        self._labels = list(labels)

    def add_quantile(self, values: Sequence[str], quantile: str, value: float) -> None:
        self.add_sample(self.name, {**dict(zip(self._labels, values, strict=True)), "quantile": quantile}, value)


def _bubbles(view: MetricsView, gl: list[str]) -> Iterator[Metric]:
    """Bubble lengths since the agent started; how far off its predictions are and how late edges come."""
    g, lengths = view.stats.gpu, view.bubble_lengths
    hist = HistogramMetricFamily(
        "freeride_bubble_duration_seconds", "Length of bubbles seen since the agent started.", labels=_GPU
    )
    hist.add_metric(gl, [(_le(b), c) for b, c in lengths.cumulative()], lengths.sum_ns / 1e9)
    yield hist
    err = QuantileSummary("freeride_bubble_prediction_error_ratio",
                          "|predicted - actual| / actual bubble length over recent bubbles.", _GPU)
    err.add_quantile(gl, "0.5", g.prediction_error_p50)
    yield err
    delay = QuantileSummary("freeride_bubble_event_delay_seconds",
                            "How late bubble edges reach the agent, over recent edges.", _GPU)
    for q, ns in (("0.5", g.event_delay_ns_p50), ("0.99", g.event_delay_ns_p99)):
        delay.add_quantile(gl, q, ns / 1e9)
    yield delay


def _memory(g: GpuStats, gl: list[str]) -> Iterator[Metric]:
    """Device memory and who holds it (in CPU mode, with no device, none of it); the trainer's free-memory hint."""
    m: GpuMemory = g.memory
    d = m.device
    if d is not None and d.total_bytes:
        for nbytes, name, doc in (
            (d.used_bytes, "freeride_gpu_memory_used_bytes", "Device memory in use."),
            (d.free_bytes, "freeride_gpu_memory_free_bytes", "Device memory free."),
            (d.total_bytes, "freeride_gpu_memory_total_bytes", "Device memory in total."),
            (d.others_used_bytes, "freeride_gpu_memory_others_used_bytes",
             "Device memory held by processes that are not side tasks: the trainer's share."),
            (m.side_tasks_used_bytes, "freeride_gpu_memory_side_tasks_used_bytes",
             "Device memory the side tasks hold."),
            (m.side_tasks_reserved_bytes, "freeride_gpu_memory_side_tasks_reserved_bytes",
             "Sum of the memory caps of admitted side tasks."),
        ):
            yield _gauge(name, doc, gl, nbytes)
    if g.trainer_free_memory_bytes > 0:
        yield _gauge("freeride_trainer_free_memory_bytes", "Memory the trainer last said it leaves free.", gl,
                     g.trainer_free_memory_bytes)


def _tasks(view: MetricsView, gl: list[str]) -> Iterator[Metric]:
    """The tasks by state, then each task's series (labelled with its id and name)."""
    tasks = view.stats.tasks
    by_state = GaugeMetricFamily("freeride_tasks", "Tasks known to the agent, by state.", labels=[*_GPU, "state"])
    per_state = dict.fromkeys(_STATES, 0)
    for t in tasks:
        per_state[_shown_state(t)] += 1
    for state, n in per_state.items():
        by_state.add_metric([*gl, state], n)
    yield by_state

    yield from _task_series(view, gl)


def _task_series(view: MetricsView, gl: list[str]) -> Iterator[Metric]:
    """Each task's state, harvest and memory."""
    def counter(name: str, doc: str) -> CounterMetricFamily:
        return CounterMetricFamily(name, doc, labels=_TASK)

    def gauge(name: str, doc: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=_TASK)

    state = GaugeMetricFamily("freeride_task_state", "1 for the task's current state, 0 for the others.",
                              labels=[*_TASK, "state"])
    steps = counter("freeride_task_steps", "Steps the task ran in bubbles.")
    harvested = counter("freeride_task_harvested_seconds", "Bubble time the task's steps used, ended in time.")
    overrun_s = counter("freeride_task_overrun_seconds", "The task's step time past bubble ends.")
    overrun_n = counter("freeride_task_overrun_steps", "The task's steps that ended after their bubble.")
    windows = counter("freeride_task_windows", "Windows the task was granted.")
    bubbles = counter("freeride_task_bubbles", "Bubbles in which the task held a window.")
    bubble_s = counter("freeride_task_bubble_seconds", "Length of the bubbles in which the task held a window (what "
                       "it could have used).")
    killed = counter("freeride_task_killed_steps", "The task's steps killed for hanging.")
    restarts = counter("freeride_task_restarts", "Crash restarts of the task's worker.")
    step = gauge("freeride_task_step_seconds", "The task's estimated step time (p95).")
    mem = gauge("freeride_task_memory_bytes", "Memory the task's worker holds now.")
    peak = gauge("freeride_task_memory_peak_bytes", "Most memory the task's worker held.")
    cap = gauge("freeride_task_memory_limit_bytes", "The task's memory cap (0: none).")
    for t in view.stats.tasks:
        rec, c = t.record, t.record.counters
        tl = [*gl, rec.id, printable(rec.spec.name)]  # the submitter's text: no control character reaches a reader
        current = _shown_state(t)
        for s in _STATES:
            state.add_metric([*tl, s], 1.0 if s == current else 0.0)
        steps.add_metric(tl, c.steps)
        harvested.add_metric(tl, c.harvested_ns / 1e9)
        overrun_s.add_metric(tl, c.overrun_ns / 1e9)
        overrun_n.add_metric(tl, c.overrun_steps)
        windows.add_metric(tl, c.windows)
        killed.add_metric(tl, c.killed_steps)
        restarts.add_metric(tl, rec.restarts)
        step.add_metric(tl, rec.step_estimate_ns / 1e9)
        peak.add_metric(tl, rec.peak_memory_bytes)
        cap.add_metric(tl, rec.spec.mem_limit_bytes)
        bubbles.add_metric(tl, c.bubbles)
        bubble_s.add_metric(tl, c.bubble_ns / 1e9)
        if rec.id in view.memory_bytes:
            mem.add_metric(tl, view.memory_bytes[rec.id])
    yield from (state, steps, harvested, overrun_s, overrun_n, windows, bubbles, bubble_s, killed, restarts, step,
                mem, peak, cap)


def _shown_state(t: TaskView) -> str:
    """What callers see: READY while it holds a window reads RUNNING (as in convert.task_to_pb)."""
    return TaskState.RUNNING.value if t.running and t.record.state is TaskState.READY else t.record.state.value


def _disk(u: disk.Usage, warn_percent: int, gl: list[str]) -> Iterator[Metric]:
    """The state directory's file system, and whether it is past --disk-warn-percent."""
    yield _gauge("freeride_state_disk_size_bytes", "Size of the state directory's file system.", gl, u.total_bytes)
    yield _gauge("freeride_state_disk_free_bytes", "Space the agent and its workers may still write on the state "
                 "directory's file system.", gl, u.free_bytes)
    yield _gauge("freeride_state_disk_used_ratio", "Part of the state directory's file system no unprivileged "
                 "writer can use any more (0..1).", gl, u.used_ratio)
    yield _gauge("freeride_state_disk_warning", "1 while the state directory's file system is at or above "
                 "--disk-warn-percent full: free space before tasks must wait for it.", gl,
                 1.0 if u.used_ratio * 100 >= warn_percent else 0.0)


def _le(bound_s: float) -> str:
    return "+Inf" if bound_s == float("inf") else repr(bound_s)


class AgentCollector(Collector):
    """Asks the agent's loop for a snapshot on each scrape (called from the HTTP thread)."""

    def __init__(self, agent: Agent, loop: asyncio.AbstractEventLoop) -> None:
        self._agent = agent
        self._loop = loop

    def collect(self) -> Iterator[Metric]:
        try:
            view = asyncio.run_coroutine_threadsafe(self._agent.metrics(), self._loop).result(_SNAPSHOT_TIMEOUT_S)
        except Exception as exc:  # loop stopping or stalled: serve the process metrics alone
            log.warning("metrics scrape without agent state: %s", exc or type(exc).__name__)
            return iter(())
        usage = None
        try:  # here, not on the loop: a statvfs of a hung file system must not stall the bubbles
            usage = disk.usage(self._agent.config.state_dir)
        except OSError as exc:
            log.warning("metrics scrape without the state disk's space: %s", exc)
        return families(view, usage)


class MetricsServer:
    """prometheus-client's HTTP server in a daemon thread; off the agent's loop entirely."""

    def __init__(self, agent: Agent, loop: asyncio.AbstractEventLoop) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        self.registry.register(AgentCollector(agent, loop))
        self._server: Any = None
        self._thread: Any = None

    def start(self, addr: str, port: int) -> MetricsServer:
        try:
            started = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}") from None
        if isinstance(started, tuple):  # (server, thread); older prometheus-client returned nothing
            self._server, self._thread = started
        log.info("metrics on http://%s:%d/metrics", addr, port)
        return self

    def stop(self) -> None:
        """Stop serving (again: nothing)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None
