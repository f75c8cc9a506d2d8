"""The trainers' owner on one GPU (freeride.agent.engine.trainers): streams and their events, rank claims, the
declarations kept, the rings told when to wake the agent, and the free-memory hint that may admit a waiting task.
With the real scheduler and task table; the rings and the store are the ports' smallest stand-ins."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from support.engine_fakes import FakeWindow

from freeride.agent.control.scheduler import Scheduler, SchedulerConfig, TaskSlot
from freeride.agent.domain.events import Edge, TrainerChanged, TrainerDeclaration
from freeride.agent.domain.model import Counters
from freeride.agent.domain.trainers import TrainerStream
from freeride.agent.engine.pubsub import Hub
from freeride.agent.engine.tasks import TaskTable
from freeride.agent.engine.trainers import MAX_DECLARED, Trainers


class Ring:
    def __init__(self) -> None:
        self.told: list[bool] = []
        self.pumped = 0

    def pump(self) -> None:
        self.pumped += 1

    def listen(self, wanted: bool) -> None:
        self.told.append(wanted)


class Store:
    def __init__(self) -> None:
        self.ledger_marks = 0

    def mark_dirty(self, ids: set[str], ledger: bool = False) -> None:
        self.ledger_marks += int(ledger)


class World:
    def __init__(self) -> None:
        self.now = 1_000
        self.scheduler = Scheduler(lambda: self.now, lambda at, fn: None, SchedulerConfig(),
                                   on_account=lambda *a: None, on_hang=lambda *a: None)
        self.table = TaskTable(lambda rec, change: None)
        self.store = Store()
        self.admitted = 0
        self.soon: list[Callable[[], None]] = []
        self.hub = Hub()
        self.trainers = Trainers(lambda: self.now, self.hub, self.scheduler, self.table, self.store,
                                 self._admit, self.soon.append)

    def _admit(self) -> None:
        self.admitted += 1

    def events(self, q: asyncio.Queue[object]) -> list[TrainerChanged]:
        out = []
        while not q.empty():
            ev = q.get_nowait()
            assert isinstance(ev, TrainerChanged)
            out.append(ev)
        return out


@pytest.fixture
def w() -> World:
    return World()


def stream(rank: int, pid: int) -> TrainerStream:
    return TrainerStream("unix:", rank=rank, pid=pid, hello=True)


def test_a_stream_that_opens_and_closes_is_said_to_watchers_and_its_training_time_is_in_the_ledger(w: World) -> None:
    q = w.hub.subscribe()
    s = stream(0, 11)
    w.trainers.opened(s)
    w.now += 5_000_000_000
    w.trainers.closed(s)
    assert [(e.connected, e.trainers) for e in w.events(q)] == [(True, 1), (False, 0)]
    assert w.trainers.streams == [] and w.store.ledger_marks == 1
    assert w.trainers.ledger().training_ns == 5_000_000_000


def test_a_second_stream_for_a_rank_is_refused_until_the_first_one_ends(w: World) -> None:
    first, second = stream(3, 11), stream(3, 22)
    for s in (first, second):
        w.trainers.opened(s)
    assert w.trainers.hello(first) == ""
    refused = w.trainers.hello(second)
    assert refused.startswith("rank 3 is already reported to this agent by trainer rank 3 (pid 11)")
    w.trainers.closed(first)
    assert w.trainers.hello(second) == ""  # the rank is free again


def hello(rank: int, schedule: str) -> TrainerDeclaration:
    return TrainerDeclaration(rank=rank, stage=rank, schedule=schedule, stages=4, microbatches=8, stages_per_rank=1)


def test_the_newest_hello_of_a_rank_wins_and_only_the_latest_ranks_are_kept(w: World) -> None:
    for rank in range(MAX_DECLARED + 2):
        w.trainers.declared(hello(rank, "1F1B"))
    w.trainers.declared(hello(5, "GPipe"))
    kept = w.trainers.declarations()
    assert len(kept) == MAX_DECLARED
    assert [d.rank for d in kept[:2]] == [2, 3]  # ranks 0 and 1, the oldest, went
    assert (kept[-1].rank, kept[-1].schedule) == (5, "GPipe")  # a rank's new hello is its newest


def test_the_rings_wake_the_agent_only_while_an_edge_can_lead_to_a_grant_or_an_admission(w: World) -> None:
    s, ring = stream(0, 11), Ring()
    w.trainers.opened(s)
    w.trainers.moved(s, ring)
    w.trainers.demand(True)
    w.trainers.demand(True)  # told once per change
    w.trainers.demand(False)
    assert ring.told == [True, False]
    w.table.runtime("1").waiting = "queued"  # a task waits: the free-memory hint on START edges may admit it
    w.trainers.task_changed()
    assert ring.told == [True, False] and len(w.soon) == 1  # listening the next turn, not inside the change
    w.soon.pop()()
    assert ring.told == [True, False, True] and w.trainers.listening
    w.trainers.read()
    assert ring.pumped == 1
    w.trainers.ring_closing(s)
    w.trainers.demand(False)
    w.table.live.clear()
    w.trainers.task_changed()
    assert ring.told == [True, False, True]  # a closing ring is told nothing more


def test_an_edge_whose_free_memory_hint_changed_admits_a_waiting_task_and_others_do_not(w: World) -> None:
    w.scheduler.add_task(TaskSlot("1", 0, FakeWindow(), Counters()))
    w.table.runtime("2").waiting = "waiting for memory"
    w.trainers.edge(Edge(True, True, 0, 0, 0, w.now, free_memory_bytes=1 << 30))
    w.trainers.edge(Edge(False, True, 0, 0, 0, w.now + 10))
    w.trainers.edge(Edge(True, True, 0, 0, 1, w.now + 20, free_memory_bytes=1 << 30))  # the same hint
    assert w.admitted == 1
    assert w.scheduler.gpu.bubbles == 1 and w.scheduler.trainer_free_memory_bytes == 1 << 30
