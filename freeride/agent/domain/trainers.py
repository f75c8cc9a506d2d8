"""Trainer streams: one record per connected training rank.

A `TrainerLink` (freeride.agent.edge.trainer_link) keeps a `TrainerStream` per ReportBubbles call: a
plain record of what stats report. If the trainer is on this host it may also get a ring
(freeride.agent.edge.ring) whose records are checked exactly as the stream's messages are
(freeride.agent.edge.bubble_checks) before they become `Edge`s.
`path` says which road the edges take, for `freeride stats` and /metrics.
`RankClaims` keeps one stream per rank: the scheduler's bubbles are keyed by rank, and two trainers
interleaving edges of one rank lost bubbles and opened more windows than there were bubbles.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger("freeride.agent")

GRPC = "grpc"
SHM = "shm"


class RingPort(Protocol):
    """A trainer's attached ring, as the agent drives it (freeride.agent.edge.ring.RingChannel)."""

    def pump(self) -> None:
        """Take what the trainer has written and the agent not yet read, so that an answer is current."""

    def listen(self, wanted: bool) -> None:
        """Ask for a wake-up per edge (True) or be quiet (False)."""


@dataclass(slots=True)
class TrainerStream:
    peer: str
    rank: int = 0
    stage: int = 0
    pid: int = 0  # the training process, from its hello
    hello: bool = False  # it said hello: `rank` is its own, and its edges must carry it
    path: str = GRPC
    edges: int = 0
    rejected: int = 0  # out of bounds, torn or scribbled
    dropped: int = 0  # dropped by the trainer: its ring was full
    torn: int = 0  # ring records that failed their check word (included in `rejected`)
    warned: bool = False  # the first rejection is logged, the rest only counted

    @property
    def name(self) -> str:
        """How logs and `freeride stats` name it: rank and pid (a unix socket's peer says only "unix:")."""
        if not self.hello:
            return f"{self.peer} (no hello yet)"
        where = "" if self.peer.startswith("unix:") else f", {self.peer}"
        return f"rank {self.rank} (pid {self.pid}{where})"

    def reject(self, problem: str, count: int = 1) -> None:
        self.rejected += count
        if not self.warned:  # once per stream: a broken trainer must not flood the log
            self.warned = True
            log.warning("trainer %s: bubble edge rejected: %s; further rejections on this stream are only "
                        "counted (rejected_events)", self.name, problem)


class RankClaims:
    """Which open stream reports each rank. A second stream claiming a rank that another holds is refused; the
    refusal is logged once per refused process while the holder holds the rank (its reporter keeps retrying)."""

    def __init__(self) -> None:
        self._holders: dict[int, TrainerStream] = {}
        self._said: set[tuple[int, int]] = set()  # (rank, pid) refusals already logged

    def claim(self, stream: TrainerStream) -> str:
        """Give `stream` its hello's rank; if another stream holds it, what the refusal says (else "")."""
        holder = self._holders.get(stream.rank)
        if holder is None or holder is stream:
            self._holders[stream.rank] = stream
            return ""
        problem = (f"rank {stream.rank} is already reported to this agent by trainer {holder.name}; each rank "
                   "reports through one stream (a second job on this GPU with the same rank, or a restarted one "
                   "whose old process still runs?): this one goes on unharvested until that one ends")
        if (stream.rank, stream.pid) not in self._said:
            self._said.add((stream.rank, stream.pid))
            log.warning("trainer %s refused: %s; its retries are not logged", stream.name, problem)
        return problem

    def release(self, stream: TrainerStream) -> None:
        if self._holders.get(stream.rank) is stream:
            del self._holders[stream.rank]
            self._said = {said for said in self._said if said[0] != stream.rank}

