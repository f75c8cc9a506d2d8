"""Prometheus /metrics and JSON logs of a real agent, after real bubbles and a real task.

What a scrape shows is what `freeride stats` shows: the same ledger read at scrape time.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from support.agents import FAST, bubbles, drive, free_port
from support.prometheus import need_prometheus

from freeride.agent.control.histogram import Histogram
from freeride.agent.domain.events import TaskView
from freeride.agent.domain.model import TaskRecord, TaskSpec, TaskState
from freeride.agent.domain.trainers import TrainerStream
from freeride.agent.domain.views import GpuStats, Stats
from freeride.agent.edge.metrics import families
from freeride.agent.engine.front import MetricsView
from freeride.tooling.harness import AgentProcess, WindowCollector, wait_for_task, wait_for_trainers
from freeride.trainer.reporter import BubbleReporter
from freeride.v1 import tasks_pb2

READY = tasks_pb2.TASK_STATE_READY


def scrape(port: int) -> dict[str, list[Sample]]:
    """Samples by name, parsed the way Prometheus parses them."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    out: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def value(samples: dict[str, list[Sample]], name: str, **labels: str) -> float:
    found = [s.value for s in samples[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, f"{name}{labels}: {found}"
    return found[0]


@pytest.fixture
def metrics_agent(tmp_path: Path) -> Iterator[tuple[AgentProcess, int]]:
    port = free_port()
    proc = AgentProcess(
        state_dir=tmp_path / "state", extra_args=[*FAST, "--metrics-port", str(port), "--log-format", "json"]
    ).start()
    try:
        yield proc, port
    finally:
        assert proc.stop() == 0, proc.log_tail()


def test_a_scrape_shows_the_ledger_that_stats_shows_with_dcgm_style_labels(metrics_agent):
    agent, port = metrics_agent
    with agent.client() as client:
        info = client.submit(tasks_pb2.TaskSpec(ref="freeride.tooling.tasks:SleepTask", args={"step_ms": "1"},
                                                name="sleeper"))
        wait_for_task(client, info.id, [READY])
        trace = bubbles(6, [8.0, 30.0])
        with WindowCollector(client) as windows:
            drive(agent, trace)
            windows.wait_for_all(client)  # quiet: every window the agent granted is accounted
        before = client.stats()  # the watchdog samples memory every 0.25 s: bracket the scrape for its peak
        m = scrape(port)
        stats = client.stats()
        spans = client.timeline().bubbles
    g, task = stats.gpu, stats.tasks[0]
    assert task.state == READY
    gpu = {"gpu": "0"}
    assert all(s.labels["UUID"] == "" for s in m["freeride_bubbles_total"])  # CPU mode: no device UUID
    assert value(m, "freeride_bubbles_total", **gpu) == g.bubbles == 12
    assert value(m, "freeride_bubble_seconds_total", **gpu) == g.bubble_s
    assert value(m, "freeride_harvested_seconds_total", **gpu) == g.harvested_s > 0
    assert value(m, "freeride_steps_total", **gpu) == g.steps
    assert value(m, "freeride_overrun_steps_total", **gpu) == g.overrun_steps
    assert value(m, "freeride_overrun_seconds_total", **gpu) == g.overrun_s
    assert value(m, "freeride_bubble_events_total", **gpu) == g.events == 24

    # The histogram holds every bubble, each in the bucket of its length as the agent measured it (the 8 ms ones
    # by 20 ms and the 30 ms ones by 50 ms, unless a loaded runner stretched or cut a bubble: hence the timeline).
    lengths_ns = [b.end_ns - b.start_ns for b in spans]
    assert len(lengths_ns) == g.bubbles
    assert value(m, "freeride_bubble_duration_seconds_count", **gpu) == g.bubbles
    assert value(m, "freeride_bubble_duration_seconds_sum", **gpu) == pytest.approx(g.bubble_s, abs=1e-9)
    for le_ns in (1_000_000, 20_000_000, 50_000_000):
        expected = sum(n <= le_ns for n in lengths_ns)
        assert value(m, "freeride_bubble_duration_seconds_bucket", le=repr(le_ns / 1e9), **gpu) == expected, le_ns
    assert value(m, "freeride_bubble_duration_seconds_bucket", le="+Inf", **gpu) == g.bubbles

    per_task = {**gpu, "task": task.id, "task_name": "sleeper"}
    assert value(m, "freeride_task_harvested_seconds_total", **per_task) == task.counters.harvested_s > 0
    assert value(m, "freeride_task_steps_total", **per_task) == task.counters.steps > 0
    assert value(m, "freeride_task_windows_total", **per_task) == task.counters.windows
    # The one task held a window in each granted bubble: it saw those bubbles, a part of the GPU's.
    assert value(m, "freeride_task_bubbles_total", **per_task) == task.counters.windows > 0
    task_bubble_s = value(m, "freeride_task_bubble_seconds_total", **per_task)
    assert task.counters.harvested_s < task_bubble_s < g.bubble_s
    assert value(m, "freeride_task_overrun_steps_total", **per_task) == task.counters.overrun_steps
    assert value(m, "freeride_task_state", state="READY", **per_task) == 1
    assert value(m, "freeride_task_state", state="FAILED", **per_task) == 0
    assert value(m, "freeride_tasks", state="READY", **gpu) == 1
    assert value(m, "freeride_task_memory_bytes", **per_task) > 0  # the worker's resident memory, sampled
    peak = value(m, "freeride_task_memory_peak_bytes", **per_task)  # only grows: between the two reads around it
    assert 0 < before.tasks[0].counters.peak_memory_bytes <= peak <= task.counters.peak_memory_bytes
    assert "process_resident_memory_bytes" in m  # the agent's own process


def test_json_logs_have_one_parseable_line_per_lifecycle_event(metrics_agent):
    agent, _ = metrics_agent
    with agent.client() as client:
        info = client.submit(tasks_pb2.TaskSpec(ref="freeride.tooling.tasks:SleepTask", args={"step_ms": "1"}))
        wait_for_task(client, info.id, [READY])
        drive(agent, bubbles(1, [5.0]))
        client.cancel(info.id)
        wait_for_task(client, info.id, [tasks_pb2.TASK_STATE_CANCELLED])
    assert agent.stop() == 0
    records = [json.loads(line) for line in agent.log_path.read_text().splitlines()]
    assert all({"ts", "level", "logger", "msg"} <= r.keys() and r["gpu"] == 0 for r in records)
    messages = [r["msg"] for r in records]
    for expected in ("serving on unix:", "metrics on http://127.0.0.1:", f"task {info.id} submitted",
                     f"task {info.id} SUBMITTED -> STARTING", f"task {info.id} STARTING -> READY",
                     ") connected", ") disconnected", f"task {info.id} READY -> CANCELLED",
                     "SIGTERM: shutting down", "agent stopped"):
        assert sum(expected in msg for msg in messages) == 1, f"{expected!r} in {messages}"
    assert any(m.startswith("trainer rank 0 (pid ") and m.endswith(") connected") for m in messages), messages


STREAM_SERIES = ("freeride_trainer_edges_total", "freeride_trainer_edges_rejected_total",
                 "freeride_trainer_edges_dropped_total")


def stream_series(m: dict[str, list[Sample]]) -> dict[str, dict[tuple[str, str, str], float]]:
    """The per-trainer counters, keyed by (rank, stage, path)."""
    return {name: {(s.labels["rank"], s.labels["stage"], s.labels["path"]): s.value for s in m.get(name, [])}
            for name in STREAM_SERIES}


def test_a_scrape_says_which_road_each_trainers_edges_take(metrics_agent):
    agent, port = metrics_agent
    gpu = {"gpu": "0"}
    assert value(scrape(port), "freeride_trainer_streams", path="shm", **gpu) == 0  # both series, before any trainer
    assert value(scrape(port), "freeride_trainer_streams", path="grpc", **gpu) == 0
    ring = BubbleReporter(agent.target, rank=0)  # local: the agent's shared-memory ring
    kept = BubbleReporter(agent.target, rank=1, stage=1, path="grpc")
    try:
        assert ring.wait_connected(10) and kept.wait_connected(10), agent.log_tail()
        assert (ring.path, kept.path) == ("shm", "grpc")
        with agent.client() as client:
            wait_for_trainers(client, 2)
        m = scrape(port)
    finally:
        ring.close()
        kept.close()
    assert value(m, "freeride_trainer_streams", path="shm", **gpu) == 1
    assert value(m, "freeride_trainer_streams", path="grpc", **gpu) == 1
    assert all(s.labels["UUID"] == "" for s in m["freeride_trainer_edges_total"])  # the gpu labels, as elsewhere
    expected = {("0", "0", "shm"): 0.0, ("1", "1", "grpc"): 0.0}  # connected, no bubble reported yet
    assert stream_series(m) == dict.fromkeys(STREAM_SERIES, expected)


def test_an_agent_started_with_bubble_path_grpc_keeps_a_local_trainer_on_its_stream(tmp_path):
    port = free_port()
    with AgentProcess(state_dir=tmp_path / "state",
                      extra_args=[*FAST, "--metrics-port", str(port), "--bubble-path", "grpc"]) as agent:
        reporter = BubbleReporter(agent.target)  # the default road: the agent decides
        try:
            assert reporter.wait_connected(10), agent.log_tail()
            assert reporter.path == "grpc"
            with agent.client() as client:
                wait_for_trainers(client, 1)
            m = scrape(port)
        finally:
            reporter.close()
    assert value(m, "freeride_trainer_streams", path="shm", gpu="0") == 0
    assert value(m, "freeride_trainer_streams", path="grpc", gpu="0") == 1
    assert set(stream_series(m)["freeride_trainer_edges_total"]) == {("0", "0", "grpc")}


def test_streams_of_one_rank_on_one_road_are_one_series_and_counted_together():
    """A rank that reconnects may hold two streams for a moment: Prometheus must not see one label set twice."""
    streams = [
        TrainerStream(peer="unix:", rank=0, path="shm", edges=10, rejected=1, dropped=2),
        TrainerStream(peer="unix:", rank=0, path="shm", edges=5, rejected=0, dropped=1),
        TrainerStream(peer="ipv4:10.0.0.2:4000", rank=1, stage=1, path="grpc", edges=7),
    ]
    stats = Stats(GpuStats(trainers=3, trainer_streams=tuple(streams)), [])
    by_name = {f.name: f for f in families(MetricsView(stats, Histogram()))}
    assert {s.labels["path"]: s.value for s in by_name["freeride_trainer_streams"].samples} == {"shm": 2, "grpc": 1}
    samples = {(s.name, s.labels["rank"], s.labels["path"]): s.value
               for name in ("freeride_trainer_edges", "freeride_trainer_edges_rejected",
                            "freeride_trainer_edges_dropped")
               for s in by_name[name].samples}
    assert samples == {
        ("freeride_trainer_edges_total", "0", "shm"): 15, ("freeride_trainer_edges_total", "1", "grpc"): 7,
        ("freeride_trainer_edges_rejected_total", "0", "shm"): 1,
        ("freeride_trainer_edges_rejected_total", "1", "grpc"): 0,
        ("freeride_trainer_edges_dropped_total", "0", "shm"): 3,
        ("freeride_trainer_edges_dropped_total", "1", "grpc"): 0,
    }


def test_training_time_counts_while_a_trainer_is_connected_and_is_kept_in_the_ledger(tmp_path):
    """The time a slowdown applies to: a stream open is training; none open is not; a restart keeps it."""
    port = free_port()
    state = tmp_path / "state"
    with AgentProcess(state_dir=state, extra_args=[*FAST, "--metrics-port", str(port)]) as agent, \
            agent.client() as client:
        assert client.stats().gpu.training_s == 0  # no trainer yet
        before_ns = time.monotonic_ns()
        reporter = BubbleReporter(agent.target)
        try:
            assert reporter.wait_connected(10), agent.log_tail()
            wait_for_trainers(client, 1)
            connected_ns = time.monotonic_ns()
            drive(agent, bubbles(3, [5.0]), rank=1)  # a second rank meanwhile: the same wall time, once
            during = client.stats().gpu.training_s
            closing_ns = time.monotonic_ns()
        finally:
            reporter.close()
        wait_for_trainers(client, 0)
        after_ns = time.monotonic_ns()
        closed = client.stats().gpu.training_s
        assert (closing_ns - connected_ns) / 1e9 <= closed <= (after_ns - before_ns) / 1e9
        assert during <= closed
        assert client.stats().gpu.training_s == closed  # nobody connected: the clock stands still
        assert value(scrape(port), "freeride_training_seconds_total", gpu="0") == closed
    with AgentProcess(state_dir=state, extra_args=FAST) as again, again.client() as client:
        assert client.stats().gpu.training_s == pytest.approx(closed, abs=1e-9)


def render(view: MetricsView) -> str:
    """The text a scrape of `view` returns."""
    registry = CollectorRegistry()
    registry.register(_Fixed(view))
    return generate_latest(registry).decode()


class _Fixed(Collector):
    def __init__(self, view: MetricsView) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        return families(self.view)


def test_the_quantile_families_are_summaries_and_pass_promtool():
    """A `quantile` label belongs to a summary: on a gauge, promtool check metrics fails the scrape (exit 3)."""
    need_prometheus()
    stats = Stats(GpuStats(prediction_error_p50=0.1, event_delay_ns_p50=20_000, event_delay_ns_p99=90_000), [])
    text = render(MetricsView(stats, Histogram()))
    done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    types = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert types["freeride_bubble_event_delay_seconds"] == types["freeride_bubble_prediction_error_ratio"] == "summary"
    m = {f.name: {(s.name, s.labels["quantile"]): s.value for s in f.samples}
         for f in text_string_to_metric_families(text) if f.type == "summary"}
    assert m["freeride_bubble_event_delay_seconds"] == {("freeride_bubble_event_delay_seconds", "0.5"): 2e-05,
                                                        ("freeride_bubble_event_delay_seconds", "0.99"): 9e-05}
    assert m["freeride_bubble_prediction_error_ratio"] == {("freeride_bubble_prediction_error_ratio", "0.5"): 0.1}


def test_control_characters_in_a_task_name_are_escaped_in_its_labels():
    """A task's name is whoever submitted it's text: an ESC in a label would recolour the terminal that reads
    a scrape (curl, promtool's output), a NUL or a line separator confuse the tools that read it."""
    task = TaskRecord("1", TaskSpec(name="evil\x1b[31mname\u2028\x00", ref="m:T"), TaskState.READY)
    text = render(MetricsView(Stats(GpuStats(), [TaskView(task, False, 0, 0)]), Histogram()))
    names = {s.labels["task_name"] for f in text_string_to_metric_families(text) for s in f.samples
             if "task_name" in s.labels}
    assert names == {"evil\\x1b[31mname\\u2028\\x00"}
    assert not any(c in text for c in "\x1b\x00\u2028")
