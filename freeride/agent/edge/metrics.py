"""Prometheus `/metrics` for one agent: a collector that reads the agent's state at scrape time.

Nothing is added to the bubble path: counters come from the ledger the scheduler keeps anyway,
the bubble-length histogram from bucket counts the scheduler keeps (freeride.agent.control.histogram).
A scrape asks the agent's loop for one consistent snapshot (microseconds of loop time) and
renders it in prometheus-client's HTTP thread, so rendering never blocks the loop.

Labels follow dcgm-exporter: `gpu` (index) and `UUID` on every series, plus `task` (id) and
`task_name` on per-task series, so dashboards can join freeride's series with DCGM's. Per-trainer
series add `rank`, `stage` and `path` (shm: the same-host ring, grpc: the stream); they count
from 0 for each stream, so a trainer that reconnects starts them again (Prometheus sees a reset).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from freeride.agent.config import ConfigError
from freeride.agent.control.histogram import Histogram
from freeride.agent.domain.trainers import GRPC, SHM
from freeride.agent.edge.convert import stats_to_pb
from freeride.core import disk
from freeride.core.text import printable
from freeride.core.version import __version__
from freeride.v1 import tasks_pb2

if TYPE_CHECKING:
    from freeride.agent.engine.core import Agent

log = logging.getLogger("freeride.agent")

_SNAPSHOT_TIMEOUT_S = 5.0
_PATHS = (SHM, GRPC)  # the roads a trainer's edges take
_STATES = [n.removeprefix("TASK_STATE_") for n, _ in tasks_pb2.TaskState.items() if n != "TASK_STATE_UNSPECIFIED"]


@dataclass
class Snapshot:
    """What one scrape shows, copied on the agent's loop."""

    stats: tasks_pb2.StatsResponse
    bubble_lengths: Histogram
    memory_bytes: dict[str, int] = field(default_factory=dict)  # current, per task with a live worker
    task_bubbles: dict[str, tuple[int, int]] = field(default_factory=dict)  # (bubbles, ns) it had a share of
    start_time_unix_s: float = 0.0
    disk: disk.Usage | None = None  # the state directory's file system (read in the scrape's thread, not the loop)
    disk_warn_percent: int = 90
    bubble_refused_ns: int = 0  # bubble time trainers claimed past the time that had passed (control.idle)


async def take_snapshot(agent: Agent) -> Snapshot:
    """Run on the agent's loop: the copy is consistent and the loop's objects are never read from a thread."""
    stats = stats_to_pb(await agent.stats())
    return Snapshot(
        stats=stats,
        bubble_lengths=agent.scheduler.bubble_lengths.copy(),
        memory_bytes={i: rt.memory_bytes for i, rt in agent.table.live.items()
                      if rt.worker is not None and rt.memory_bytes is not None},
        task_bubbles={i: (r.counters.bubbles, r.counters.bubble_ns) for i, r in agent.table.records.items()},
        start_time_unix_s=time.time() - stats.gpu.uptime_s,
        disk_warn_percent=agent.config.disk_warn_percent,
        bubble_refused_ns=agent.scheduler.idle.cut_ns,
    )


def families(snap: Snapshot) -> Iterator[Metric]:
    """Every freeride_* metric family for one snapshot."""
    g = snap.stats.gpu
    uuid = g.memory.uuid
    gl = [str(g.gpu), uuid]
    gpu_labels = ["gpu", "UUID"]
    task_labels = [*gpu_labels, "task", "task_name"]

    families_: list[Metric] = []

    def add_counter(name: str, doc: str, value: float) -> None:
        m = CounterMetricFamily(name, doc, labels=gpu_labels)
        m.add_metric(gl, value)
        families_.append(m)

    def add_gauge(name: str, doc: str, value: float, labels: list[str] | None = None,
                  values: list[str] | None = None) -> None:
        m = GaugeMetricFamily(name, doc, labels=[*gpu_labels, *(labels or [])])
        m.add_metric([*gl, *(values or [])], value)
        families_.append(m)

    info = GaugeMetricFamily("freeride_build_info", "Always 1; the agent's version.", labels=["version"])
    info.add_metric([__version__], 1)
    families_.append(info)
    add_gauge("freeride_agent_start_time_seconds", "Unix time the agent started.", snap.start_time_unix_s)
    streams = GaugeMetricFamily("freeride_trainer_streams", "Trainer bubble streams connected now, by the road "
                                "their edges take (shm: the same-host ring; grpc: the stream).",
                                labels=[*gpu_labels, "path"])
    per_path = dict.fromkeys(_PATHS, 0)  # both series always: dashboards keep stable series
    for ts in g.trainer_streams:
        per_path[ts.path] = per_path.get(ts.path, 0) + 1
    for path, n in per_path.items():
        streams.add_metric([*gl, path], n)
    families_.append(streams)
    stream_labels = [*gpu_labels, "rank", "stage", "path"]
    per_stream = (  # edges, rejected, dropped
        CounterMetricFamily("freeride_trainer_edges", "Bubble edges taken from the trainer (ring or stream).",
                            labels=stream_labels),
        CounterMetricFamily("freeride_trainer_edges_rejected", "The trainer's bubble edges refused (out of bounds, "
                            "torn or scribbled ring records).", labels=stream_labels),
        CounterMetricFamily("freeride_trainer_edges_dropped", "Bubble edges the trainer dropped because its ring "
                            "was full.", labels=stream_labels),
    )
    by_labels: dict[tuple[str, str, str], list[int]] = {}  # a rank reconnecting may briefly hold two streams
    for ts in g.trainer_streams:
        sums = by_labels.setdefault((str(ts.rank), str(ts.stage), ts.path), [0, 0, 0])
        sums[0] += ts.edges
        sums[1] += ts.rejected
        sums[2] += ts.dropped
    for labels, sums in sorted(by_labels.items()):
        for family, n in zip(per_stream, sums, strict=True):
            family.add_metric([*gl, *labels], n)
    families_.extend(per_stream)

    add_counter("freeride_bubbles", "Bubbles seen (START..END pairs of harvestable kinds).", g.bubbles)
    add_counter("freeride_bubble_seconds", "Idle time seen in bubbles.", g.bubble_s)
    add_counter("freeride_bubble_refused_seconds", "Bubble time trainers claimed and the agent did not count: "
                "more than had passed since the rank's first bubble (a wrong or forged weight).",
                snap.bubble_refused_ns / 1e9)
    add_counter("freeride_harvested_seconds", "Bubble time spent in side-task steps that ended in time.", g.harvested_s)
    add_counter("freeride_overrun_seconds", "Side-task step time past the end of a bubble.", g.overrun_s)
    add_counter("freeride_overrun_steps", "Side-task steps that ended after their bubble.", g.overrun_steps)
    add_counter("freeride_training_seconds", "Time a trainer stream was open: the training the side tasks ran "
                "beside, the time a training slowdown applies to.", g.training_s)
    add_counter("freeride_steps", "Side-task steps run in bubbles.", g.steps)
    add_counter("freeride_windows", "Bubble windows granted and accounted.", g.windows)
    add_counter("freeride_bubble_events", "Bubble edges received from trainers.", g.events)
    add_counter("freeride_bubble_events_rejected", "Bubble edges refused (unknown edge, time far from now, "
                "negative values).", g.rejected_events)
    add_counter("freeride_watch_events_dropped", "Live-view events dropped for slow watchers.", g.dropped_events)

    hist = HistogramMetricFamily(
        "freeride_bubble_duration_seconds", "Length of bubbles seen since the agent started.", labels=gpu_labels
    )
    hist.add_metric(gl, [(_le(b), c) for b, c in snap.bubble_lengths.cumulative()], snap.bubble_lengths.sum_ns / 1e9)
    families_.append(hist)

    # Quantiles the agent computes over its recent values: a summary's quantile samples (a gauge may not carry a
    # `quantile` label: promtool check metrics fails the scrape). No _sum and _count: the agent keeps the last
    # values only, not a total since it started, and both are optional in a summary.
    err = Metric("freeride_bubble_prediction_error_ratio",
                 "|predicted - actual| / actual bubble length over recent bubbles.", "summary")
    err.add_sample(err.name, {"gpu": gl[0], "UUID": uuid, "quantile": "0.5"}, g.prediction_error_p50)
    families_.append(err)
    delay = Metric("freeride_bubble_event_delay_seconds", "How late bubble edges reach the agent, over recent edges.",
                   "summary")
    for q, us in (("0.5", g.event_delay_us_p50), ("0.99", g.event_delay_us_p99)):
        delay.add_sample(delay.name, {"gpu": gl[0], "UUID": uuid, "quantile": q}, us / 1e6)
    families_.append(delay)

    m = g.memory
    for nbytes, name, doc in (
        (m.used_bytes, "freeride_gpu_memory_used_bytes", "Device memory in use."),
        (m.free_bytes, "freeride_gpu_memory_free_bytes", "Device memory free."),
        (m.total_bytes, "freeride_gpu_memory_total_bytes", "Device memory in total."),
        (m.others_used_bytes, "freeride_gpu_memory_others_used_bytes",
         "Device memory held by processes that are not side tasks: the trainer's share."),
        (m.side_tasks_used_bytes, "freeride_gpu_memory_side_tasks_used_bytes", "Device memory the side tasks hold."),
        (m.side_tasks_reserved_bytes, "freeride_gpu_memory_side_tasks_reserved_bytes",
         "Sum of the memory caps of admitted side tasks."),
    ):
        if m.total_bytes:  # CPU mode has no device: leave the device series out
            add_gauge(name, doc, nbytes)
    if g.trainer_free_memory_bytes > 0:
        add_gauge("freeride_trainer_free_memory_bytes", "Memory the trainer last said it leaves free.",
                  g.trainer_free_memory_bytes)

    states = GaugeMetricFamily("freeride_tasks", "Tasks known to the agent, by state.", labels=[*gpu_labels, "state"])
    per_state = dict.fromkeys(_STATES, 0)
    for t in snap.stats.tasks:
        per_state[tasks_pb2.TaskState.Name(t.state).removeprefix("TASK_STATE_")] += 1
    for state, n in per_state.items():
        states.add_metric([*gl, state], n)
    families_.append(states)

    per_task: dict[str, Metric] = {
        "state": GaugeMetricFamily("freeride_task_state", "1 for the task's current state, 0 for the others.",
                                   labels=[*task_labels, "state"]),
        "steps": CounterMetricFamily("freeride_task_steps", "Steps the task ran in bubbles.", labels=task_labels),
        "harvested": CounterMetricFamily("freeride_task_harvested_seconds",
                                         "Bubble time the task's steps used, ended in time.", labels=task_labels),
        "overrun_s": CounterMetricFamily("freeride_task_overrun_seconds", "The task's step time past bubble ends.",
                                         labels=task_labels),
        "overrun_n": CounterMetricFamily("freeride_task_overrun_steps", "The task's steps that ended after their "
                                         "bubble.", labels=task_labels),
        "windows": CounterMetricFamily("freeride_task_windows", "Windows the task was granted.", labels=task_labels),
        "bubbles": CounterMetricFamily("freeride_task_bubbles", "Bubbles in which the task held a window.",
                                       labels=task_labels),
        "bubble_s": CounterMetricFamily("freeride_task_bubble_seconds", "Length of the bubbles in which the task "
                                        "held a window (what it could have used).", labels=task_labels),
        "killed": CounterMetricFamily("freeride_task_killed_steps", "The task's steps killed for hanging.",
                                      labels=task_labels),
        "restarts": CounterMetricFamily("freeride_task_restarts", "Crash restarts of the task's worker.",
                                        labels=task_labels),
        "step": GaugeMetricFamily("freeride_task_step_seconds", "The task's estimated step time (p95).",
                                  labels=task_labels),
        "mem": GaugeMetricFamily("freeride_task_memory_bytes", "Memory the task's worker holds now.",
                                 labels=task_labels),
        "peak": GaugeMetricFamily("freeride_task_memory_peak_bytes", "Most memory the task's worker held.",
                                  labels=task_labels),
        "cap": GaugeMetricFamily("freeride_task_memory_limit_bytes", "The task's memory cap (0: none).",
                                 labels=task_labels),
    }
    for t in snap.stats.tasks:
        tl = [*gl, t.id, printable(t.spec.name)]  # the submitter's text: no control character reaches a reader
        current = tasks_pb2.TaskState.Name(t.state).removeprefix("TASK_STATE_")
        for state in _STATES:
            per_task["state"].add_metric([*tl, state], 1.0 if state == current else 0.0)  # type: ignore[attr-defined]
        c = t.counters
        for key, value in (
            ("steps", c.steps), ("harvested", c.harvested_s), ("overrun_s", c.overrun_s),
            ("overrun_n", c.overrun_steps), ("windows", c.windows), ("killed", c.killed_steps),
            ("restarts", t.restarts), ("step", c.step_estimate_s), ("peak", c.peak_memory_bytes),
            ("cap", t.spec.mem_limit_bytes),
        ):
            per_task[key].add_metric(tl, value)  # type: ignore[attr-defined]
        bubbles, bubble_ns = snap.task_bubbles.get(t.id, (0, 0))
        per_task["bubbles"].add_metric(tl, bubbles)  # type: ignore[attr-defined]
        per_task["bubble_s"].add_metric(tl, bubble_ns / 1e9)  # type: ignore[attr-defined]
        if t.id in snap.memory_bytes:
            per_task["mem"].add_metric(tl, snap.memory_bytes[t.id])  # type: ignore[attr-defined]
    families_.extend(per_task.values())
    if snap.disk is not None:
        u = snap.disk
        add_gauge("freeride_state_disk_size_bytes", "Size of the state directory's file system.", u.total_bytes)
        add_gauge("freeride_state_disk_free_bytes", "Space the agent and its workers may still write on the state "
                  "directory's file system.", u.free_bytes)
        add_gauge("freeride_state_disk_used_ratio", "Part of the state directory's file system no unprivileged "
                  "writer can use any more (0..1).", u.used_ratio)
        add_gauge("freeride_state_disk_warning", "1 while the state directory's file system is at or above "
                  "--disk-warn-percent full: free space before tasks must wait for it.",
                  1.0 if u.used_ratio * 100 >= snap.disk_warn_percent else 0.0)
    return iter(families_)


def _le(bound_s: float) -> str:
    return "+Inf" if bound_s == float("inf") else repr(bound_s)


class AgentCollector(Collector):
    """Asks the agent's loop for a snapshot on each scrape (called from the HTTP thread)."""

    def __init__(self, agent: Agent, loop: asyncio.AbstractEventLoop) -> None:
        self._agent = agent
        self._loop = loop

    async def _snapshot(self) -> Snapshot:
        return await take_snapshot(self._agent)

    def collect(self) -> Iterator[Metric]:
        try:
            snap = asyncio.run_coroutine_threadsafe(self._snapshot(), self._loop).result(_SNAPSHOT_TIMEOUT_S)
        except Exception as exc:  # loop stopping or stalled: serve the process metrics alone
            log.warning("metrics scrape without agent state: %s", exc or type(exc).__name__)
            return iter(())
        try:  # here, not on the loop: a statvfs of a hung file system must not stall the bubbles
            snap.disk = disk.usage(self._agent.config.state_dir)
        except OSError as exc:
            log.warning("metrics scrape without the state disk's space: %s", exc)
        return families(snap)


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
