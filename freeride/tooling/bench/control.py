"""`freeride bench control`: cost and latency of the control path, in one run.

A synthetic trainer reports bubbles to a real agent that runs a real worker with tiny steps.
Each bubble gets its own slot and a generous expected length, so its window is closed by the
END edge (not by the prediction): that measures both START -> first step and END -> idle.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import psutil

from freeride.client import AgentClient
from freeride.core.stats import percentile
from freeride.errors import FreerideError
from freeride.tooling.harness import AgentProcess, WindowCollector, grant_latencies_us, sleep_until, wait_for_task
from freeride.trainer.reporter import BubbleReporter
from freeride.v1 import tasks_pb2


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bubbles", type=int, default=2000, help="bubbles to report (2 events each)")
    p.add_argument("--bubble-ms", type=float, default=2.0, help="length of each bubble")
    p.add_argument("--compute-ms", type=float, default=2.0, help="busy time between bubbles")
    p.add_argument("--step-us", type=float, default=50.0, help="the no-op task's step length")
    p.add_argument("--flood", type=int, default=0, metavar="EVENTS",
                   help="afterwards, send this many events as fast as possible and report agent memory")



def _flood(reporter: BubbleReporter, events: int) -> float:
    t0 = time.monotonic()
    for i in range(events // 2):
        if reporter.queued > 8192:  # let the sender catch up rather than drop
            time.sleep(0.001)
        reporter.start(i % 64)
        reporter.end(i % 64)
    return time.monotonic() - t0


def _finish(reporter: BubbleReporter, client: AgentClient, collector: WindowCollector) -> None:
    """Close the trainer stream and wait until the agent has seen every event and accounted every
    window it granted (a loaded machine may make it skip a bubble that arrived too late)."""
    reporter.close()
    try:
        collector.wait_for_all(client, 60.0)
    except TimeoutError as exc:
        raise FreerideError(f"bench control: {exc}; is the machine overloaded?") from None


def run(ns: argparse.Namespace) -> dict[str, Any]:
    with AgentProcess() as agent, agent.client() as client:
        assert agent.proc is not None
        task = client.submit(
            tasks_pb2.TaskSpec(name="noop", ref="freeride.tooling.tasks:NoopTask", args={"step_us": str(ns.step_us)})
        )
        wait_for_task(client, task.id, [tasks_pb2.TASK_STATE_READY])
        collector = WindowCollector(client)
        reporter = BubbleReporter(agent.target)
        if not reporter.wait_connected(10):
            raise FreerideError("bench control: the reporter could not connect to the agent")
        hook_ns: list[int] = []
        bubble_ns = int(ns.bubble_ms * 1e6)
        t = time.monotonic_ns()
        for i in range(ns.bubbles):
            a = time.perf_counter_ns()
            reporter.start(i, expected_duration_ns=4 * bubble_ns)
            b = time.perf_counter_ns()
            t += bubble_ns
            sleep_until(t)
            c = time.perf_counter_ns()
            reporter.end(i)
            d = time.perf_counter_ns()
            hook_ns += [b - a, d - c]
            t += int(ns.compute_ms * 1e6)
            sleep_until(t)
        dropped = reporter.dropped
        _finish(reporter, client, collector)
        granted = len(collector.windows)
        stats = client.stats()
        rss_before = psutil.Process(agent.proc.pid).memory_info().rss
        flood_s = 0.0
        if ns.flood:
            # A second trainer stream: once it has ended, the agent has seen every event of the flood.
            flooder = BubbleReporter(agent.target, rank=1)
            if not flooder.wait_connected(10):
                raise FreerideError("bench control: the flooding reporter could not connect to the agent")
            flood_s = _flood(flooder, ns.flood)
            dropped += flooder.dropped
            _finish(flooder, client, collector)
        flood_stats = client.stats()
        rss_after = psutil.Process(agent.proc.pid).memory_info().rss
        collector.close()
    windows = collector.windows[:granted]
    grants = grant_latencies_us(windows)
    revokes = [
        (w.shares[0].idle_ns - w.bubble_end_ns) / 1e3
        for w in windows
        if w.shares and w.shares[0].idle_ns and w.bubble_end_ns < w.until_ns
    ]
    hooks = [h / 1e3 for h in hook_ns]
    return {
        "benchmark": "control",
        "bubbles": ns.bubbles, "bubble_ms": ns.bubble_ms, "compute_ms": ns.compute_ms, "step_us": ns.step_us,
        "events": int(stats.gpu.events),
        "events_total": int(flood_stats.gpu.events),
        "windows": granted,  # fewer than bubbles: the agent skipped some (edges that came too late)
        "hook_us_p50": round(percentile(hooks, 0.5), 2),
        "hook_us_p99": round(percentile(hooks, 0.99), 2),
        "hook_us_max": round(max(hooks), 2) if hooks else 0.0,
        "grant_us_p50": round(percentile(grants, 0.5), 1),
        "grant_us_p99": round(percentile(grants, 0.99), 1),
        "revoke_us_p50": round(percentile(revokes, 0.5), 1),
        "revoke_us_p99": round(percentile(revokes, 0.99), 1),
        "event_delay_us_p50": round(stats.gpu.event_delay_us_p50, 1),
        "event_delay_us_p99": round(stats.gpu.event_delay_us_p99, 1),
        "dropped_by_reporter": dropped,
        "flood_events": ns.flood,
        "flood_events_per_s": round(ns.flood / flood_s) if flood_s else 0,
        "agent_rss_mb_before_flood": round(rss_before / 2**20, 1),
        "agent_rss_mb": round(rss_after / 2**20, 1),
    }
