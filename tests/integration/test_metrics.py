"""Prometheus /metrics and JSON logs of a real agent, after real bubbles and a real task.

What a scrape shows is what `freeride stats` shows: the same ledger read at scrape time.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FAST, bubbles, drive, free_port
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from freeride.tooling.harness import AgentProcess, WindowCollector, wait_for_task
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
                     "trainer connected", "trainer disconnected", f"task {info.id} READY -> CANCELLED",
                     "SIGTERM: shutting down", "agent stopped"):
        assert sum(expected in msg for msg in messages) == 1, f"{expected!r} in {messages}"
