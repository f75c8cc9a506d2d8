"""The trainer-side BubbleReporter never slows or breaks training, whether or not an agent is there.

The rules of the agent's end of the stream (impossible edges rejected and counted, the bubble context manager's
span) are checked in-process, against the real servicers: tests/unit/agent/edge/test_servicers.py.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.agents import FAST, bubbles, spec
from support.jitter import assert_within

from freeride.client import AgentClient
from freeride.tooling.harness import AgentProcess, replay, wait_for_info, wait_for_task
from freeride.trainer.reporter import BubbleReporter
from freeride.v1 import tasks_pb2

CALLS = 1000
FAST_RECONNECT = {"reconnect_min_s": 0.05, "reconnect_max_s": 0.2}


def timed_calls(reporter: BubbleReporter, calls: int) -> list[float]:
    """Alternate start/end `calls` times each; the seconds every single call took."""
    durations = []
    for i in range(calls):
        for call in (reporter.start, reporter.end):
            t0 = time.perf_counter()
            call(i % 4)
            durations.append(time.perf_counter() - t0)
    return durations


def p99(durations: list[float]) -> float:
    return sorted(durations)[int(len(durations) * 0.99)]


def report(reporter: BubbleReporter, n: int) -> None:
    """n real (a few ms long) bubbles, in real time, as a training loop would."""
    replay(reporter, bubbles(n, [2.0], compute_ms=0.5))


@pytest.fixture
def new_agent(tmp_path: Path) -> Iterator[Callable[[], AgentProcess]]:
    """Agents on one state dir and socket, created (not started) on demand; all are stopped at the end."""
    made: list[AgentProcess] = []

    def make() -> AgentProcess:
        made.append(AgentProcess(state_dir=tmp_path / "state", extra_args=FAST))
        return made[-1]

    yield make
    for proc in made:
        code = proc.stop()
        assert code in (0, -signal.SIGKILL), f"agent exited with {code}:\n{proc.log_tail()}"


@pytest.mark.serial  # p99 of a call's time, measured
def test_with_no_agent_calls_are_sub_millisecond_never_raise_and_are_counted_as_dropped(tmp_path):
    reporter = BubbleReporter(f"unix:{tmp_path / 'none.sock'}", **FAST_RECONNECT)
    try:
        durations = timed_calls(reporter, CALLS)
        with reporter.bubble(0):
            pass
        assert_within(p99(durations) * 1e3, 1.0, "p99 of a call with no agent")
        assert reporter.dropped == 2 * CALLS + 2
        assert reporter.sent == 0
        assert not reporter.wait_connected(0)
    finally:
        t0 = time.perf_counter()
        reporter.close()
    assert time.perf_counter() - t0 < 2.0  # nothing to flush: close does not wait out its timeout


def test_a_reporter_made_before_the_agent_connects_once_it_starts_and_its_bubbles_arrive(new_agent):
    agent = new_agent()
    assert agent.socket == agent.state_dir.parent / "agent-gpu0.sock"
    reporter = BubbleReporter(f"unix:{agent.socket}", **FAST_RECONNECT)
    try:
        timed_calls(reporter, 10)  # no agent yet: dropped, not queued
        assert reporter.dropped == 20 and not reporter.wait_connected(0)
        agent.start()
        assert reporter.wait_connected(10), "reporter did not connect to the agent that started after it"
        with agent.client() as c:
            before = c.stats().gpu
            report(reporter, 5)
            reporter.close()  # flushes the queue and ends the stream
            after = c.stats().gpu
        assert reporter.dropped == 20 and reporter.sent == 10
        assert after.bubbles - before.bubbles == 5
        assert after.rejected_events == 0
    finally:
        reporter.close()


@pytest.mark.serial  # p99 and max of a call's time, measured
def test_when_the_agent_dies_calls_stay_fast_and_the_reporter_reconnects_to_its_successor(new_agent):
    first = new_agent().start()
    reporter = BubbleReporter(first.target, **FAST_RECONNECT)
    try:
        assert reporter.wait_connected(10)
        report(reporter, 2)
        first.kill9()

        # Training goes on: every call returns at once while the reporter notices the agent is gone.
        durations: list[float] = []
        dropped = reporter.dropped
        deadline = time.monotonic() + 10
        while reporter.dropped == dropped and time.monotonic() < deadline:
            durations += timed_calls(reporter, 10)
        assert reporter.dropped > dropped, "the reporter did not notice the agent died"
        durations += timed_calls(reporter, CALLS)
        assert_within(p99(durations) * 1e3, 1.0, "p99 of a call while the agent is gone")
        assert_within(max(durations) * 1e3, 200.0, "the slowest call while the agent is gone")

        second = new_agent().start()  # same state dir and socket
        assert reporter.wait_connected(10), "reporter did not reconnect to the restarted agent"
        with second.client() as c:
            before = c.stats().gpu.bubbles
            report(reporter, 3)
            reporter.close()
            assert c.stats().gpu.bubbles - before == 3
    finally:
        reporter.close()


@pytest.mark.serial  # median of a call's time, measured
def test_while_connected_each_start_and_end_costs_microseconds_in_the_training_thread(
    agent: AgentProcess, client: AgentClient
) -> None:
    # The connected path is the one training lives on: each call writes a ring slot and may wake the
    # sender thread. Medians, not maxima: a loaded runner may preempt a few calls, never half of them.
    reporter = BubbleReporter(agent.target)
    starts_ns: list[int] = []
    ends_ns: list[int] = []
    try:
        assert reporter.wait_connected(10)
        for i in range(CALLS):  # 2 * CALLS edges: far fewer than the ring holds, so none may be dropped
            t0 = time.perf_counter_ns()
            reporter.start(i % 4)
            t1 = time.perf_counter_ns()
            reporter.end(i % 4)
            t2 = time.perf_counter_ns()
            starts_ns.append(t1 - t0)
            ends_ns.append(t2 - t1)
        reporter.close()  # flushes the queue
    finally:
        reporter.close()
    assert reporter.dropped == 0 and reporter.sent == 2 * CALLS  # every call took the connected path
    assert client.stats().gpu.events == 2 * CALLS
    for hook, durations in (("start", starts_ns), ("end", ends_ns)):
        median_ms = sorted(durations)[len(durations) // 2] / 1e6
        assert_within(median_ms, 0.2, f"{hook}()'s median while connected")


@pytest.mark.serial  # max of a call's time, measured
@pytest.mark.parametrize("path", ["auto", "grpc"])
def test_sigterm_with_a_trainer_connected_ends_its_stream_cleanly_and_the_trainer_goes_on(new_agent, path):
    agent = new_agent().start()
    reporter = BubbleReporter(agent.target, path=path, **FAST_RECONNECT)
    try:
        assert reporter.wait_path("shm" if path == "auto" else "grpc", 10)
        report(reporter, 2)
        assert agent.stop() == 0
        log = agent.log_path.read_text()
        # The agent ended the stream itself (status OK) before its server stopped: gRPC had nothing to cancel,
        # so it logged no "Exception not handled ... ReportBubbles" and no CancelledError traceback.
        assert f"trainer rank 0 (pid {os.getpid()}) disconnected" in log, log
        assert "Traceback" not in log and "Exception not handled" not in log and "CancelledError" not in log, log
        # The trainer saw its stream end, as when the agent dies: no road, calls return at once, edges counted.
        assert reporter.wait_path("", 10)
        dropped = reporter.dropped
        durations = timed_calls(reporter, 100)
        assert reporter.dropped == dropped + 200
        assert_within(max(durations) * 1e3, 200.0, "the slowest call once the stream ended")
        successor = new_agent().start()
        assert reporter.wait_connected(10), "the reporter did not reconnect to the next agent"
        successor.stop()
    finally:
        reporter.close()


class _Both:
    """Two reporters fed the same edges, as two training processes claiming one rank would send them."""

    def __init__(self, *reporters: BubbleReporter) -> None:
        self._reporters = reporters

    def set_iteration(self, iteration: int) -> None:
        for r in self._reporters:
            r.set_iteration(iteration)

    def start(self, slot: int, kind: int = 0, free_memory_bytes: int = 0) -> None:
        for r in self._reporters:
            r.start(slot, kind, free_memory_bytes=free_memory_bytes)

    def end(self, slot: int, kind: int = 0) -> None:
        for r in self._reporters:
            r.end(slot, kind)


def test_a_second_trainer_claiming_a_rank_is_refused_said_once_and_the_first_is_accounted_exactly(
    agent: AgentProcess, client: AgentClient, caplog: pytest.LogCaptureFixture,
) -> None:
    """Round 2, item 10: two trainers on one rank were both accepted, and their interleaved edges lost 43 % of the
    bubbles and opened more windows than there were bubbles."""
    task = client.submit(spec("Counter", step_ms=0.5))
    wait_for_task(client, task.id, [tasks_pb2.TASK_STATE_READY])  # (an agent with no READY task grants no window)
    first = BubbleReporter(agent.target, rank=0)
    second = None
    try:
        assert first.wait_connected(10), agent.log_tail()  # the first holds the rank before the second says hello
        second = BubbleReporter(agent.target, rank=0, **FAST_RECONNECT)
        with caplog.at_level(logging.WARNING, logger="freeride.trainer.reporter"):
            assert second.wait_refused(3, 20), f"the second trainer of rank 0 was not refused: path {second.path!r}"
        assert second.path == "" and not second.wait_connected(0)
        assert f"rank 0 is already reported to this agent by trainer rank 0 (pid {os.getpid()})" in second.refused
        said = [r.getMessage() for r in caplog.records if "refused rank 0" in r.getMessage()]
        assert len(said) == 1 and "training goes on without its bubbles harvested" in said[0], said

        iterations = 12
        replay(_Both(first, second), bubbles(iterations, [4.0, 4.0], compute_ms=1.0))  # interleaved, both ranks 0
        gpu = client.stats().gpu
        assert (gpu.events, gpu.bubbles, gpu.trainers) == (4 * iterations, 2 * iterations, 1), gpu
        assert 0 < gpu.windows <= gpu.bubbles, gpu
        assert second.sent == 0 and second.dropped == 4 * iterations  # dropped and counted, never raised
    finally:
        first.close()
        if second is not None:
            second.close()
    # (not the doctor's start-up lines: on a disk past --disk-warn-percent it warns that submissions are then refused)
    refusals = [line for line in agent.log_path.read_text().splitlines() if "refused" in line and "doctor:" not in line]
    assert len(refusals) == 1 and "rank 0 is already reported" in refusals[0], refusals


def test_an_agent_with_nothing_to_grant_is_woken_by_no_edge_and_listens_once_a_task_is_ready(
    agent: AgentProcess, client: AgentClient
) -> None:
    reporter = BubbleReporter(agent.target)
    try:
        assert reporter.wait_connected(10) and reporter.path == "shm"
        report(reporter, 20)
        assert reporter.wakes == 0  # no task: the edges went into the ring and woke nobody
        assert client.stats().gpu.bubbles == 20  # the profile still has every bubble (a Stats call reads the ring)
        task = client.submit(spec("Counter", step_ms=1))
        wait_for_task(client, task.id, [tasks_pb2.TASK_STATE_READY])  # the agent listens before READY is seen
        report(reporter, 3)
        assert reporter.wakes >= 1  # each edge may lead to a grant now: the sleeping agent is woken
        client.cancel(task.id)
        # Quiet once its worker is gone (until then its slot could still take a window): the pid goes after.
        wait_for_info(client, task.id, lambda t: t.state == tasks_pb2.TASK_STATE_CANCELLED and t.pid == 0, 30.0)
        quiet_from = reporter.wakes
        report(reporter, 5)
        assert reporter.wakes == quiet_from  # nothing to grant again: quiet again
        assert client.stats().gpu.bubbles == 28
    finally:
        reporter.close()
    assert reporter.dropped == 0
