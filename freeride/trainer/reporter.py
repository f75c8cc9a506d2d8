"""The training-side reporter: bubble edges go to the agent without ever blocking training.

Two roads, chosen automatically. On the agent's host (a unix-socket target) the agent hands over
a shared-memory ring (freeride.core.ring) and the training thread writes each edge there itself:
one 64-byte record, and an eventfd write only when the agent waits; no other thread touches the
edge. Otherwise (a TCP agent, an agent started with --bubble-path grpc, a ring that could not be
fetched) the training thread writes seven integers into a preallocated queue slot and a
background thread sends them over the gRPC stream.

Either way: no allocation of a garbage-collected object in the hook (so no GC pause lands in it),
no lock it can block on, and no exception that reaches the training loop. The background thread
owns the gRPC stream (registration, liveness, the fallback), loads gRPC and protobuf itself (once an
agent's socket is there: the training thread never waits for them), reconnects with backoff and,
after an agent restart, attaches the new agent's ring; edges are dropped (and counted) while no
agent is there, and the reporter says the agent is quiet then (`agent_quiet`), so an integration
samples its steps as for an agent with nothing to grant.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from freeride.core.ring import EDGE_END, EDGE_START, KINDS, MAX_STANDS_FOR, RingWriter, kind_word
from freeride.trainer._sender import Sender
from freeride.trainer.declaration import Pipeline

if TYPE_CHECKING:
    import grpc

log = logging.getLogger(__name__)

START, END = EDGE_START, EDGE_END  # freeride.v1.BubbleEdge's numbers (the ring carries the same)
PATHS = ("auto", "grpc")
_HOLD_MAX = 256  # edges held at most before they are written (a quarter of a small ring at most: see hold)
# The kinds the agent takes (freeride.agent.edge.bubble_checks.KINDS): any other number would be refused there, and
# on the ring its upper bits would read as a weight (ring.kind_word), so the reporter refuses it first.
_KINDS = KINDS


def _is_kind(kind: object) -> bool:
    """A freeride.v1.BubbleKind number (never raises: an unhashable `kind` is none)."""
    try:
        return isinstance(kind, int) and kind in _KINDS
    except TypeError:
        return False


class BubbleReporter(Sender):
    """Report bubble START/END for one training rank to the agent of its GPU.

    `start(slot)` / `end(slot)` cost microseconds and never raise; `bubble(slot)` is a context
    manager around a wait. Edges are dropped (and counted in `dropped`) when the ring is full or
    no agent is connected: training never waits for freeride. One training thread per reporter
    (the ring has a single producer). `path="grpc"` (or $FREERIDE_BUBBLE_PATH=grpc) keeps the
    edges on the gRPC stream even on the agent's host; the `path` attribute says which road they
    take now.
    """

    def __init__(
        self,
        target: str,
        rank: int = 0,
        stage: int = 0,
        max_queue: int = 16384,
        reconnect_min_s: float = 0.1,
        reconnect_max_s: float = 5.0,
        token: str | None = None,
        path: str | None = None,
        pipeline: Pipeline | None = None,
    ) -> None:
        if path is None:  # never fail a training job over an environment variable: warn, take the default
            path = os.environ.get("FREERIDE_BUBBLE_PATH") or "auto"
            if path not in PATHS:
                log.warning("FREERIDE_BUBBLE_PATH=%r is not one of %s; using auto", path, ", ".join(PATHS))
                path = "auto"
        elif path not in PATHS:
            raise ValueError(f"path must be one of {', '.join(PATHS)}, not {path!r}")
        self.target = target
        self._token = token  # the agent's bearer token when it is reached over TCP
        self.rank = rank
        self.stage = stage
        # Said in every hello (set it before the first edge; a change takes effect at the next reconnect).
        self.pipeline = pipeline or Pipeline()
        self.iteration = 0
        self._sent = 0  # over gRPC
        self._dropped = 0  # by the gRPC queue, or while no agent is there
        self._want_ring = path == "auto" and target.startswith("unix:")
        self._shm: RingWriter | None = None  # set while the agent's ring is attached: the hooks write there
        self._wake_fd = -1  # the eventfd's number for every ring of this reporter (see _ring.fetch_ring)
        self._holding = False  # edges are held until flush(), for one write (see hold)
        self._held: list[tuple[int, int, int, int, int, int, int]] = []
        self._hold_max = _HOLD_MAX
        # Counted by the background thread (each counter has one writer thread: `+=` is no atomic step):
        self._ring_written = 0  # edges written into the rings of earlier streams
        self._ring_dropped = 0  # edges those rings were too full to take
        self._stale = 0  # edges queued for a stream that died before they were sent
        self._road = threading.Condition()  # notified whenever `path` changes
        capacity = 1 << max(4, (max_queue - 1).bit_length())  # a power of two, so `& mask` indexes it
        # The gRPC road's queue: made by the background thread when that road is first taken (before `_live`, which
        # the hooks check first), never on the training thread, and never on the ring's road: 16k small lists cost
        # ~5 ms to make and weigh on every full garbage collection of the training process after.
        self._ring: list[list[int]] = []
        self._mask = capacity - 1
        self._head = 0  # next slot the sender reads (sender thread only)
        self._tail = 0  # next slot the trainer writes (training thread only)
        self._signal = threading.Lock()  # held while the sender has nothing to do
        self._signal.acquire()
        self._sleeping = False
        self._connected = threading.Event()
        self._live = False  # a plain bool: the hot path must not call Event.is_set()
        self._closed = False
        self._stopping = threading.Event()
        self._backoff = (reconnect_min_s, reconnect_max_s)
        self._warned = False
        self.refused_edges = 0  # edges whose kind or weight was not one the agent takes: dropped here
        self._warned_kind = False
        self.refused = ""  # why the agent refused this rank (another stream reports it), until it accepts it
        self.refusals = 0  # how many times it did (the reporter keeps trying in the background)
        self._generation = 0
        self._call: grpc.Future | None = None
        self._thread = threading.Thread(target=self._run, name=f"freeride-reporter-{rank}", daemon=True)
        self._thread.start()

    # -- training thread -----------------------------------------------------------------------------
    def set_iteration(self, iteration: int) -> None:
        """The training iteration that following edges belong to."""
        self.iteration = iteration

    def hold(self) -> bool:
        """While the agent's ring says it is quiet (nothing to grant), or no agent is there at all (not connected
        yet, or reconnecting: the edges would be dropped one by one), hold the edges from now on and write them
        together at `flush()`: one pass over the shared page instead of one per edge, on caches the compute has
        just evicted. Once the agent listens, what is held is written at once and edges go straight to the ring
        again. The integrations' tracker calls it (freeride.trainer.waits); one thread calls hold, flush, start
        and end (the training thread, or the thread that stamps the edges). True: holding."""
        shm = self._shm
        holding = self._holding = shm.quiet if shm is not None else not self._live
        if not holding:
            if self._held:
                self.flush()
        elif shm is not None:
            self._hold_max = min(_HOLD_MAX, shm.capacity // 4)
        return holding

    def flush(self) -> None:
        """Write the held edges now (in one pass)."""
        held = self._held
        if not held:
            return
        self._held = []
        shm = self._shm
        try:
            if shm is None:
                raise ConnectionError("the agent's ring went away")
            shm.put_many(held)
        except Exception:  # never into training: the ring went with its agent; counted as dropped
            self._dropped += len(held)

    # start() and end() are written out in full rather than sharing a helper: one more Python
    # call costs a fraction of a microsecond warm and more after the thread slept (cold caches).
    def start(self, slot: int, kind: int = 0, expected_duration_ns: int = 0, free_memory_bytes: int = 0,
              time_ns: int = 0, stands_for: int = 1) -> None:
        """The rank is about to wait: its GPU is idle from now (or from `time_ns`, CLOCK_MONOTONIC, if given).
        `kind`: a freeride.v1.BubbleKind (another number is refused: the edge is dropped and counted in
        `refused_edges`). `stands_for`: the iterations this step stands for, 1 unless untimed ones came before it."""
        now = time_ns or time.monotonic_ns()
        # (off the hot path: a quiet step's weight, or a mistake; the class first: `in` raises for an unhashable)
        if stands_for != 1 or kind.__class__ is not int or kind not in _KINDS:
            kind = self._kind_word(kind, stands_for)
            if kind < 0:
                return
        if self._holding:
            held = self._held
            held.append((START, slot, self.iteration, now, expected_duration_ns, free_memory_bytes, kind))
            if len(held) >= self._hold_max:
                self.flush()
            return
        shm = self._shm
        try:
            if shm is not None:
                shm.put(START, slot, self.iteration, now, expected_duration_ns, free_memory_bytes, kind)
                return
            tail = self._tail
            if not self._live or tail - self._head > self._mask:
                self._dropped += 1
                return
            rec = self._ring[tail & self._mask]
            rec[0] = START
            rec[1] = slot
            rec[2] = self.iteration
            rec[3] = now
            rec[4] = expected_duration_ns
            rec[5] = free_memory_bytes
            rec[6] = kind
            self._tail = tail + 1
            if self._sleeping:  # wake the sender; a bare lock release never drops the GIL
                self._sleeping = False
                self._signal.release()
        except Exception:  # never into training: a slot that is no integer, a racing second release (sent)
            if shm is not None:
                self._dropped += 1

    def end(self, slot: int, kind: int = 0, time_ns: int = 0, stands_for: int = 1) -> None:
        """The wait is over: the GPU is needed again from now (or from `time_ns`); `kind` and `stands_for` as
        its `start` said them."""
        now = time_ns or time.monotonic_ns()
        if stands_for != 1 or kind.__class__ is not int or kind not in _KINDS:
            kind = self._kind_word(kind, stands_for)
            if kind < 0:
                return
        if self._holding:
            held = self._held
            held.append((END, slot, self.iteration, now, 0, 0, kind))
            if len(held) >= self._hold_max:
                self.flush()
            return
        shm = self._shm
        try:
            if shm is not None:
                shm.put(END, slot, self.iteration, now, 0, 0, kind)
                return
            tail = self._tail
            if not self._live or tail - self._head > self._mask:
                self._dropped += 1
                return
            rec = self._ring[tail & self._mask]
            rec[0] = END
            rec[1] = slot
            rec[2] = self.iteration
            rec[3] = now
            rec[4] = 0
            rec[5] = 0
            rec[6] = kind
            self._tail = tail + 1
            if self._sleeping:
                self._sleeping = False
                self._signal.release()
        except Exception:
            if shm is not None:
                self._dropped += 1

    def _kind_word(self, kind: int, stands_for: int) -> int:
        """The ring's kind word for a checked kind and weight (ring.kind_word), or -1: refused, counted, said once."""
        if _is_kind(kind) and type(stands_for) is int and 1 <= stands_for <= MAX_STANDS_FOR:
            return kind_word(int(kind), stands_for)
        self.refused_edges += 1
        if not self._warned_kind:
            self._warned_kind = True
            problem = (f"stands_for {stands_for!r} is not an iteration count in 1..{MAX_STANDS_FOR}"
                       if _is_kind(kind) else
                       f"kind {kind!r} is not a freeride.v1.BubbleKind ({', '.join(map(str, sorted(_KINDS)))})")
            log.warning("rank %d: bubble edge refused: %s; such edges are dropped (training goes on) and counted in "
                        "BubbleReporter.refused_edges; this is said once", self.rank, problem)
        return -1

    @contextlib.contextmanager
    def bubble(self, slot: int, kind: int = 0) -> Iterator[None]:
        self.start(slot, kind)
        try:
            yield
        finally:
            self.end(slot, kind)

    @property
    def queued(self) -> int:
        """Edges written by the trainer and not yet sent (or, on the ring, not yet taken by the agent)."""
        shm = self._shm
        return self._tail - self._head + len(self._held) + (shm.queued if shm is not None else 0)

    @property
    def sent(self) -> int:
        """Edges handed to the agent: sent on the stream or written into its ring."""
        shm = self._shm
        return self._sent + self._ring_written + (shm.written if shm is not None else 0)

    @property
    def dropped(self) -> int:
        """Edges dropped: no agent, a full queue or a full ring."""
        shm = self._shm
        return self._dropped + self._ring_dropped + self._stale + (shm.dropped if shm is not None else 0)

    @property
    def agent_quiet(self) -> bool:
        """No agent listens: its ring says it has nothing to grant (a read of one word), or no agent is connected
        (before the first connection, or while reconnecting: an edge would only be dropped). `hold` acts on it, and
        so does the tracker's sampling (WaitTracker.timed). On the gRPC road the agent's word is not known: False."""
        shm = self._shm
        return shm.quiet if shm is not None else not self._live

    @property
    def wakes(self) -> int:
        """Wake-ups written to the agent of the ring attached now (an agent with nothing to grant asks for none)."""
        shm = self._shm
        return shm.wakes if shm is not None else 0

    @property
    def path(self) -> str:
        """"shm" (the agent's ring), "grpc" (the stream), or "" while no agent is connected."""
        return "shm" if self._shm is not None else "grpc" if self._live else ""

    def wait_path(self, path: str, timeout_s: float) -> bool:
        """For tests and start-up: block until `path` is what is given ("shm", "grpc" or "": no agent)."""
        with self._road:
            return self._road.wait_for(lambda: self.path == path, timeout_s)

    def wait_refused(self, times: int, timeout_s: float) -> bool:
        """For tests: block until the agent has refused this rank `times` times in all."""
        with self._road:
            return self._road.wait_for(lambda: self.refusals >= times, timeout_s)

    def close(self, flush_timeout_s: float = 2.0) -> None:
        """Send what is queued, end the stream, stop the background thread."""
        self.flush()
        self._closed = True
        self._stopping.set()
        self._wake()
        self._thread.join(timeout=flush_timeout_s)
        call = self._call
        if self._thread.is_alive() and call is not None:
            call.cancel()
            self._thread.join(timeout=5)
        self._detach()
        if self._wake_fd >= 0 and not self._thread.is_alive():
            os.close(self._wake_fd)
            self._wake_fd = -1
