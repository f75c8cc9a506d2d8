"""Bubble edges on CUDA, in-process: the event mode with a fake CUDA event (the GPU's drain is a
threading.Event the test sets), the stream mode's synchronise, and the mode's resolution."""

from __future__ import annotations

import logging
import threading

import pytest

from freeride.trainer import edges
from freeride.trainer.edges import EventClock, InlineClock, resolve_mode
from freeride.trainer.waits import BETWEEN_STEPS_SLOT, FWD, WaitTracker


class FakeEvent:
    """A CUDA event whose work completes when the test says so (`done`)."""

    created = 0

    def __init__(self) -> None:
        FakeEvent.created += 1
        self.done = threading.Event()
        self.recorded = 0

    def record(self) -> None:
        self.recorded += 1
        self.done = threading.Event()  # a new record: the GPU has work queued before it again

    def synchronize(self) -> None:
        assert self.done.wait(10), "the test never let the GPU drain"


class Reporter:
    """What the tracker calls on the reporter, in order, with the thread that called it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.threads: set[str] = set()
        self.iteration = 0
        self.seen = threading.Condition()

    def set_iteration(self, iteration: int) -> None:
        self.iteration = iteration

    def hold(self) -> None:  # the real reporter holds a step's edges while the agent is quiet: none here
        self.threads.add(threading.current_thread().name)

    def flush(self) -> None:
        self.threads.add(threading.current_thread().name)

    def start(self, slot: int, kind: int = 0, expected_duration_ns: int = 0, free_memory_bytes: int = 0,
              time_ns: int = 0) -> None:
        self._note("start", slot)

    def end(self, slot: int, kind: int = 0, time_ns: int = 0) -> None:
        self._note("end", slot)

    def _note(self, edge: str, slot: int) -> None:
        with self.seen:
            self.calls.append((edge, slot, self.iteration))
            self.threads.add(threading.current_thread().name)
            self.seen.notify_all()

    def wait_calls(self, n: int) -> list[tuple[str, int, int]]:
        with self.seen:
            assert self.seen.wait_for(lambda: len(self.calls) >= n, 10), self.calls
            return list(self.calls)


def _event_tracker() -> tuple[WaitTracker, Reporter, list[FakeEvent]]:
    events: list[FakeEvent] = []

    def new_event() -> FakeEvent:
        events.append(FakeEvent())
        return events[-1]

    reporter = Reporter()
    tracker = WaitTracker(reporter, EventClock(new_event), record=True, min_report_ns=0)  # type: ignore[arg-type]
    return tracker, reporter, events


def test_event_mode_reports_start_only_once_the_gpu_drained_and_never_blocks_the_training_thread() -> None:
    tracker, reporter, events = _event_tracker()
    try:
        tracker.begin_step()
        token = tracker.begin_wait(FWD)  # returns at once although the GPU has not drained
        assert len(events) == 1 and reporter.calls == []
        tracker.end_wait(token)  # the wait returned on the CPU: its END waits for its own event
        assert len(events) == 2 and reporter.calls == []
        events[0].done.set()  # the kernels queued before the wait are done: START
        assert reporter.wait_calls(1) == [("start", 0, 0)]
        events[1].done.set()  # the received data landed: END
        assert reporter.wait_calls(2) == [("start", 0, 0), ("end", 0, 0)]
        assert reporter.threads == {"freeride-edges"}  # one producer for the reporter's ring: the watcher
        bubble = tracker.bubbles[0]
        assert (bubble.slot, bubble.reported) == (0, True) and bubble.end_ns >= bubble.start_ns
    finally:
        for ev in events:
            ev.done.set()
        tracker.close()


def test_event_mode_keeps_the_order_and_iterations_of_edges_across_steps_and_reuses_its_events() -> None:
    tracker, reporter, events = _event_tracker()
    for step in range(3):
        tracker.begin_step()
        for _ in range(2):
            tracker.end_wait(tracker.begin_wait(FWD))
        tracker.end_step()
        for ev in events:
            ev.done.set()
        reporter.wait_calls(6 * step + 5)  # the last gap's END, 4 edges of the waits, this gap's START
    tracker.begin_step()  # closes the last between-steps gap
    tracker.close()  # reports what is queued, then joins the watcher
    seen = list(reporter.calls)
    assert seen[:6] == [("start", 0, 0), ("end", 0, 0), ("start", 1, 0), ("end", 1, 0),
                         ("start", BETWEEN_STEPS_SLOT, 0), ("end", BETWEEN_STEPS_SLOT, 0)]
    assert [it for e, s, it in seen if s == 0 and e == "start"] == [0, 1, 2]
    assert seen[-1] == ("end", BETWEEN_STEPS_SLOT, 2)
    # 5 edges a step wait for the GPU; the pool keeps as few events as were ever in flight at once
    assert sum(ev.recorded for ev in events) == 15
    assert len(events) <= 5


def test_a_failing_reporter_is_logged_once_and_the_watcher_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    tracker, reporter, events = _event_tracker()
    calls = 0

    def broken(slot: int, kind: int = 0, expected_duration_ns: int = 0, free_memory_bytes: int = 0,
               time_ns: int = 0) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("ring gone")

    reporter.start = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="freeride.trainer.edges"):
        tracker.begin_step()
        for _ in range(3):
            tracker.end_wait(tracker.begin_wait(FWD))
        for ev in events:
            ev.done.set()
        reporter.wait_calls(3)  # every END still reported
        tracker.close()
    assert calls == 3
    assert len([r for r in caplog.records if "reporting a bubble edge failed" in r.getMessage()]) == 1


def test_stream_mode_synchronises_before_every_edge_that_waits_for_the_gpu() -> None:
    syncs: list[int] = []
    reporter = Reporter()
    tracker = WaitTracker(reporter, InlineClock(lambda: syncs.append(len(reporter.calls)), mode="stream"),  # type: ignore[arg-type]
                          min_report_ns=0)
    tracker.begin_step()
    tracker.end_wait(tracker.begin_wait(FWD))
    tracker.end_step()
    tracker.begin_step()  # the gap's END is the CPU's time: no synchronise
    assert syncs == [0, 1, 2]  # before the START, before the END, before the between-steps START
    assert [c[0] for c in reporter.calls] == ["start", "end", "start", "end"]
    assert tracker.edge_mode == "stream"


class _Device:
    def __init__(self, type_: str) -> None:
        self.type = type_


def test_the_mode_comes_from_the_argument_then_the_environment_then_the_default(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    cuda, cpu = _Device("cuda"), _Device("cpu")
    monkeypatch.delenv(edges.ENV_EDGE_SYNC, raising=False)
    assert resolve_mode(cpu, "event") == "off"  # a CPU wait is exact: nothing to synchronise
    assert resolve_mode(cuda) == "event"  # the default, chosen by the first GPU run
    assert resolve_mode(cuda, sync_cuda=False) == "off"
    monkeypatch.setenv(edges.ENV_EDGE_SYNC, "stream")
    assert resolve_mode(cuda) == "stream"
    assert resolve_mode(cuda, "off") == "off"
    with pytest.raises(ValueError, match="edge_sync must be one of stream, event, off, not 'evnt'"):
        resolve_mode(cuda, "evnt")
    monkeypatch.setenv(edges.ENV_EDGE_SYNC, "fast")
    with caplog.at_level(logging.WARNING, logger="freeride.trainer.edges"):
        assert resolve_mode(cuda) == "event"  # an environment variable never stops training
    assert "FREERIDE_EDGE_SYNC='fast' is not one of stream, event, off; using event" in caplog.text


def test_off_on_a_cuda_device_warns_that_it_harvests_nothing_or_slows_training(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="freeride.trainer.edges"):
        assert edges.clock_for(_Device("cpu"), "off").mode == "off"  # a CPU wait is exact: nothing to say
        assert not caplog.records
        assert edges.clock_for(_Device("cuda"), "off").mode == "off"
    assert "edge_sync 'off' on" in caplog.text and "Leave edge_sync unset for 'event'" in caplog.text
