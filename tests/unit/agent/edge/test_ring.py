"""The bubble ring (freeride.core.ring) on a real shared mapping of a file: one writer, one reader.

The writer and the reader run in this process on the same mmap, each through its own view, as the
trainer and the agent do through their own mappings of the agent's file. Faults are injected by
writing the mapping directly: a record whose commit word never landed (a trainer killed mid-write),
a wrong check word, a scribbled tail, random bytes everywhere. Last, the agent's end of a ring
(freeride.agent.edge.ring.RingChannel) on an event loop of this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import random
import signal
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from freeride.agent.edge.bubble_checks import MAX_STANDS_FOR, record_ok
from freeride.agent.edge.ring import RingChannel
from freeride.core.ring import (
    DEFAULT_RECORDS,
    EDGE_END,
    EDGE_START,
    HEADER_BYTES,
    MAGIC,
    MAX_RECORDS,
    MIN_RECORDS,
    ORDERED_FENCE,
    RECORD_BYTES,
    VERSION,
    W_DROPPED,
    W_HEAD,
    W_QUIET,
    W_RECORDS,
    W_SLEEP,
    W_TAIL,
    Record,
    RingError,
    RingReader,
    RingWriter,
    init_ring,
    kind_word,
    map_ring,
    ring_bytes,
    ring_records,
)

RECORDS = 64  # the smallest ring: laps and a full ring come quickly
FIRST_WORD = HEADER_BYTES // 8  # the first record's first int64 word
WORDS_PER_RECORD = RECORD_BYTES // 8
CHECK, COMMIT = 6, 7  # a record's check word and its commit word (written last)
NOW = 10**12  # a plausible CLOCK_MONOTONIC stamp
STALL_S = 5.0  # a take returns in microseconds: one that has not after this long spins on a scribbled word


@contextlib.contextmanager
def returns_within(seconds: float, what: str) -> Iterator[None]:
    """Fail at once, saying so, when `what` does not return in time, rather than at pytest's 120 s timeout: a
    SIGALRM interrupts it (the reader is pure Python, so the handler runs inside its loop). A timer already
    armed (pytest-timeout's) is armed again afterwards with the time it had left."""

    def stalled(_signum: int, _frame: object) -> None:
        raise AssertionError(f"{what} did not return within {seconds:g} s: the ring reader stalls")

    before = signal.signal(signal.SIGALRM, stalled)
    left, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    began = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        if left > 0:
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, left - (time.monotonic() - began)))


@dataclass
class Ring:
    """A ring file mapped once and shared by a writer and a reader, plus the wake-up eventfd."""

    mm: mmap.mmap
    words: memoryview
    writer: RingWriter
    reader: RingReader
    wake_fd: int

    def put(self, seq: int, slot: int = 0, edge: int = EDGE_START) -> None:
        """An edge whose iteration word carries `seq`, so that order and identity can be checked."""
        self.writer.put(edge, slot, seq, NOW + seq, 1000, 2000, 0)

    def word(self, pos: int, index: int) -> int:
        return int(self.words[FIRST_WORD + (pos % RECORDS) * WORDS_PER_RECORD + index])

    def set_word(self, pos: int, index: int, value: int) -> None:
        self.words[FIRST_WORD + (pos % RECORDS) * WORDS_PER_RECORD + index] = value

    def take(self, limit: int = 1 << 30) -> list[Record]:
        """The reader's take, bounded in time: a stall fails the test in STALL_S with a clear message."""
        with returns_within(STALL_S, "RingReader.take()"):
            return self.reader.take(limit)

    def wakes_pending(self) -> int:
        """What the writer wrote to the eventfd since the last call (0: no wake-up)."""
        try:
            return int.from_bytes(os.read(self.wake_fd, 8), "little")
        except BlockingIOError:
            return 0


@pytest.fixture
def ring(tmp_path: Path) -> Iterator[Ring]:
    fd = os.open(tmp_path / "ring.shm", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    try:
        init_ring(fd, RECORDS)
        mm = map_ring(fd, ring_bytes(RECORDS))
        reader = RingReader(mm)
        writer = RingWriter(mm, wake_fd)
        words = memoryview(mm).cast("q")
        yield Ring(mm, words, writer, reader, wake_fd)
        words.release()
        reader.release()  # the writer keeps its view (a trainer's mapping lives until it exits): no mm.close()
    finally:
        os.close(wake_fd)
        os.close(fd)


def seqs(records: list[Record]) -> list[int]:
    return [r.iteration for r in records]


# -- order, capacity -------------------------------------------------------------------------------


def test_records_come_out_in_order_with_every_field_intact(ring: Ring) -> None:
    ring.writer.put(EDGE_START, 7, 41, NOW, 5_000_000, 1 << 30, 2)
    ring.writer.put(EDGE_END, 7, 41, NOW + 5_000_000, 0, 0, 2)
    assert ring.writer.queued == 2
    taken = ring.take()
    assert taken == [
        Record(EDGE_START, 2, 7, 41, NOW, 5_000_000, 1 << 30),
        Record(EDGE_END, 2, 7, 41, NOW + 5_000_000, 0, 0),
    ]
    assert all(record_ok(r, NOW + 5_000_000) for r in taken)  # the agent's bounds read the fields as written
    assert ring.writer.queued == 0 and ring.take() == []
    assert (ring.reader.corrupt, ring.reader.lost, ring.reader.dropped_by_writer) == (0, 0, 0)


def test_a_step_that_stands_for_several_says_so_beside_its_kind(ring: Ring) -> None:
    # A quiet trainer that timed one step in four: its edges carry 4 in the kind word's upper bits.
    ring.writer.put(EDGE_START, 3, 40, NOW, 0, 0, kind_word(2, 4))
    ring.writer.put_many([(EDGE_END, 3, 40, NOW + 1_000, 0, 0, kind_word(2, 4)),
                          (EDGE_START, 3, 41, NOW + 2_000, 0, 0, kind_word(2, 1))])
    taken = ring.take()
    assert [(r.kind, r.stands_for) for r in taken] == [(2, 4), (2, 4), (2, 1)]
    assert all(record_ok(r, NOW + 2_000) for r in taken)
    ring.writer.put(EDGE_START, 3, 42, NOW, 0, 0, kind_word(2, MAX_STANDS_FOR + 1))
    assert not record_ok(ring.take()[0], NOW)  # the agent refuses an absurd weight


def test_records_keep_their_order_across_many_laps_and_a_take_limit(ring: Ring) -> None:
    taken: list[int] = []
    seq = 0
    for burst in (1, 63, 64, 5, 64, 30, 64):  # written between two takes, crossing the end of the ring each lap
        for _ in range(burst):
            ring.put(seq)
            seq += 1
        first = ring.take(limit=3)  # a limited take leaves the rest for the next one
        assert len(first) == min(3, burst)
        taken += seqs(first) + seqs(ring.take())
    assert taken == list(range(seq)) and seq > 4 * RECORDS
    assert ring.writer.dropped == 0 and ring.reader.lost == 0 and ring.reader.corrupt == 0


def test_a_full_ring_drops_and_counts_and_never_overwrites_unread_records(ring: Ring) -> None:
    for seq in range(RECORDS + 10):
        ring.put(seq)
    assert ring.writer.written == RECORDS and ring.writer.dropped == 10
    assert ring.reader.dropped_by_writer == 10 and ring.words[W_DROPPED] == 10
    assert seqs(ring.take()) == list(range(RECORDS))  # the oldest 64, untouched by the 10 dropped
    # Room again: the next edges go in, and the drop count stays what it was.
    ring.put(1000)
    assert seqs(ring.take()) == [1000]
    assert ring.reader.dropped_by_writer == 10


# -- torn, scribbled, garbage ------------------------------------------------------------------------


def test_a_record_without_its_commit_word_is_never_taken_until_the_commit_lands(ring: Ring) -> None:
    ring.put(0)
    assert seqs(ring.take()) == [0]
    # A trainer killed between the payload and the commit word: words 0..6 of record 1 landed, word 7 (and the
    # header's head, written after it) did not.
    ring.put(1)
    commit = ring.word(1, COMMIT)
    ring.set_word(1, COMMIT, 0)
    ring.words[W_HEAD] = 1
    assert ring.take() == [] and ring.take() == []
    assert ring.reader.sleep() is True  # nothing committed: the agent may wait
    assert ring.reader.tail == 1 and ring.reader.corrupt == 0
    # Packed by hand, the same: the payload alone, in place, is not a record.
    ring.put(2)
    payload = [ring.word(2, i) for i in range(COMMIT)]
    struct.pack_into("<8q", ring.mm, HEADER_BYTES + 2 * RECORD_BYTES, *([0] * 8))
    struct.pack_into("<7q", ring.mm, HEADER_BYTES + 2 * RECORD_BYTES, *payload)
    ring.words[W_HEAD] = 1
    assert ring.take() == []
    # The commit words land, then the head (the writer was only slow): both records appear, in order, intact.
    ring.set_word(1, COMMIT, commit)
    ring.set_word(2, COMMIT, 3)
    ring.words[W_HEAD] = 3
    assert seqs(ring.take()) == [1, 2]
    assert ring.reader.sleep() is True and ring.reader.corrupt == 0


def test_a_record_with_a_wrong_check_word_is_skipped_and_counted_and_the_next_one_taken(ring: Ring) -> None:
    for seq in range(3):
        ring.put(seq)
    ring.set_word(1, 1, ring.word(1, 1) ^ 0x10)  # one bit of record 1's slot flipped after its check was computed
    assert seqs(ring.take()) == [0, 2]
    assert ring.reader.corrupt == 1 and ring.reader.lost == 0
    ring.put(3)
    ring.set_word(3, CHECK, 12345)  # the check word itself scribbled
    ring.put(4)
    assert seqs(ring.take()) == [4]
    assert ring.reader.corrupt == 2


def test_a_negative_edge_word_is_refused_even_with_a_matching_check(ring: Ring) -> None:
    # The check covers the words, not their meaning: edge|kind<<8 < 0 (a kind of 2**55 and more) is refused here.
    ring.writer.put(EDGE_START, 0, 0, NOW, 0, 0, -1)
    ring.put(1)
    assert seqs(ring.take()) == [1]
    assert ring.reader.corrupt == 1


def test_a_tail_scribbled_far_ahead_lets_the_writer_lap_and_the_reader_recovers(ring: Ring) -> None:
    for seq in range(5):
        ring.put(seq)
    assert seqs(ring.take()) == list(range(5))
    ring.words[W_TAIL] = 10**6  # someone wrote the agent's tail word: the writer thinks the ring is empty
    for seq in range(5, 5 + 3 * RECORDS):
        ring.put(seq)
    assert ring.writer.dropped == 0  # it lapped the reader twice instead of dropping
    taken = ring.take()
    # What was overwritten is skipped and counted; the last lap's records come out in order.
    assert seqs(taken) == list(range(5 + 2 * RECORDS, 5 + 3 * RECORDS))
    assert ring.reader.lost == 2 * RECORDS and ring.reader.corrupt == 0
    assert ring.words[W_TAIL] == ring.reader.tail == 5 + 3 * RECORDS  # the real tail is back
    # ...so the writer sees the truth again: the ring fills, and then drops.
    for seq in range(RECORDS + 1):
        ring.put(10_000 + seq)
    assert ring.writer.dropped == 1
    assert seqs(ring.take()) == list(range(10_000, 10_000 + RECORDS))


def test_a_tail_scribbled_backwards_drops_edges_until_the_reader_writes_the_tail_again(ring: Ring) -> None:
    ring.put(0)
    assert seqs(ring.take()) == [0]
    ring.words[W_TAIL] = -(10**6)  # the ring looks full to the writer
    ring.put(1)
    assert ring.writer.dropped == 1 and ring.take() == []  # dropped and counted, nothing invented
    assert ring.words[W_TAIL] == 1  # the reader's take wrote its tail back
    ring.put(2)
    assert seqs(ring.take()) == [2]
    assert ring.reader.dropped_by_writer == 1


@pytest.mark.parametrize("seed", range(8))
def test_garbage_over_the_records_and_header_never_raises_and_never_yields_a_record(ring: Ring, seed: int) -> None:
    rng = random.Random(seed)
    for seq in range(10):
        ring.put(seq)
    ring.take(limit=4)  # the reader somewhere in the middle, records unread ahead of it
    for _ in range(50):
        # Everything but the header's first three words (magic, version, record count); then a take, which
        # returns whatever the bytes (the reader's and the writer's positions live in their own memory).
        ring.mm[3 * 8:HEADER_BYTES] = rng.randbytes(HEADER_BYTES - 3 * 8)
        ring.mm[HEADER_BYTES:] = rng.randbytes(RECORDS * RECORD_BYTES)
        out = ring.take()
        assert out == []  # a 64-bit check word matched by chance: 2**-64 per record
        ring.reader.awake()
        ring.reader.sleep()
        assert ring.reader.dropped_by_writer >= 0
        ring.put(0)  # the writer, too, never raises on a scribbled header


def test_a_scribbled_commit_word_does_not_move_the_tail_and_the_ring_goes_on(ring: Ring) -> None:
    ring.put(0)
    assert seqs(ring.take()) == [0]
    # Garbage in the next record whose commit word looks like a lap ((commit - 1) % records == tail % records).
    struct.pack_into("<8q", ring.mm, HEADER_BYTES + RECORD_BYTES, 1, 2, 3, 4, 5, 6, 7, (1 << 62) + 2)
    assert ring.take() == []
    ring.put(1)  # the trainer's next edge overwrites the garbage: a good record where the reader stands
    assert ring.reader.lost == 0
    assert seqs(ring.take()) == [1]


def test_a_record_scribbled_whole_is_counted_and_the_records_after_it_still_arrive(ring: Ring) -> None:
    for seq in range(3):
        ring.put(seq)
    struct.pack_into("<8q", ring.mm, HEADER_BYTES + RECORD_BYTES, 1, 2, 3, 4, 5, 6, 7, 12345)  # record 1, unread
    taken = seqs(ring.take())
    for seq in range(3, 3 + 4 * RECORDS):  # the trainer goes on, the agent takes after each edge
        ring.put(seq)
        taken += seqs(ring.take())
    assert taken[0] == 0 and 1 not in taken
    assert taken[-1] == 2 + 4 * RECORDS  # the newest edge got through
    assert ring.reader.corrupt + ring.reader.lost >= 1  # and the scribbled record was counted


# -- the wake-up protocol ------------------------------------------------------------------------------


def test_the_writer_wakes_the_reader_only_while_it_sleeps(ring: Ring) -> None:
    ring.put(0)  # the reader has not announced a wait: no wake-up
    assert ring.wakes_pending() == 0 and ring.writer.wakes == 0
    assert seqs(ring.take()) == [0]
    assert ring.reader.sleep() is True and ring.words[W_SLEEP] % 2 == 1  # waiting: an odd generation
    ring.put(1)
    ring.put(2)
    assert ring.wakes_pending() == 2 and ring.writer.wakes == 2  # one per edge while it waits
    ring.reader.awake()  # woken: an even generation, edges need no wake-up until the next sleep
    assert ring.words[W_SLEEP] % 2 == 0
    ring.put(3)
    assert ring.wakes_pending() == (0 if ORDERED_FENCE else 1)  # (no full fence: every edge wakes)
    assert seqs(ring.take()) == [1, 2, 3]
    assert ring.reader.sleep() is True  # a new generation: the writer wakes it again
    ring.put(4)
    assert ring.wakes_pending() == 1
    assert seqs(ring.take()) == [4]


def test_sleep_says_false_when_a_record_slipped_in_before_it(ring: Ring) -> None:
    ring.put(0)
    assert ring.reader.sleep() is False  # committed before the wait was announced: take it first
    assert seqs(ring.take()) == [0]
    assert ring.reader.sleep() is True
    assert ring.wakes_pending() == 0


def test_a_second_sleep_in_the_same_wait_keeps_the_generation(ring: Ring) -> None:
    assert ring.reader.sleep() is True
    gen = ring.words[W_SLEEP]
    ring.put(0)
    assert ring.wakes_pending() == 1
    assert ring.reader.sleep() is False and ring.words[W_SLEEP] == gen  # the same wait, the same generation
    ring.put(1)
    assert ring.wakes_pending() == 1
    assert seqs(ring.take()) == [0, 1]


@pytest.mark.skipif(not ORDERED_FENCE, reason="without a full fence the writer wakes on every edge")
def test_a_quiet_reader_is_woken_by_no_edge_but_the_one_that_finds_half_the_ring_unread(ring: Ring) -> None:
    assert ring.reader.sleep() is True
    ring.reader.quiet()  # waits without a wake-up per edge: the word is even again
    assert ring.words[W_SLEEP] % 2 == 0
    for seq in range(RECORDS // 2):
        ring.put(seq)
    assert ring.wakes_pending() == 0 and ring.writer.wakes == 0  # the edges wait in the ring, unannounced
    ring.put(RECORDS // 2)  # finds half the ring unread: wakes the agent, quiet or not
    assert ring.wakes_pending() == 1
    for seq in range(RECORDS // 2 + 1, RECORDS):
        ring.put(seq)
    assert ring.wakes_pending() == 0  # one wake-up per crossing, not one per edge after it
    assert seqs(ring.reader.take()) == list(range(RECORDS))  # nothing was dropped: it read well before full
    assert ring.writer.dropped == 0
    for seq in range(RECORDS // 2 + 1):  # read: the next crossing wakes it again
        ring.put(seq)
    assert ring.wakes_pending() == 1


def test_the_half_full_edge_wakes_a_reader_that_is_awake_too(ring: Ring) -> None:
    for seq in range(RECORDS // 2):
        ring.put(seq)
    ring.wakes_pending()  # (without a full fence every edge woke it)
    ring.put(RECORDS // 2)
    assert ring.wakes_pending() == 1  # harmless: an awake agent reads on as it would have


def edges(seqs: range) -> list[tuple[int, int, int, int, int, int, int]]:
    """What `Ring.put` writes for each seq, for `put_many`."""
    return [(EDGE_START, 0, seq, NOW + seq, 1000, 2000, 0) for seq in seqs]


def test_put_many_writes_what_put_would_in_order_and_publishes_head_once_after_the_commits(ring: Ring) -> None:
    ring.put(0)
    ring.writer.put_many(edges(range(1, 6)))
    assert ring.words[W_HEAD] == ring.writer.written == 6
    assert all(ring.word(pos, COMMIT) == pos + 1 for pos in range(6))
    taken = ring.take()
    assert seqs(taken) == list(range(6)) and taken[3] == Record(EDGE_START, 0, 0, 3, NOW + 3, 1000, 2000)
    ring.writer.put_many([])  # nothing: no head store, no wake-up
    assert ring.words[W_HEAD] == 6 and ring.wakes_pending() == 0


def test_put_many_across_the_rings_end_writes_two_runs_and_every_record_arrives_whole(ring: Ring) -> None:
    for seq in range(RECORDS - 3):
        ring.put(seq)
    assert len(ring.take()) == RECORDS - 3
    ring.writer.put_many(edges(range(100, 110)))  # three records at the end, seven from the start
    taken = ring.take()
    assert seqs(taken) == list(range(100, 110)) and ring.reader.corrupt == 0
    assert [ring.word(pos, COMMIT) for pos in (RECORDS - 1, RECORDS)] == [RECORDS, RECORDS + 1]


def test_put_many_drops_and_counts_what_a_full_ring_cannot_take(ring: Ring) -> None:
    ring.writer.put_many(edges(range(RECORDS + 5)))
    assert ring.writer.dropped == ring.words[W_DROPPED] == 5
    assert seqs(ring.take()) == list(range(RECORDS))  # the oldest kept, none overwritten


def test_put_many_wakes_once_as_put_would_have_for_any_of_its_records(ring: Ring) -> None:
    assert ring.reader.sleep() is True  # waiting: one wake-up for the whole batch
    ring.writer.put_many(edges(range(3)))
    assert ring.wakes_pending() == 1
    ring.take()
    ring.reader.quiet()  # quiet: none, until a record of the batch finds half the ring unread
    ring.writer.put_many(edges(range(RECORDS // 2)))
    assert ring.wakes_pending() == 0
    ring.writer.put_many(edges(range(2)))  # the first of these finds exactly half unread
    assert ring.wakes_pending() == 1


def test_the_quiet_word_says_whether_the_agent_waits_without_a_wake_up_per_edge(ring: Ring) -> None:
    assert not ring.writer.quiet and ring.words[W_QUIET] == 0  # a new ring: listening
    ring.reader.quiet()
    assert ring.writer.quiet and ring.words[W_QUIET] == 1
    ring.reader.awake()  # woken (the half-full edge, a Stats call): still quiet
    assert ring.writer.quiet
    ring.reader.sleep()  # listening again: every edge as it happens
    assert not ring.writer.quiet and ring.words[W_QUIET] == 0


# -- sizes and headers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("wanted", "records"), [
    (0, DEFAULT_RECORDS), (-5, DEFAULT_RECORDS),
    (1, MIN_RECORDS), (MIN_RECORDS - 1, MIN_RECORDS), (MIN_RECORDS, MIN_RECORDS), (MIN_RECORDS + 1, 2 * MIN_RECORDS),
    (1000, 1024), (1024, 1024), (16384, 16384), (16385, 32768),
    (MAX_RECORDS, MAX_RECORDS), (MAX_RECORDS + 1, MAX_RECORDS), (10**12, MAX_RECORDS),
])
def test_ring_records_is_a_bounded_power_of_two(wanted: int, records: int) -> None:
    assert ring_records(wanted) == records
    assert records & (records - 1) == 0


@pytest.mark.parametrize("records", [0, -64, 100])
def test_init_ring_wants_a_power_of_two(tmp_path: Path, records: int) -> None:
    fd = os.open(tmp_path / "ring.shm", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        with pytest.raises(ValueError, match="power of two"):
            init_ring(fd, records)
    finally:
        os.close(fd)


def _header(tmp_path: Path, magic: int = MAGIC, version: int = VERSION, records: int = RECORDS,
            size: int = ring_bytes(RECORDS)) -> mmap.mmap:
    """A mapping of a file with this header and size."""
    path = tmp_path / "ring.shm"
    path.write_bytes(struct.pack("<3q", magic, version, records).ljust(size, b"\0")[:size])
    fd = os.open(path, os.O_RDWR)
    try:
        return map_ring(fd, size)
    finally:
        os.close(fd)


@pytest.mark.parametrize("header", [
    {"magic": MAGIC ^ 1},
    {"version": VERSION + 1},
    {"records": 0},
    {"records": -RECORDS},
    {"records": 100},  # not a power of two
    {"records": 2 * RECORDS},  # more than the file holds
    {"size": HEADER_BYTES // 2},  # not even a header
])
def test_a_file_that_is_not_a_ring_of_this_version_is_refused(tmp_path: Path, header: dict[str, int]) -> None:
    mm = _header(tmp_path, **header)
    try:
        with pytest.raises(RingError):
            RingWriter(mm, -1)
        with pytest.raises(RingError):
            RingReader(mm)
    finally:
        mm.close()  # refused: no view into the mapping is left behind


def test_a_well_formed_header_is_taken_and_its_record_count_used(tmp_path: Path) -> None:
    mm = _header(tmp_path, records=RECORDS, size=ring_bytes(RECORDS))
    null = os.open(os.devnull, os.O_WRONLY)  # the half-full wake-up goes nowhere
    try:
        writer = RingWriter(mm, null)
        reader = RingReader(mm)
        for seq in range(RECORDS + 1):
            writer.put(EDGE_START, 0, seq, NOW, 0, 0, 0)
    finally:
        os.close(null)
    assert writer.dropped == 1 and len(reader.take()) == RECORDS
    assert struct.unpack_from("<q", mm, W_RECORDS * 8) == (RECORDS,)
    reader.release()


# -- the agent's end: RingChannel on an event loop --------------------------------------------------------


def test_a_channel_closed_while_a_full_batch_waits_for_its_next_turn_is_not_read_again(tmp_path: Path) -> None:
    records = 8192
    taken: list[Record] = []
    errors: list[dict[str, object]] = []

    async def flood_then_close() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: errors.append(context))
        channel = RingChannel(tmp_path, 0, 0o600, None, records)
        fd = os.open(channel.path, os.O_RDWR)  # the trainer's own mapping of the agent's file
        mm = map_ring(fd, ring_bytes(records))
        os.close(fd)
        wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            writer = RingWriter(mm, wake_fd)
            for seq in range(5000):
                writer.put(EDGE_START, 0, seq, NOW, 0, 0, 0)
            channel.start(taken.extend)  # takes a full batch, leaves the rest to its next turn of the loop
            channel.close()  # the stream ends in this turn: close() takes the rest
            await asyncio.sleep(0)  # the next turn
        finally:
            os.close(wake_fd)

    with returns_within(STALL_S, "the channel's pump and close"):
        asyncio.run(flood_then_close())
    assert seqs(taken) == list(range(5000))
    assert list(tmp_path.iterdir()) == []  # the ring file and the hand-over socket are gone
    assert errors == []


def test_a_quiet_channel_reads_only_when_asked_and_listen_makes_each_edge_wake_it(tmp_path: Path) -> None:
    from freeride.trainer._ring import fetch_ring

    taken: list[Record] = []
    wakes: list[int] = []

    async def run() -> None:
        arrived = asyncio.Event()

        def deliver(batch: list[Record]) -> None:
            taken.extend(batch)
            arrived.set()

        channel = RingChannel(tmp_path, 0, 0o600, None, RECORDS)
        fetched = asyncio.Event()
        channel.offer(fetched.set, lambda: None)
        writer = await asyncio.to_thread(fetch_ring, str(channel.socket_path), channel.key, -1)  # the trainer's end
        await asyncio.wait_for(fetched.wait(), 10)
        try:
            channel.quiet = True  # the agent has nothing to grant
            channel.start(deliver)
            for seq in range(3):
                writer.put(EDGE_START, 0, seq, NOW, 0, 0, 0)
            wakes.append(writer.wakes)  # none: the edges wait in the ring
            channel.pump()  # read for another reason (a Stats call): what is written is taken, quiet still
            assert seqs(taken) == [0, 1, 2]
            writer.put(EDGE_START, 0, 3, NOW, 0, 0, 0)
            wakes.append(writer.wakes)
            channel.listen(True)  # a task became schedulable: what waits is read now, each edge wakes from now on
            assert seqs(taken) == [0, 1, 2, 3]
            arrived.clear()
            writer.put(EDGE_START, 0, 4, NOW, 0, 0, 0)
            await asyncio.wait_for(arrived.wait(), 10)  # the eventfd woke the loop's reader
            wakes.append(writer.wakes)
            channel.listen(False)
            writer.put(EDGE_START, 0, 5, NOW, 0, 0, 0)
            wakes.append(writer.wakes)
            arrived.clear()
            for seq in range(6, 6 + RECORDS // 2):  # the edge that finds half the ring unread wakes it
                writer.put(EDGE_START, 0, seq, NOW, 0, 0, 0)
            await asyncio.wait_for(arrived.wait(), 10)
            wakes.append(writer.wakes)
        finally:
            channel.close()
            os.close(writer.wake_fd)

    asyncio.run(run())
    assert seqs(taken) == list(range(6 + RECORDS // 2))
    assert wakes == [0, 0, 1, 1, 2]
