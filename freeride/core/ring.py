"""The bubble ring: trainer -> agent edges through shared memory on one host.

The agent owns a file in its runtime directory: a 256-byte header and a power-of-two number of
64-byte records. One trainer rank writes (the training thread, in the hook), the agent reads
(its event loop). A record is eight little-endian int64 words, written by one `pack_into` in
address order:

    edge | kind << 8 | (stands_for - 1) << 16, slot, iteration, time_ns, expected_duration_ns,
    free_memory_bytes, check, commit

`stands_for`: how many iterations the edge's step stands for, 1 unless the trainer timed only some steps
while the agent was quiet (freeride.trainer.waits, `quiet_sample_ns`); the agent weights its bubble
counters by it. A writer passes it in the `kind` argument's upper bits (`kind_word`), at most MAX_STANDS_FOR;
the agent also bounds the time it weights by what has passed (freeride.agent.control.idle).

`commit` (the record's position + 1) is stored last, then the header's `head` (records written),
so a trainer killed mid-write leaves a record the reader never takes; `check` (the other words
XORed with a constant) turns away a record seen half-written on a weakly ordered CPU or scribbled
by someone else. The reader trusts `head` only within one ring of its tail, and a lap only when the
newest record proves it, so a scribbler can cost edges (counted) but never stall or derail it. Nothing is allocated and
nothing blocks in the hook: a full ring drops the edge and counts it in the header.

Wake-ups go through an eventfd the agent hands over (see `freeride.agent.edge.ring`). The agent
marks in `sleep` an odd generation while it waits for edges (even while it is awake and reading,
or quiet); the trainer writes the eventfd after an edge only if the word is odd, or if the edge
found half the ring unread. Quiet is for an agent with nothing to grant (no task could use a
bubble): it leaves the word even while it waits, so edges go into the ring for the profile and
wake nobody; it reads them when it wakes for another reason (a task becomes schedulable, a
Stats call) or when the half-full wake-up comes, well before the ring could drop one. Seen even, the agent looked
awake, but that read may have passed the trainer's own record on its way out (x86 lets a load
overtake an earlier store), and the agent, just going to sleep, may have missed the record in
turn: so the trainer puts a locked instruction (an uncontended lock's acquire and release: a
full fence on x86) between the two and reads again before it skips the wake-up. The agent
fences the same way between announcing its wait and checking for records. The fence costs only
when the agent is awake; where a locked instruction is no full fence (not x86) the trainer wakes
the agent on every edge, which is always correct.

A quiet agent also sets the header's `quiet` word (1; 0 while it asks for a wake-up per edge), so
that a trainer may keep its edges and write many together (`put_many`): one pass over the shared
page instead of one per edge, which is most of what an instrumented step costs while nothing is
harvested. The trainer reads the word when it writes (freeride.trainer.waits says how late it may
be). `put_many` packs each contiguous run of records in one call, in address order (each commit
word after its record's fields), publishes `head` once after them, and wakes as `put` would have
for any of its records (the agent sleeping, or a record that found half the ring unread).
"""

from __future__ import annotations

import functools
import mmap
import os
import platform
import struct
import threading
from typing import NamedTuple

MAGIC = 0x46524545_52494445  # "FREERIDE"
VERSION = 1
HEADER_BYTES = 256
RECORD_BYTES = 64
DEFAULT_RECORDS = 16384  # 1 MiB: a burst of edges while the agent is busy; the trainer may ask for other sizes
MIN_RECORDS, MAX_RECORDS = 64, 1 << 20

# Header words (int64 index). The agent's words and the trainer's sit on separate cache lines.
W_MAGIC, W_VERSION, W_RECORDS = 0, 1, 2
W_TAIL, W_SLEEP, W_QUIET = 8, 9, 10  # agent: records consumed; wait generation (odd: waiting in epoll); quiet (1)
W_DROPPED, W_HEAD = 16, 17  # trainer: edges dropped because the ring was full; records written

EDGE_START, EDGE_END = 1, 2
# freeride.v1.BubbleKind's numbers, here so that the trainer side need not import protobuf (nor grpc) on the training
# thread (tests/unit/agent/edge/test_ring.py checks they are the generated enum's)
KIND_FILL, KIND_WARMUP, KIND_DRAIN, KIND_COOLDOWN, KIND_BETWEEN_STEPS = 1, 2, 3, 4, 5
KINDS = frozenset((0, KIND_FILL, KIND_WARMUP, KIND_DRAIN, KIND_COOLDOWN, KIND_BETWEEN_STEPS))  # 0: unspecified
MAX_STANDS_FOR = 1 << 20  # iterations one timed step may stand for (a trainer times one in seconds at least)
_RECORD = struct.Struct("<8q")
_CHECK = 0x5A5A_A5A5_0F0F_F0F0
_ONE = (1).to_bytes(8, "little")

# A locked instruction is a full fence on x86 only: elsewhere the trainer wakes on every edge.
ORDERED_FENCE = platform.machine().lower() in {"x86_64", "amd64", "i386", "i686"}


def ring_bytes(records: int) -> int:
    return HEADER_BYTES + records * RECORD_BYTES


def ring_records(wanted: int) -> int:
    """The power of two at or above `wanted`, within MIN_RECORDS..MAX_RECORDS (0: the default)."""
    if wanted <= 0:
        return DEFAULT_RECORDS
    return min(MAX_RECORDS, max(MIN_RECORDS, 1 << (wanted - 1).bit_length()))


def init_ring(fd: int, records: int) -> None:
    """Size a fresh file and write its header (agent side, before anyone maps it)."""
    if records <= 0 or records & (records - 1):
        raise ValueError(f"ring records must be a power of two, not {records}")
    size = ring_bytes(records)
    os.ftruncate(fd, size)
    os.pwrite(fd, bytes(size), 0)  # allocate every page now: none is first touched in a hook
    os.pwrite(fd, struct.pack("<3q", MAGIC, VERSION, records), 0)


def map_ring(fd: int, size: int) -> mmap.mmap:
    """Map with the page tables filled in (MAP_POPULATE where there is one): no page fault in a hook."""
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(fd, size, flags=flags)


class RingError(Exception):
    """The mapped file is not a ring of this version."""


def _words(mm: mmap.mmap) -> memoryview:
    if len(mm) < HEADER_BYTES:
        raise RingError(f"a ring needs at least {HEADER_BYTES} bytes, this one has {len(mm)}")
    words = memoryview(mm).cast("q")
    if words[W_MAGIC] != MAGIC or words[W_VERSION] != VERSION:
        words.release()
        raise RingError("not a freeride bubble ring of this version (agent and trainer from different releases?)")
    records = words[W_RECORDS]
    if records <= 0 or records & (records - 1) or ring_bytes(records) > len(mm):
        words.release()
        raise RingError(f"ring header says {records} records, which does not fit its {len(mm)} bytes")
    return words


class RingWriter:
    """Trainer side: `put` costs a couple of microseconds, never blocks, allocates nothing the GC tracks."""

    def __init__(self, mm: mmap.mmap, wake_fd: int) -> None:
        self._mm = mm
        self._words = _words(mm)
        self._records = self._words[W_RECORDS]
        self._mask = self._records - 1
        self._half = self._records // 2  # an edge that finds this many unread wakes the agent, quiet or not
        self.wake_fd = wake_fd
        self._fence = threading.Lock()  # never contended: one producer per ring
        self._always_wake = not ORDERED_FENCE
        self.written = 0
        self.dropped = 0
        self.wakes = 0

    @property
    def queued(self) -> int:
        """Edges written and not yet taken by the agent."""
        return self.written - self._words[W_TAIL]

    def put(self, edge: int, slot: int, iteration: int, now: int, expected: int, free: int, kind: int) -> None:
        words = self._words
        pos = self.written
        unread = pos - words[W_TAIL]
        if unread > self._mask:  # full (or a scribbled tail): drop, never wait
            self.dropped += 1
            words[W_DROPPED] = self.dropped
            return
        commit = pos + 1
        edge_kind = edge | kind << 8
        check = commit ^ edge_kind ^ slot ^ iteration ^ now ^ expected ^ free ^ _CHECK
        _RECORD.pack_into(self._mm, HEADER_BYTES + (pos & self._mask) * RECORD_BYTES, edge_kind, slot, iteration, now,
                          expected, free, check, commit)
        words[W_HEAD] = commit
        self.written = commit
        if unread != self._half and not words[W_SLEEP] & 1 and not self._always_wake:  # awake: sure, after a fence?
            fence = self._fence
            fence.acquire()
            fence.release()
            if not words[W_SLEEP] & 1:
                return
        self.wakes += 1
        os.write(self.wake_fd, _ONE)

    @property
    def capacity(self) -> int:
        """Records the ring holds."""
        return self._mask + 1

    @property
    def quiet(self) -> bool:
        """The agent has nothing to grant: edges may be held and written together (`put_many`)."""
        return self._words[W_QUIET] == 1

    def put_many(self, edges: list[tuple[int, int, int, int, int, int, int]]) -> None:
        """`put` for each (edge, slot, iteration, now, expected, free, kind), in order, in one `pack_into` per
        contiguous run of records (two at most: the ring's end, then its start); `head` is published once, after
        every commit word. What a full ring cannot take is dropped and counted, the newest first."""
        words, mask = self._words, self._mask
        first = pos = self.written
        room = mask + 1 - (pos - words[W_TAIL])
        n = max(0, min(len(edges), room, mask + 1))
        if n < len(edges):
            self.dropped += len(edges) - n
            words[W_DROPPED] = self.dropped
        if n == 0:
            return
        flat: list[int] = []
        for edge, slot, iteration, now, expected, free, kind in edges[:n] if n < len(edges) else edges:
            pos += 1
            edge_kind = edge | kind << 8
            flat += (edge_kind, slot, iteration, now, expected, free,
                     pos ^ edge_kind ^ slot ^ iteration ^ now ^ expected ^ free ^ _CHECK, pos)
        at = first & mask
        run = min(n, mask + 1 - at)
        _records(run).pack_into(self._mm, HEADER_BYTES + at * RECORD_BYTES, *flat[: 8 * run])
        if run < n:
            _records(n - run).pack_into(self._mm, HEADER_BYTES, *flat[8 * run:])
        words[W_HEAD] = pos
        self.written = pos
        # put's wake rule, for the batch (put keeps its copy inline: it is the hook's hot path, one call less)
        unread = mask + 1 - room  # what the first record found unread
        if not unread <= self._half < unread + n and not words[W_SLEEP] & 1 and not self._always_wake:
            fence = self._fence
            fence.acquire()
            fence.release()
            if not words[W_SLEEP] & 1:
                return
        self.wakes += 1
        os.write(self.wake_fd, _ONE)


@functools.lru_cache(maxsize=64)
def _records(n: int) -> struct.Struct:
    """`n` records' words, packed in one call (in address order: each record's commit word after its fields)."""
    return struct.Struct(f"<{8 * n}q")


class Record(NamedTuple):
    edge: int
    kind: int
    slot: int
    iteration: int
    time_ns: int
    expected_duration_ns: int
    free_memory_bytes: int
    stands_for: int = 1  # iterations the edge's step stands for (see the module's note)


def kind_word(kind: int, stands_for: int) -> int:
    """The `kind` argument of put/put_many for an edge whose step stands for `stands_for` iterations."""
    return kind | (stands_for - 1) << 8


class RingReader:
    """Agent side: takes committed records in order; says when it is going to wait."""

    def __init__(self, mm: mmap.mmap) -> None:
        self._mm = mm
        self._words = _words(mm)
        self._mask = self._words[W_RECORDS] - 1
        self._fence = threading.Lock()
        self.tail = 0
        self.corrupt = 0  # published records that failed their commit or check word (torn or scribbled)
        self.lost = 0  # records the writer overwrote unread (it lapped a scribbled tail)
        self._gen = 0
        self._words[W_TAIL] = 0
        self._words[W_SLEEP] = 0
        self._words[W_QUIET] = 0

    @property
    def dropped_by_writer(self) -> int:
        return max(0, self._words[W_DROPPED])

    def take(self, limit: int = 1 << 30) -> list[Record]:
        """Published records from the tail on (at most `limit`), in order; the tail moves past them."""
        out: list[Record] = []
        words, mask = self._words, self._mask
        tail = self.tail
        head = words[W_HEAD]
        if head - tail > mask + 1 and self._record(head - 1) is not None:
            # The writer lapped us (someone scribbled our tail word): what it overwrote is lost.
            self.lost += head - (mask + 1) - tail
            tail = head - (mask + 1)
        elif not tail <= head <= tail + mask + 1:
            head = tail  # a scribbled head: nothing is trusted until the writer's next edge rewrites it
        while tail < head and len(out) < limit:
            record = self._record(tail)
            tail += 1
            if record is None:
                self.corrupt += 1
            else:
                out.append(record)
        self.tail = tail
        words[W_TAIL] = tail
        return out

    def _record(self, pos: int) -> Record | None:
        """The record written at position `pos`, or None if it is not whole (commit or check word wrong)."""
        edge_kind, slot, iteration, time_ns, expected, free, check, commit = _RECORD.unpack_from(
            self._mm, HEADER_BYTES + (pos & self._mask) * RECORD_BYTES)
        if commit != pos + 1 or edge_kind < 0 \
                or check != commit ^ edge_kind ^ slot ^ iteration ^ time_ns ^ expected ^ free ^ _CHECK:
            return None
        return Record(edge_kind & 0xFF, (edge_kind >> 8) & 0xFF, slot, iteration, time_ns, expected, free,
                      (edge_kind >> 16) + 1)

    def awake(self) -> None:
        """The agent was woken: edges written from now need no wake-up until `sleep`."""
        if self._gen & 1:
            self._gen += 1
            self._words[W_SLEEP] = self._gen

    def quiet(self) -> None:
        """Wait without a wake-up per edge (the word stays even): edges wait in the ring until the agent
        reads for another reason, or one finds the ring half unread and wakes it. No fence is needed:
        an edge that slips past this call is read at the next wake-up, as every quiet edge is. The
        `quiet` word tells the trainer it may keep its edges and write them together."""
        self.awake()
        self._words[W_QUIET] = 1

    def sleep(self) -> bool:
        """Announce a wait; False when a record slipped in first (take it, then call again)."""
        if not self._gen & 1:
            self._gen += 1
        self._words[W_QUIET] = 0  # listening: each edge as it comes (a trainer keeping edges sees it at its next write)
        self._words[W_SLEEP] = self._gen
        self._fence.acquire()  # store (sleep) -> load (commit) ordering
        self._fence.release()
        return self._words[W_HEAD] == self.tail

    def release(self) -> None:
        """Drop the view into the mapping (before the mapping is closed)."""
        self._words.release()
