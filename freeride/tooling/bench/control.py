"""`freeride bench control`: cost and latency of the control path, in one run.

A synthetic trainer reports bubbles to a real agent that runs a real worker with tiny steps.
Each bubble gets its own slot and a generous expected length, so its window is closed by the
END edge (not by the prediction): that measures both START -> first step and END -> idle.

Where the hook time goes, in the same run: before the bubbles, the same loop (same sleeps) calls
a no-op of the hooks' shape instead ("hook_floor_us": what any call costs on this machine after
the thread slept, caches cold), and both loops' process CPU time (all threads: the reporter's
sender, gRPC's, the bench's window collector) is divided by the edges; the difference between
"trainer_cpu_us_per_edge" and "floor_cpu_us_per_edge" is what reporting costs the trainer process.
And the machine's own floor under any hop between processes ("wake_write_us", "wake_delay_us":
freeride.tooling.bench.wakefloor), measured in the same run. "hook_preempted" counts the training
thread's involuntary context switches during the hooks' loop ("floor_preempted": during the no-op
loop): on a machine with few cores, the process an edge wakes (the agent) may land on the rank's own
core and take it in the middle of the hook. `--trainer-cpus` and `--agent-cpus` place the two apart.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import time
from collections.abc import Iterator
from typing import Any

import psutil

from freeride.client import AgentClient
from freeride.core.cpu import allowed_cpus, parse_cpu_list, pin_threads
from freeride.core.stats import percentile
from freeride.errors import FreerideError
from freeride.gpu.probe import pss_bytes
from freeride.tooling.bench import paths, wakefloor
from freeride.tooling.harness import (
    AgentProcess,
    WindowCollector,
    grant_latencies_us,
    grant_parts_summary,
    sleep_until,
    wait_for_task,
)
from freeride.trainer.reporter import BubbleReporter
from freeride.v1 import tasks_pb2

_FLOOD_QUEUE = 16384  # the flooding reporter's capacity (its gRPC queue, or the ring it asks the agent for)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bubbles", type=int, default=2000, help="bubbles to report (2 events each)")
    p.add_argument("--bubble-ms", type=float, default=2.0, help="length of each bubble")
    p.add_argument("--compute-ms", type=float, default=2.0, help="busy time between bubbles")
    p.add_argument("--step-us", type=float, default=50.0, help="the no-op task's step length")
    p.add_argument("--flood", type=int, default=0, metavar="EVENTS",
                   help="afterwards, send this many events as fast as possible and report agent memory")
    p.add_argument("--ballast", type=int, default=0, metavar="TASKS",
                   help="also run this many resident tasks holding host memory (never granted a window while the "
                        "measured task can take it): the memory watchdog samples each of them every tick")
    p.add_argument("--ballast-mb", type=int, default=256, metavar="MIB",
                   help="memory each ballast process holds (touched)")
    p.add_argument("--ballast-children", type=int, default=0, metavar="N",
                   help="child processes each ballast task starts, each holding --ballast-mb too")
    p.add_argument("--trainer-cpus", metavar="LIST",
                   help="pin the synthetic trainer (this process, every thread) to these CPUs, e.g. 0")
    p.add_argument("--agent-cpus", metavar="LIST",
                   help="start the agent with --agent-cpus LIST, e.g. 1 (a core the trainer does not use)")
    paths.add_arg(p)


def _cpus(text: str | None, flag: str) -> frozenset[int] | None:
    if not text:
        return None
    try:
        return allowed_cpus(parse_cpu_list(text), flag, "this machine's" if flag == "--trainer-cpus" else "the agent's")
    except ValueError as exc:
        raise FreerideError(f"bench control: {exc}") from None


def _preemptions() -> int:
    """The calling thread's involuntary context switches so far (another runnable thread took its CPU)."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw


class _NoHooks:
    """The hooks' shape, doing nothing: the floor any hook call costs."""

    def start(self, slot: int, kind: int = 0, expected_duration_ns: int = 0, free_memory_bytes: int = 0) -> None:
        pass

    def end(self, slot: int, kind: int = 0) -> None:
        pass


def _loop(hooks: BubbleReporter | _NoHooks, ns: argparse.Namespace) -> tuple[list[int], int, int, int]:
    """The synthetic trainer: `ns.bubbles` bubbles between compute; each hook call's time (ns),
    then the process CPU time and the calling thread's CPU time spent during the loop (ns), and the
    times the calling thread was preempted meanwhile."""
    hook_ns: list[int] = []
    bubble_ns = int(ns.bubble_ms * 1e6)
    compute_ns = int(ns.compute_ms * 1e6)
    preempted = _preemptions()
    cpu0, thread0 = time.process_time_ns(), time.thread_time_ns()
    t = time.monotonic_ns()
    for i in range(ns.bubbles):
        a = time.perf_counter_ns()
        hooks.start(i, expected_duration_ns=4 * bubble_ns)
        b = time.perf_counter_ns()
        t += bubble_ns
        sleep_until(t)
        c = time.perf_counter_ns()
        hooks.end(i)
        d = time.perf_counter_ns()
        hook_ns += [b - a, d - c]
        t += compute_ns
        sleep_until(t)
    cpu, thread = time.process_time_ns() - cpu0, time.thread_time_ns() - thread0
    return hook_ns, cpu, thread, _preemptions() - preempted


def _flood(reporter: BubbleReporter, events: int) -> float:
    t0 = time.monotonic()
    for i in range(events // 2):
        if reporter.queued > _FLOOD_QUEUE // 2:  # let the agent (or the sender) catch up rather than drop
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


@contextlib.contextmanager
def _pinned(cpus: frozenset[int] | None) -> Iterator[None]:
    """This process (every thread) on `cpus` meanwhile; the agent, started before, keeps its own CPUs."""
    if cpus is None:
        yield
        return
    before = frozenset(os.sched_getaffinity(0))
    pin_threads(cpus)
    try:
        yield
    finally:
        pin_threads(before)


def run(ns: argparse.Namespace) -> dict[str, Any]:
    if ns.ballast < 0 or ns.ballast_children < 0 or ns.ballast_mb < 1:
        raise FreerideError("bench control: --ballast and --ballast-children must not be negative, "
                            "--ballast-mb must be at least 1")
    _cpus(ns.trainer_cpus, "--trainer-cpus")
    _cpus(ns.agent_cpus, "--agent-cpus")
    return paths.run("control", ns, _run)


def _run(ns: argparse.Namespace, path: str) -> dict[str, Any]:
    trainer_cpus, agent_cpus = _cpus(ns.trainer_cpus, "--trainer-cpus"), _cpus(ns.agent_cpus, "--agent-cpus")
    agent_args = [*paths.AGENT_ARGS, *(["--agent-cpus", ns.agent_cpus] if ns.agent_cpus else [])]
    with AgentProcess(extra_args=agent_args) as agent, _pinned(trainer_cpus), agent.client() as client:
        assert agent.proc is not None
        task = client.submit(tasks_pb2.TaskSpec(name="noop", ref="freeride.tooling.tasks:NoopTask", priority=1,
                                                args={"step_us": str(ns.step_us)}))
        ballast = [client.submit(tasks_pb2.TaskSpec(  # priority 0: the noop task takes every window it fits
            name=f"ballast-{i}", ref="freeride.tooling.tasks:BallastTask",
            args={"mb": str(ns.ballast_mb), "children": str(ns.ballast_children)})) for i in range(ns.ballast)]
        for t in [task, *ballast]:
            wait_for_task(client, t.id, [tasks_pb2.TASK_STATE_READY], timeout_s=60.0)
        collector = WindowCollector(client)
        reporter = paths.connect("control", agent.target, path)
        # The floor first, with the reporter connected and idle: the same process, the same sleeps.
        floor_ns, floor_cpu_ns, floor_thread_ns, floor_preempted = _loop(_NoHooks(), ns)
        wake = wakefloor.measure(min(ns.bubbles, 1000), ns.bubble_ms, agent_cpus)
        hook_ns, cpu_ns, thread_ns, preempted = _loop(reporter, ns)
        paths.check("control", path, reporter.path)  # still on the road asked for (no reconnect on the way)
        dropped = reporter.dropped
        _finish(reporter, client, collector)
        granted = len(collector.windows)
        stats = client.stats()
        ballast_bytes = sum(pss_bytes(client.get(t.id).pid) for t in ballast)  # what the watchdog reads each tick
        rss_before = psutil.Process(agent.proc.pid).memory_info().rss
        flood_s = 0.0
        if ns.flood:
            # A second trainer stream: once it has ended, the agent has seen every event of the flood.
            flooder = paths.connect("control", agent.target, path, rank=1, max_queue=_FLOOD_QUEUE)
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
    floor = [h / 1e3 for h in floor_ns]
    edges = 2 * ns.bubbles
    return {
        "benchmark": "control",
        "path": path,
        "bubbles": ns.bubbles, "bubble_ms": ns.bubble_ms, "compute_ms": ns.compute_ms, "step_us": ns.step_us,
        "ballast": ns.ballast, "ballast_mb": ns.ballast_mb, "ballast_children": ns.ballast_children,
        "ballast_pss_mb": round(ballast_bytes / 2**20, 1),
        "trainer_cpus": ns.trainer_cpus or "any", "agent_cpus": ns.agent_cpus or "any",
        "events": int(stats.gpu.events),
        "events_total": int(flood_stats.gpu.events),
        "windows": granted,  # fewer than bubbles: the agent skipped some (edges that came too late)
        "hook_us_p50": round(percentile(hooks, 0.5), 2),
        "hook_us_p99": round(percentile(hooks, 0.99), 2),
        "hook_us_max": round(max(hooks), 2) if hooks else 0.0,
        "hook_floor_us_p50": round(percentile(floor, 0.5), 2),
        "hook_floor_us_p99": round(percentile(floor, 0.99), 2),
        "hook_preempted": preempted,
        "floor_preempted": floor_preempted,
        "trainer_cpu_us_per_edge": round(cpu_ns / edges / 1e3, 2) if edges else 0.0,
        "floor_cpu_us_per_edge": round(floor_cpu_ns / edges / 1e3, 2) if edges else 0.0,
        "hook_thread_cpu_us_per_edge": round(thread_ns / edges / 1e3, 2) if edges else 0.0,
        "floor_thread_cpu_us_per_edge": round(floor_thread_ns / edges / 1e3, 2) if edges else 0.0,
        **wake,
        "grant_us_p50": round(percentile(grants, 0.5), 1),
        "grant_us_p99": round(percentile(grants, 0.99), 1),
        **grant_parts_summary(windows),
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
