"""The trainers on one GPU: their streams, rings, rank claims, hellos and counters, kept in one place.

Each connected trainer's link (freeride.agent.edge.trainer_link) reports here, and only here:
  streams     the `TrainerStream` record of each stream open now, and the training time (the time with one
              open or more, freeride.agent.control.training) that goes into the GPU's ledger;
  ranks       one stream per rank (`RankClaims`), and each rank's last hello, kept after its stream ends so that
              `freeride profile` of a finished job knows the schedule of the bubbles still in the history;
  rings       the attached rings (`RingPort`), read late for an answer that must be current (`read`);
  listening   whether the rings wake the agent per edge: only while an edge can lead to a grant (a task could
              take a window or holds one) or to an admission (a task waits for the trainer's free memory); else
              the edges wait in the rings (see freeride.agent.edge.ring);
  rejected    bubble edges refused at the edge (out of bounds, another rank's, torn ring records).
Edges go on to the scheduler; one that changes the trainer's free-memory hint may admit a waiting task.
All on the agent's loop.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable

from freeride.agent.control.scheduler import Scheduler
from freeride.agent.control.training import TrainingTime
from freeride.agent.domain.events import Edge, TrainerChanged, TrainerDeclaration
from freeride.agent.domain.model import Counters
from freeride.agent.domain.trainers import RankClaims, RingPort, TrainerStream
from freeride.agent.engine.pubsub import Hub
from freeride.agent.engine.tasks import TaskTable
from freeride.agent.state.store import Store

MAX_DECLARED = 1024  # ranks whose hello is kept


class Trainers:
    """The trainers' side of one agent: what the links report, what stats and the history show of them."""

    def __init__(self, clock: Callable[[], int], events: Hub, scheduler: Scheduler, table: TaskTable, store: Store,
                 admit: Callable[[], None], call_soon: Callable[[Callable[[], None]], object]) -> None:
        """`admit`: try the tasks that wait (the trainer's free memory changed); `call_soon`: the loop's."""
        self.clock = clock  # CLOCK_MONOTONIC in ns: the clock trainers stamp bubble edges with
        self._events = events
        self._scheduler = scheduler
        self._table = table
        self._store = store
        self._admit = admit
        self._call_soon = call_soon
        self.streams: list[TrainerStream] = []  # one per trainer stream open now
        self._rings: dict[int, RingPort] = {}  # the attached rings, by id() of their stream
        self._declared: OrderedDict[int, TrainerDeclaration] = OrderedDict()  # bounded: the oldest rank goes
        self._ranks = RankClaims()  # which stream reports each rank
        self.listening = False
        self.rejected_events = 0
        self.training = TrainingTime(clock)  # time with a trainer stream open, into the ledger

    # -- what the links report -----------------------------------------------------------------------
    def opened(self, stream: TrainerStream) -> None:
        """Keep the stream's record and say so to watchers (`top`, tests): no poll needed to see one come."""
        self.streams.append(stream)
        self.training.opened()
        self._publish(stream, True)

    def hello(self, stream: TrainerStream) -> str:
        """The stream said who it is: "" when its rank is its own now, else why it is refused."""
        return self._ranks.claim(stream)

    def declared(self, declaration: TrainerDeclaration) -> None:
        """A rank said hello: keep what it declared of its pipeline (the newest hello of a rank wins)."""
        self._declared.pop(declaration.rank, None)
        self._declared[declaration.rank] = declaration
        if len(self._declared) > MAX_DECLARED:
            self._declared.popitem(last=False)

    def moved(self, stream: TrainerStream, ring: RingPort) -> None:
        """The stream's edges changed road: its ring was attached, which the agent reads and wakes from now."""
        self._rings[id(stream)] = ring
        self._publish(stream, True)

    def edge(self, edge: Edge) -> None:
        """A checked bubble edge, to the scheduler; a new free-memory hint may admit a task that waits for it."""
        hint = self._scheduler.trainer_free_memory_bytes
        self._scheduler.on_bubble(edge)
        if self._scheduler.trainer_free_memory_bytes != hint and self._table.waiting_count():
            self._admit()

    def rejected(self, count: int = 1) -> None:
        """`count` bubble edges were refused at the edge."""
        self.rejected_events += count

    def ring_closing(self, stream: TrainerStream) -> None:
        """The stream's ring is being closed: no more reads or wake-ups of it from here."""
        self._rings.pop(id(stream), None)

    def gone(self, rank: int) -> None:
        """A rank the closed stream reported: its open bubble ends unharvested."""
        self._scheduler.trainer_gone(rank)

    def closed(self, stream: TrainerStream) -> None:
        self._rings.pop(id(stream), None)
        self._ranks.release(stream)
        self.streams.remove(stream)
        self.training.closed(self._scheduler.gpu)
        self._store.mark_dirty(set(), ledger=True)
        self._publish(stream, False)

    def _publish(self, stream: TrainerStream, connected: bool) -> None:
        self._events.publish(TrainerChanged(self.clock(), connected, stream.peer, len(self.streams), stream.path))

    # -- listening -----------------------------------------------------------------------------------
    def demand(self, wanted: bool) -> None:
        """The scheduler's edges matter from now (True) or not: listen while they do or while a task waits."""
        self._listen(wanted or self._waits())

    def task_changed(self) -> None:
        """A task changed: quiet at once if no edge matters any more (nothing is read); listening the next turn
        if one does (the rings are read first, and that would nest in the change)."""
        if (wanted := self._scheduler.wants_edges or self._waits()) != self.listening:
            if wanted:
                self._call_soon(self._relisten)
            else:
                self._listen(False)

    def _waits(self) -> bool:
        """A task waits for memory or a worker slot: the trainer's free-memory hint (START edges) may admit it."""
        return self._table.waiting_count() > 0

    def _relisten(self) -> None:
        self._listen(self._scheduler.wants_edges or self._waits())

    def _listen(self, wanted: bool) -> None:
        """Wake per edge from now (True) or be quiet (False); each ring reads what it holds on the way."""
        if wanted == self.listening:
            return
        self.listening = wanted
        for ring in list(self._rings.values()):
            ring.listen(wanted)

    # -- what answers show ---------------------------------------------------------------------------
    def read(self) -> None:
        """Take what the trainers wrote and the agent has not read yet (a quiet agent reads late)."""
        for ring in list(self._rings.values()):
            ring.pump()

    def ledger(self) -> Counters:
        """The GPU's ledger (the live one) with the training time so far folded in."""
        return self.training.fold(self._scheduler.gpu)

    def declarations(self) -> list[TrainerDeclaration]:
        """Each rank's last hello, oldest first."""
        return list(self._declared.values())

    def stream_copies(self) -> tuple[TrainerStream, ...]:
        """The open streams' records as they are now (for an answer that leaves the loop)."""
        return tuple(dataclasses.replace(t) for t in self.streams)
