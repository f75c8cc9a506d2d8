"""The servicers in-process (the second depth, tests/support/served.py): real gRPC on a unix socket, the real engine
over a fake launcher and a manual clock, called with the real clients. The error table as a program sees it, Attach
before and after its worker's spawn, a trainer's hello and its road (the ring offer, taken or timed out), Watch; and
the rules that the integration suite once checked with a whole agent process (tests/integration/trainers/
test_reporter.py, test_failures.py, test_lifecycle.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.agents import spec
from support.engine_fakes import FakeWorker
from support.served import Served, served_agent

import freeride
from freeride.agent.domain.model import TaskRecord, TaskSpec, TaskState
from freeride.agent.state.registry import Registry
from freeride.core.ring import MAX_STANDS_FOR
from freeride.errors import InvalidSpecError, InvalidStateError, TaskNotFoundError, TaskRefError
from freeride.gpu.control import cpu_only
from freeride.trainer.reporter import BubbleReporter
from freeride.trainer.waits import BWD, FWD, WaitTracker
from freeride.v1 import tasks_pb2, trainer_pb2, trainer_pb2_grpc, worker_pb2, worker_pb2_grpc

START, END = trainer_pb2.BUBBLE_EDGE_START, trainer_pb2.BUBBLE_EDGE_END
FAST_RECONNECT = {"reconnect_min_s": 0.05, "reconnect_max_s": 0.2}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with served_agent(tmp_path) as s:
        yield s


@pytest.fixture
def ringed(served: Served) -> Iterator[BubbleReporter]:
    """A rank-1 trainer's reporter that took the served agent's ring, the agent's clock caught up with it."""
    reporter = BubbleReporter(served.target, rank=1)
    try:
        assert reporter.wait_path("shm", 10)
        served.on_loop(served.clock.catch_up)
        yield reporter
    finally:
        reporter.close()


class Said(logging.Handler):
    """The agent's log lines, and an event set once one of them contains `words`."""

    def __init__(self, words: str) -> None:
        super().__init__()
        self.words, self.seen, self.lines = words, threading.Event(), list[str]()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        if self.words in self.lines[-1]:
            self.seen.set()


@pytest.fixture
def said() -> Iterator[Any]:
    handlers: list[Said] = []

    def make(words: str) -> Said:
        handlers.append(Said(words))
        logging.getLogger("freeride.agent").addHandler(handlers[-1])
        return handlers[-1]

    yield make
    for h in handlers:
        logging.getLogger("freeride.agent").removeHandler(h)


class Stream:
    """A stream call fed from a queue: the test says what to send next, and when the stream ends."""

    def __init__(self) -> None:
        self._q: queue.Queue[Any] = queue.Queue()

    def send(self, msg: Any) -> None:
        self._q.put(msg)

    def end(self) -> None:
        self._q.put(None)

    def __iter__(self) -> Iterator[Any]:
        while (msg := self._q.get()) is not None:
            yield msg


def hello(rank: int = 0, shared_memory: bool = False, pid: int = 4242) -> trainer_pb2.BubbleBatch:
    return trainer_pb2.BubbleBatch(hello=trainer_pb2.TrainerHello(rank=rank, pid=pid, shared_memory=shared_memory))


def bubble(now_ns: int, slot: int = 0, rank: int = 0) -> list[trainer_pb2.BubbleEvent]:
    return [trainer_pb2.BubbleEvent(edge=START, slot=slot, rank=rank, time_ns=now_ns - 2_000_000),
            trainer_pb2.BubbleEvent(edge=END, slot=slot, rank=rank, time_ns=now_ns)]


def a_task(served: Served, state: TaskState = TaskState.SUBMITTED) -> TaskRecord:
    """A task in the table as a submit leaves it (without the submit's reference check, a subprocess)."""

    def put() -> TaskRecord:
        rec = TaskRecord("7", TaskSpec("t7", "pkg.mod:Task"), state, kind="iterative")
        served.agent.table.records[rec.id] = rec
        return rec

    return served.on_loop(put)


# -- the error table, through the client --------------------------------------------------------------------
def test_each_refusal_reaches_the_program_as_its_domain_error(served: Served) -> None:
    a_task(served, TaskState.CANCELLED)
    with freeride.Client(served.target, timeout_s=10) as c:
        with pytest.raises(TaskNotFoundError, match="no task with id '999' on GPU 0"):  # NOT_FOUND
            c.get("999")
        with pytest.raises(TaskNotFoundError):
            list(c.logs("999"))  # from a stream too
        for action in (c.cancel, c.resume, c.pause):  # FAILED_PRECONDITION
            with pytest.raises(InvalidStateError, match="task 7 is"):
                action("7")
        with pytest.raises(InvalidSpecError, match="priority must be between 0 and 100"):  # INVALID_ARGUMENT
            c.submit(tasks_pb2.TaskSpec(ref="pkg.mod:Task", priority=-1))
        assert c.get("7").state == tasks_pb2.TASK_STATE_CANCELLED and c.health() == 1


def test_a_second_stream_claiming_a_held_rank_is_refused_with_already_exists(served: Served) -> None:
    with grpc.insecure_channel(served.target) as channel:
        stub = trainer_pb2_grpc.BubbleServiceStub(channel)
        first = Stream()
        replies = stub.ReportBubbles(iter(first), timeout=10)
        first.send(hello(rank=3))
        assert next(replies).hello_answered is False and next(replies).hello_answered is True
        with pytest.raises(grpc.RpcError) as err:
            list(stub.ReportBubbles(iter([hello(rank=3, pid=5151)]), timeout=10))
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert "rank 3 is already reported to this agent by trainer rank 3 (pid 4242" in err.value.details()
        first.end()
        assert list(replies) == []
    assert served.on_loop(lambda: len(served.agent.trainers.streams)) == 0


# -- Attach ordering ----------------------------------------------------------------------------------------
def test_a_worker_attaching_before_its_spawn_is_refused_and_after_it_gets_its_setup(served: Served) -> None:
    rec = a_task(served)
    launcher = served.launcher
    gate = served.on_loop(asyncio.Event)
    launcher.gate = gate  # the supervisor's start, its spawn held at the gate
    starting = asyncio.run_coroutine_threadsafe(served.agent.supervisor.start(rec), served.loop)
    served.wait(launcher.spawning.wait())
    with grpc.insecure_channel(served.target) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        early = worker_pb2.WorkerMessage(hello=worker_pb2.WorkerHello(task_id="7", instance=1, pid=1))
        with pytest.raises(grpc.RpcError) as err:  # spawned, not yet: no instance is expected
            list(stub.Attach(iter([early]), timeout=10))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no worker instance 1 is expected for task 7" in err.value.details()

        served.on_loop(gate.set)
        starting.result(10)
        worker: FakeWorker = served.on_loop(lambda: launcher.of("7")[0])
        assert worker.instance == 1
        stream = Stream()
        replies = stub.Attach(iter(stream), timeout=10)
        stream.send(early)
        setup = next(replies)
        assert setup.WhichOneof("body") == "setup" and setup.setup.task_ref == "pkg.mod:Task"
        stream.send(worker_pb2.WorkerMessage(ready=worker_pb2.WorkerReady(kind="iterative")))
        served.wait(_state(served, rec, TaskState.READY))
        with freeride.Client(served.target, timeout_s=10) as c:
            assert c.get("7").state == tasks_pb2.TASK_STATE_READY
        stream.end()
        replies.cancel()
        served.on_loop(lambda: worker.exit(0))


async def _state(served: Served, rec: TaskRecord, state: TaskState) -> None:
    """Until `rec` is in `state`, woken by each of the agent's events (checked and subscribed in one loop turn)."""
    q = served.agent.events.subscribe()
    try:
        while rec.state is not state:
            await q.get()
    finally:
        served.agent.events.unsubscribe(q)


# -- the trainer's road ---------------------------------------------------------------------------------------
def test_a_trainer_that_never_maps_its_ring_stays_on_grpc_once_the_offer_times_out(tmp_path: Path, said: Any) -> None:
    gave_up = said("did not fetch its bubble ring")
    with served_agent(tmp_path, handshake_timeout_s=0.0) as served, \
            grpc.insecure_channel(served.target) as channel:
        stream = Stream()
        replies = trainer_pb2_grpc.BubbleServiceStub(channel).ReportBubbles(iter(stream), timeout=10)
        stream.send(hello(shared_memory=True))
        next(replies)
        welcome = next(replies)
        assert welcome.hello_answered and welcome.ring_socket and len(welcome.ring_key) == 16
        assert gave_up.seen.wait(10), gave_up.lines
        assert not Path(welcome.ring_socket).exists()  # nobody can fetch it any more
        with freeride.Client(served.target, timeout_s=10) as c:
            assert [(t.path, t.rank) for t in c.stats().gpu.trainer_streams] == [("grpc", 0)]
            stream.send(trainer_pb2.BubbleBatch(events=bubble(served.clock())))
            stream.end()
            assert list(replies) == []  # the agent ended the stream once it had read it all
            gpu = c.stats().gpu
            assert (gpu.bubbles, gpu.rejected_events, gpu.trainers) == (1, 0, 0)  # the edges came on the stream


def test_a_local_trainer_takes_its_ring_and_its_edges_arrive_through_it(served: Served,
                                                                       ringed: BubbleReporter) -> None:
    with ringed.bubble(0):
        pass
    with freeride.Client(served.target, timeout_s=10) as c:
        gpu = c.stats().gpu  # a Stats call reads the ring first
        assert gpu.bubbles == 1 and [(t.path, t.rank, t.edges) for t in gpu.trainer_streams] == [("shm", 1, 2)]


def test_a_ring_read_late_takes_edges_by_their_age_at_the_last_read_and_refuses_older_ones(
        served: Served, ringed: BubbleReporter) -> None:
    with ringed.bubble(0):  # no task: the quiet agent reads the ring only when asked
        pass
    served.on_loop(lambda: served.clock.advance(90 * 10**9))  # nobody asks for a minute and a half
    with freeride.Client(served.target, timeout_s=10) as c:
        gpu = c.stats().gpu
        assert (gpu.bubbles, gpu.rejected_events) == (1, 0)  # 90 s old, but written since the last read
        stale = served.clock() - 61 * 10**9  # stamped a minute before the read that just happened
        ringed.start(1, time_ns=stale)
        ringed.end(1, time_ns=stale + 1000)
        gpu = c.stats().gpu
        assert (gpu.bubbles, gpu.rejected_events) == (1, 2)


def test_a_quiet_agent_gets_the_steps_waits_together_and_a_listening_one_each_as_it_comes(
        served: Served, ringed: BubbleReporter) -> None:
    reporter = ringed
    hour = 3600 * 10**9
    tracker = WaitTracker(reporter, min_report_ns=0, quiet_flush_ns=hour)  # a CPU stage; every wait reported

    def step(waits: int) -> None:
        tracker.begin_step()
        for _ in range(waits):
            tracker.wait(FWD, lambda: None)
        tracker.end_step()

    try:
        with freeride.Client(served.target, timeout_s=10) as c:
            step(3)  # no task: the agent is quiet, so the steps only time their waits ...
            step(1)
            assert reporter.sent == 0 and c.stats().gpu.bubbles == 0  # (a Stats call reads the ring: empty)
            tracker.quiet_flush_ns = 0
            step(1)  # ... until quiet_flush_ns have passed: then all of them, in one write
            gpu = c.stats().gpu
            # 3 + 1 + 1 waits and the two gaps between the steps (an edge each way), the last gap's start
            assert reporter.sent == gpu.events == 15 and gpu.bubbles == 5
            served.on_loop(lambda: served.agent.trainers.demand(True))  # what a task becoming schedulable does
            step(1)  # the tracker learns it as it writes: this step was still only timed ...
            assert reporter.sent == 19
            tracker.begin_step()  # ... and from the next one on, each edge goes as it comes
            assert reporter.sent == 20
            tracker.wait(FWD, lambda: None)
            assert reporter.sent == 22
            gpu = c.stats().gpu
            assert (gpu.events, gpu.bubbles) == (22, 7)
    finally:
        tracker.close()


def test_the_waits_a_quiet_step_only_timed_are_written_when_the_tracker_closes(served: Served,
                                                                              ringed: BubbleReporter) -> None:
    tracker = WaitTracker(ringed, min_report_ns=0, quiet_flush_ns=3600 * 10**9, record=True)
    tracker.begin_step()
    tracker.wait(BWD, lambda: None)
    tracker.end_step()
    assert ringed.sent == 0
    tracker.close()
    assert ringed.sent == 3  # the wait, and the start of the gap after it
    assert [(b.iteration, b.slot, b.kind) for b in tracker.bubbles] == [(0, 0, trainer_pb2.BUBBLE_KIND_WARMUP)]
    with freeride.Client(served.target, timeout_s=10) as c:
        assert c.stats().gpu.bubbles == 1


class ThreadNotingProbe:
    """A memory probe that notes which thread reads it (the real one reads each worker's PSS: ms a process)."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def usage(self, pids: Iterable[int]) -> dict[int, int]:
        self.threads.append(threading.current_thread().name)
        return dict.fromkeys(pids, 0)


def test_a_stats_call_reads_the_workers_memory_off_the_agents_loop(tmp_path: Path) -> None:
    gpu = cpu_only()
    probe = gpu.probe = ThreadNotingProbe()
    with served_agent(tmp_path, gpu=gpu) as served, freeride.Client(served.target, timeout_s=10) as c:
        c.stats()
        assert probe.threads and all(t.startswith("freeride-sample") for t in probe.threads), probe.threads


# -- Watch --------------------------------------------------------------------------------------------------
def test_watch_announces_a_trainer_coming_and_going_and_a_task_changing(served: Served) -> None:
    rec = a_task(served, TaskState.PAUSED)
    with freeride.Client(served.target, timeout_s=10) as c, grpc.insecure_channel(served.target) as channel:
        events = served.watch(c)
        it = iter(events)
        try:
            list(trainer_pb2_grpc.BubbleServiceStub(channel).ReportBubbles(iter([hello(rank=2)]), timeout=10))
            came, went = next(it), next(it)
            assert (came.trainer.connected, came.trainer.trainers) == (True, 1)
            assert (went.trainer.connected, went.trainer.trainers) == (False, 0)
            c.cancel(rec.id)
            changed = next(it)
            assert changed.task.id == "7" and changed.task.state == tasks_pb2.TASK_STATE_CANCELLED
        finally:
            events.cancel()
        assert list(it) == []


# -- moved down from tests/integration/trainers/test_reporter.py ------------------------------------------------
def test_the_agent_rejects_and_counts_impossible_edges_and_keeps_serving(served: Served) -> None:
    now = served.clock()
    hour = 3600 * 10**9
    bad = [
        trainer_pb2.BubbleEvent(edge=trainer_pb2.BUBBLE_EDGE_UNSPECIFIED, slot=0, time_ns=now),
        trainer_pb2.BubbleEvent(edge=7, slot=0, time_ns=now),  # no such edge
        trainer_pb2.BubbleEvent(edge=START, slot=1, time_ns=now + hour + 10**9),
        trainer_pb2.BubbleEvent(edge=END, slot=1, time_ns=now + hour + 2 * 10**9),
        trainer_pb2.BubbleEvent(edge=START, slot=2, time_ns=now - hour - 2 * 10**9),
        trainer_pb2.BubbleEvent(edge=END, slot=2, time_ns=now - hour - 10**9),
    ]
    with freeride.Client(served.target, timeout_s=10) as client, grpc.insecure_channel(served.target) as channel:
        stub = trainer_pb2_grpc.BubbleServiceStub(channel)
        replies = list(stub.ReportBubbles(iter([trainer_pb2.BubbleBatch(events=bad)]), timeout=10))
        assert [r.gpu for r in replies] == [0]  # the welcome, then the agent ended the stream
        gpu = client.stats().gpu
        assert gpu.rejected_events == len(bad)
        assert gpu.bubbles == 0 and gpu.events == 0

        # The same stream kind still works: a real bubble is accepted after the rejected ones.
        served.clock.advance(10**9)
        good = bubble(served.clock())
        list(stub.ReportBubbles(iter([trainer_pb2.BubbleBatch(events=good)]), timeout=10))
        gpu = client.stats().gpu
        assert gpu.rejected_events == len(bad)
        assert gpu.bubbles == 1
        assert client.health() == 1


@pytest.mark.serial  # the bubble measured within 50 ms of its body
def test_the_bubble_context_manager_reports_one_bubble_around_its_body(served: Served) -> None:
    reporter = BubbleReporter(served.target, **FAST_RECONNECT)
    try:
        assert reporter.wait_connected(10)
        served.on_loop(served.clock.catch_up)
        with reporter.bubble(2):
            t0 = time.monotonic()
            time.sleep(0.02)  # the wait the bubble stands for (not a synchronisation: the body's length)
            body_s = time.monotonic() - t0
        with pytest.raises(KeyError), reporter.bubble(2):  # the END is reported even when the body raises
            raise KeyError("from the body")
    finally:
        reporter.close()
    with freeride.Client(served.target, timeout_s=10) as client:
        gpu = client.stats().gpu
    assert reporter.sent == 4 and reporter.dropped == 0
    assert gpu.bubbles == 2
    assert body_s <= gpu.bubble_s < body_s + 0.05  # the bubble spans the body, and little else


# -- moved down from tests/integration/agent/test_failures.py and test_lifecycle.py ---------------------------------
def test_a_bad_task_is_rejected_at_submit_and_nothing_is_created(served: Served) -> None:
    """(The reference checks are real: a subprocess imports each ref, as the agent's does.)"""
    with freeride.Client(served.target, timeout_s=30) as client:
        for ref, needle in [
            (spec("NotATask").ref, "is not a task"),
            (spec("Missing").ref, "has no attribute 'Missing'"),
            ("no.such.module:Task", "no module named 'no.such.module'"),
            ("/no/such/file.py:Task", "does not exist"),
            ("no_colon", "must look like"),
        ]:
            with pytest.raises(TaskRefError) as err:  # (INVALID_ARGUMENT on the wire)
                client.submit(tasks_pb2.TaskSpec(ref=ref))
            assert needle in str(err.value)
        with pytest.raises(TaskRefError) as err:
            client.submit(tasks_pb2.TaskSpec(ref=spec("Counter").ref, args={"nope": "1"}))
        assert "no argument 'nope'" in str(err.value)
        with pytest.raises(InvalidSpecError) as err:
            client.submit(tasks_pb2.TaskSpec(ref=spec("Counter").ref, priority=101))
        assert "priority" in str(err.value)
        assert client.list() == []
    assert served.launcher.workers == []  # nothing was started either


@pytest.mark.parametrize(("action", "state"), [("cancel", TaskState.CANCELLED), ("pause", TaskState.PAUSED)])
def test_a_cancel_or_a_pause_is_answered_only_once_it_is_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, action: str, state: TaskState
) -> None:
    """A kill -9 right after `freeride cancel` answered must not bring the task back READY (seen under load: the
    write of the new state was still queued on the database thread when the agent died)."""
    writing, go = threading.Event(), threading.Event()
    save = Registry.save

    def held(self: Registry, recs: list[TaskRecord], *args: Any) -> None:
        if any(r.state is state for r in recs):
            writing.set()
            assert go.wait(10)
        save(self, recs, *args)

    monkeypatch.setattr(Registry, "save", held)
    with served_agent(tmp_path) as served, freeride.Client(served.target, timeout_s=10) as c, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        a_task(served)
        answer = pool.submit(getattr(c, action), "7")
        try:
            assert writing.wait(10), "the new state was never written"
            with pytest.raises(concurrent.futures.TimeoutError):
                answer.result(timeout=1.0)  # no answer while its write is held
        finally:
            go.set()
        assert answer.result(10).state == tasks_pb2.TaskState.Value(f"TASK_STATE_{state.name}")


def test_cancel_is_final_and_later_actions_say_why_they_cannot_run(served: Served) -> None:
    with freeride.Client(served.target, timeout_s=30) as client, grpc.insecure_channel(served.target) as channel:
        task = client.submit(spec("Counter"))
        rec = served.on_loop(lambda: served.agent.table.records[task.id])
        worker: FakeWorker = served.on_loop(lambda: served.launcher.of(task.id)[-1])
        stream = Stream()  # the worker's side of its Attach: hello, then ready
        controls = worker_pb2_grpc.WorkerServiceStub(channel).Attach(iter(stream), timeout=30)
        stream.send(worker_pb2.WorkerMessage(hello=worker_pb2.WorkerHello(task_id=task.id, instance=worker.instance)))
        assert next(controls).WhichOneof("body") == "setup"
        stream.send(worker_pb2.WorkerMessage(ready=worker_pb2.WorkerReady(kind="iterative")))
        served.wait(_state(served, rec, TaskState.READY))

        assert client.cancel(task.id).state == tasks_pb2.TASK_STATE_CANCELLED
        for action in (client.cancel, client.resume, client.pause):
            with pytest.raises(InvalidStateError):  # (FAILED_PRECONDITION on the wire)
                action(task.id)
        with pytest.raises(TaskNotFoundError):  # (NOT_FOUND)
            client.get("999")
        stream.end()  # the worker, told to stop, goes
        controls.cancel()
        served.on_loop(lambda: worker.exit(0))


def test_a_quiet_cpu_stage_times_one_step_a_sample_period_and_every_step_once_the_agent_listens(
        served: Served, ringed: BubbleReporter) -> None:
    tracker = WaitTracker(ringed, min_report_ns=0, quiet_flush_ns=0, quiet_sample_ns=3600 * 10**9, record=True)
    timed: list[bool] = []

    def step() -> None:
        timed.append(tracker.timed())
        if not timed[-1]:
            tracker.skip_step()  # as an integration runs an untimed step: unhooked
            return
        tracker.begin_step()
        tracker.wait(FWD, lambda: None)
        tracker.end_step()

    try:
        with freeride.Client(served.target, timeout_s=10) as c:
            step()  # the first step is timed (the tracker learns the agent is quiet at its end) ...
            step()  # ... and then none until an hour has passed ...
            step()
            assert timed == [True, False, False] and tracker.untimed_steps == 2
            assert c.stats().gpu.bubbles == 1
            served.on_loop(lambda: served.agent.trainers.demand(True))  # a task became schedulable
            step()  # ... or until the agent listens: the ring's word is read for every step
            step()
            assert timed == [True, False, False, True, True]
            # The untimed steps count as iterations: the timed ones keep their numbers (the profile's periods).
            assert [b.iteration for b in tracker.bubbles if b.slot == 0] == [0, 3, 4]
            # The agent's counters stay whole: the timed step after two untimed ones stands for all three.
            assert c.stats().gpu.bubbles == 5
    finally:
        tracker.close()


def test_a_task_waiting_for_admission_alone_makes_the_agent_listen(tmp_path: Path) -> None:
    # The trainer's free-memory hint rides on START edges: a quiet agent would read them late, and a task that only
    # waits for memory (no other task runnable) would wait for good.
    with served_agent(tmp_path, headroom_bytes=0) as served, freeride.Client(served.target, timeout_s=10) as c:
        served.on_loop(lambda: setattr(served.agent.scheduler, "trainer_free_memory_bytes", 256 * 2**20))
        assert served.on_loop(lambda: served.agent.trainers.listening) is False  # no task: quiet
        task = c.submit(tasks_pb2.TaskSpec(ref=spec("Counter").ref, mem_limit_bytes=512 * 2**20))
        assert c.get(task.id).reason == "waiting for memory: needs 512 MiB, 256 MiB free for side tasks"
        assert served.on_loop(lambda: served.agent.trainers.listening) is True


def test_the_reporter_refuses_a_kind_or_weight_the_agent_does_not_take_and_says_so_once(
        served: Served, ringed: BubbleReporter, caplog: pytest.LogCaptureFixture) -> None:
    """Round 3, item 2: a `kind` of 256 or more went into the ring record's "stands for" bits, so kind=256 counted each
    bubble twice and kind=2^28 a million times over; the gRPC road masked it to its low byte instead."""
    t = time.monotonic_ns()
    with caplog.at_level(logging.WARNING, logger="freeride.trainer.reporter"):
        for kind in (256, 1 << 28, -1, 1.0):
            ringed.start(0, kind, time_ns=t)  # type: ignore[arg-type]
            ringed.end(0, kind, time_ns=t + 1_000_000)  # type: ignore[arg-type]
        ringed.start(0, 1, time_ns=t, stands_for=MAX_STANDS_FOR + 1)
        ringed.end(0, 1, time_ns=t + 1_000_000, stands_for=0)
    ringed.start(0, 1, time_ns=t + 2_000_000)  # good ones behind them, the second with a quiet step's weight
    ringed.end(0, 1, time_ns=t + 3_000_000)
    ringed.start(0, 1, time_ns=t + 10_000_000, stands_for=3)
    ringed.end(0, 1, time_ns=t + 11_000_000, stands_for=3)
    served.on_loop(served.clock.catch_up)
    with freeride.Client(served.target, timeout_s=10) as client:
        gpu = client.stats().gpu
    assert ringed.refused_edges == 10 and ringed.dropped == 0
    assert (gpu.bubbles, gpu.bubble_s, gpu.rejected_events) == (4, pytest.approx(0.004), 0)
    said = [r.getMessage() for r in caplog.records if "bubble edge refused" in r.getMessage()]
    assert len(said) == 1 and "kind 256 is not a freeride.v1.BubbleKind" in said[0]
