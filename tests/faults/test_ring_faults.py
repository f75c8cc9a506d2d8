"""The shared-memory bubble ring under faults, with a real agent and real trainer processes.

- A trainer SIGKILLed while it floods its ring: no torn record becomes an edge, every edge it had
  written reaches the agent, its ring file goes, and the next trainer is served as usual.
- `kill -9` of the agent while a trainer trains: the training loop never notices, the reporter
  falls back (no agent: edges dropped and counted) and attaches the next agent's ring, whose
  scheduler sees the slots the trainer keeps using.
- A flood into a 64-record ring: the trainer drops and counts, never blocks, and the agent's
  count of the trainer's drops is the trainer's own.
- A process with write access to the ring file writing random bytes over it while a trainer
  reports: the agent keeps serving, and the next trainer's stream is served normally.
- The ring file and its hand-over socket carry the agent socket's permissions, go with their
  stream, are cleaned up after a killed agent (only they), and are handed only to the stream's key.

A trainer here is a child process driven line by line over its stdin (see TRAINER): each command
answers with one JSON line, which is what the test waits on.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.agents import FAST
from support.faults import TaggedAgent, assert_all_reaped, assert_no_tracebacks, clean_agent, tagged_agent

from freeride.client import AgentClient
from freeride.core.ring import EDGE_START, HEADER_BYTES, RECORD_BYTES, RingWriter, map_ring, ring_bytes
from freeride.tooling.harness import wait_for, wait_for_trainers
from freeride.trainer.reporter import BubbleReporter
from freeride.v1 import tasks_pb2, trainer_pb2, trainer_pb2_grpc

ASK_TIMEOUT_S = 30.0
STALL_S = 5.0  # the agent answers Stats in milliseconds: not within this, its loop is stuck (a ring reader spins)
FINAL_ITERATION = 10**6  # the iteration of the bubble a trainer reports last ("finish")

# A training rank in its own process. Commands (one a line), each answered by one JSON line of the
# reporter's state: connect | train (start the training loop in a thread) | state | after N (once N more
# iterations are done) | lost (once no agent is there) | shm (once a ring is attached) | flood N (N edges as
# fast as it can) | forever (flood until killed, a line every 4096 pairs) | finish (stop training, report one
# last bubble, close, exit).
TRAINER = r"""
import json, sys, threading, time
from freeride.trainer.reporter import BubbleReporter

target, rank, max_queue, final_iteration = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rep = BubbleReporter(target, rank=rank, max_queue=max_queue, reconnect_min_s=0.05, reconnect_max_s=0.2)
iterations, error, stop = 0, None, threading.Event()
progress = threading.Condition()  # notified after every iteration

def say(**extra):
    print(json.dumps({"path": rep.path, "sent": rep.sent, "dropped": rep.dropped, "iterations": iterations,
                      "error": error, **extra}), flush=True)

def train():  # two bubbles an iteration, in slots 3 and 5; freeride's hooks must never raise into it
    global iterations, error
    try:
        while not stop.is_set():
            rep.set_iteration(iterations)
            for slot in (3, 5):
                rep.start(slot)
                time.sleep(0.0005)  # the wait the bubble stands for
                rep.end(slot)
            with progress:
                iterations += 1
                progress.notify_all()
    except BaseException as exc:
        error = repr(exc)

trainer = threading.Thread(target=train, daemon=True)
for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "connect":
        say(connected=rep.wait_connected(10))
    elif cmd == "train":
        trainer.start()
        say()
    elif cmd == "state":
        say()
    elif cmd == "after":
        with progress:
            target = iterations + int(args[0])
            progress.wait_for(lambda: iterations >= target or error is not None, 20)
        say()
    elif cmd == "lost":
        rep.wait_path("", 20)
        say()
    elif cmd == "shm":
        rep.wait_path("shm", 20)
        say()
    elif cmd == "flood":
        t0 = time.monotonic()
        for i in range(int(args[0]) // 2):
            rep.start(i & 7)
            rep.end(i & 7)
        say(elapsed_s=time.monotonic() - t0)
    elif cmd == "forever":
        say()
        i = 0
        while True:
            rep.set_iteration(i)
            rep.start(i & 7)
            rep.end(i & 7)
            i += 1
            if i & 4095 == 0:
                say(pairs=i)
    elif cmd == "finish":
        stop.set()
        if trainer.is_alive():
            trainer.join()
        rep.set_iteration(final_iteration)
        rep.start(7)
        rep.end(7)
        rep.close()
        say()
        break
"""


class Trainer:
    """A TRAINER child process and its answers."""

    def __init__(self, target: str, err_path: Path, rank: int = 0, max_queue: int = 16384) -> None:
        self._err_path = err_path
        self._err = open(err_path, "wb")  # noqa: SIM115  # closed in kill()/finish()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", TRAINER, target, str(rank), str(max_queue), str(FINAL_ITERATION)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
        )
        self._buf = b""

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()

    def answer(self, timeout_s: float = ASK_TIMEOUT_S) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(fd, 1 << 16) if ready else None
            if not chunk:
                raise AssertionError(f"the trainer {'exited' if chunk == b'' else 'did not answer'}: "
                                     f"{self._err_path.read_text(errors='replace')[-3000:]}")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        answer: dict[str, Any] = json.loads(line)
        assert answer["error"] is None, answer  # the training loop never saw an exception
        return answer

    def ask(self, command: str, timeout_s: float = ASK_TIMEOUT_S) -> dict[str, Any]:
        self.send(command)
        return self.answer(timeout_s)

    def finish(self) -> dict[str, Any]:
        last = self.ask("finish")
        assert self.proc.wait(30) == 0, self._err_path.read_text(errors="replace")
        self.close()
        return last

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self._err):
            if f is not None:
                f.close()


class RawTrainer:
    """A trainer stream driven by hand: its hello, and the agent's answer (the ring's socket and key)."""

    def __init__(self, target: str, records: int = 0) -> None:
        self._done = threading.Event()
        self._channel = grpc.insecure_channel(target)
        stub = trainer_pb2_grpc.BubbleServiceStub(self._channel)
        self._call = stub.ReportBubbles(self._requests(records), timeout=60)
        assert not next(self._call).hello_answered  # the liveness welcome comes first
        self.welcome: trainer_pb2.TrainerWelcome = next(self._call)
        assert self.welcome.hello_answered

    def _requests(self, records: int) -> Iterator[trainer_pb2.BubbleBatch]:
        yield trainer_pb2.BubbleBatch(hello=trainer_pb2.TrainerHello(rank=0, shared_memory=True,
                                                                    ring_records=records))
        self._done.wait()  # then nothing: the stream stays open until close()

    @property
    def socket_path(self) -> Path:
        return Path(self.welcome.ring_socket)

    @property
    def ring_path(self) -> Path:
        return self.socket_path.with_suffix(".shm")

    def close(self) -> None:
        """Half-close the stream; the agent ends the call."""
        self._done.set()
        try:
            for _ in self._call:
                pass
        except grpc.RpcError:
            pass  # the agent is gone
        self._channel.close()


def handshake(path: Path, key: bytes) -> tuple[bytes, list[int]]:
    """Connect to a ring's hand-over socket, send `key`; what comes back (message, descriptors)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(key)
        msg, fds, _, _ = socket.recv_fds(sock, 16, 2)
    return msg, fds


def rings(directory: Path, gpu: int = 0) -> list[Path]:
    """The ring files and hand-over sockets of a GPU's agent in its socket directory."""
    return sorted(p for p in directory.glob(f"ring-gpu{gpu}-*") if p.suffix in (".shm", ".sock"))


def stats_within(c: AgentClient, after: str) -> tasks_pb2.StatsResponse:
    """Stats, which takes every ring's unread records first, answered within STALL_S: a ring reader that stalls
    fails here with a clear message, not at the client's 30 s deadline nor at pytest's 120 s timeout."""
    try:
        return c.tasks.Stats(tasks_pb2.StatsRequest(), timeout=STALL_S)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise AssertionError(f"the agent did not answer Stats within {STALL_S:g} s {after}: its loop is stuck, "
                                 "most likely in a ring reader that stalls") from None
        raise


def wait_attached(c: AgentClient) -> None:
    """Until the agent says a stream's edges now come through its ring (it handed the ring over)."""

    def now() -> bool | None:
        return any(t.path == "shm" for t in c.stats().gpu.trainer_streams) or None

    def on_event(ev: tasks_pb2.AgentEvent) -> bool | None:
        return (ev.HasField("trainer") and ev.trainer.path == "shm") or None

    assert wait_for(c, now, on_event, 20), "no stream attached its ring"


def served_normally(agent: TaggedAgent, c: AgentClient, edges: int = 200) -> None:
    """A new trainer attaches a ring, and every one of its edges reaches the agent, none refused."""
    before = wait_for_trainers(c, 0).gpu
    reporter = BubbleReporter(agent.target, rank=9)
    try:
        assert reporter.wait_connected(10) and reporter.path == "shm"
        for i in range(edges // 2):
            reporter.set_iteration(i)
            reporter.start(1)
            reporter.end(1)
        assert reporter.dropped == 0 and reporter.sent == edges
    finally:
        reporter.close()
    after = wait_for_trainers(c, 0).gpu  # the stream's end takes what is left in its ring
    assert after.events - before.events == edges
    assert after.rejected_events == before.rejected_events
    assert rings(agent.socket.parent) == []


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[TaggedAgent]:
    with clean_agent(tmp_path / "state") as proc:
        yield proc


def test_a_trainer_killed_while_it_floods_its_ring_leaves_no_torn_edge(tmp_path: Path) -> None:
    with clean_agent(tmp_path / "state") as agent, agent.client() as c:
        trainer = Trainer(agent.target, tmp_path / "trainer.err", rank=4)
        try:
            assert trainer.ask("connect")["path"] == "shm"
            before = c.stats().gpu
            trainer.ask("forever")
            last: dict[str, Any] = {}
            for _ in range(random.randint(1, 6)):  # killed at some point of a flood (SIGKILL: mid-write, likely)
                last = trainer.answer()
            trainer.proc.kill()
            assert trainer.proc.wait() == -signal.SIGKILL
            after = wait_for_trainers(c, 0).gpu
            assert agent.proc is not None and agent.proc.poll() is None
            assert after.rejected_events == before.rejected_events  # no half-written record read as an edge
            assert after.events - before.events >= last["sent"]  # everything written before the last line arrived
            assert rings(agent.socket.parent) == []
            # The ring delivered in order: the bubbles the agent saw have strictly increasing iterations.
            seen = [b.iteration for b in c.timeline().bubbles if b.rank == 4]
            assert seen and seen == sorted(set(seen))
            served_normally(agent, c)
        finally:
            trainer.close()


def test_agent_kill_9_while_a_trainer_trains_then_the_next_agent_gets_its_ring(tmp_path: Path) -> None:
    first = tagged_agent(tmp_path / "state")
    first.start()
    second = None
    trainer = Trainer(first.target, tmp_path / "trainer.err", rank=2)
    try:
        directory = first.socket.parent
        with first.client() as c:
            assert trainer.ask("connect")["path"] == "shm"
            trainer.ask("train")
            trainer.ask("after 2")
            assert c.stats().gpu.events > 0  # the ring is in use (a Stats answer counts what was written before it)
        assert first.proc is not None
        left = [p for p in rings(directory) if f"-{first.proc.pid}-" in p.name]
        assert left  # the ring in use when the agent died
        first.kill9()
        lost = trainer.ask("lost")
        # Off the ring: on no road at all (no agent to report to), or for an instant "grpc" (the reporter drops
        # the ring before it marks the stream dead).
        assert lost["path"] in ("", "grpc")
        second = tagged_agent(first.state_dir)  # the same state directory: the same socket
        second.start()
        assert not any(p.exists() for p in left)  # the dead agent's ring was removed by the next agent
        back = trainer.ask("shm")
        assert back["path"] == "shm"
        assert back["iterations"] > lost["iterations"]  # training went on all along
        assert back["dropped"] > lost["dropped"]  # what it reported while no agent was there was dropped, counted
        with second.client() as c:
            trainer.ask("after 2")
            assert c.stats().gpu.bubbles >= 4  # two iterations' bubbles through the new ring
            trainer.finish()
            stats = wait_for_trainers(c, 0)
            assert stats.gpu.rejected_events == 0
            bubbles = [b for b in c.timeline().bubbles if b.rank == 2]
        # The new agent's scheduler saw the slots the trainer kept using, from the iterations after the restart on.
        assert {b.slot for b in bubbles} == {3, 5, 7}
        assert min(b.iteration for b in bubbles) >= lost["iterations"]
        assert any(b.slot == 7 and b.iteration == FINAL_ITERATION for b in bubbles)
    finally:
        trainer.close()
        for agent in (second, first):
            if agent is not None:
                assert agent.stop() in (0, -signal.SIGKILL), agent.log_tail()
                assert_all_reaped(agent.tag)
                assert_no_tracebacks(agent)


def test_a_flood_into_a_small_ring_drops_and_counts_and_never_blocks(agent: TaggedAgent, tmp_path: Path) -> None:
    edges = 40_000
    trainer = Trainer(agent.target, tmp_path / "trainer.err", max_queue=64)
    try:
        with agent.client() as c:
            assert trainer.ask("connect")["path"] == "shm"
            [ring] = [p for p in rings(agent.socket.parent) if p.suffix == ".shm"]
            assert ring.stat().st_size == ring_bytes(64)  # the trainer's queue size set the ring's
            flood = trainer.ask(f"flood {edges}")
            assert flood["path"] == "shm"
            assert flood["sent"] + flood["dropped"] == edges and flood["dropped"] > 0 and flood["sent"] >= 64
            assert flood["elapsed_s"] < 10  # never waited for the agent (about a microsecond an edge)

            def stream(s: tasks_pb2.StatsResponse) -> tasks_pb2.TrainerStream:
                [t] = s.gpu.trainer_streams
                return t

            stats = c.stats()
            t = stream(stats)
            assert t.edges == flood["sent"]  # the agent took all written (a Stats answer is current as of the call)
            assert (t.path, t.rejected, t.dropped) == ("shm", 0, flood["dropped"])  # and knows what was dropped
            # Drained, the ring takes a ring's worth again without a drop.
            again = trainer.ask("flood 64")
            assert again["dropped"] == flood["dropped"]
            stats = c.stats()
            assert stream(stats).edges == again["sent"]
            assert stream(stats).dropped == flood["dropped"] and stats.gpu.rejected_events == 0
            trainer.finish()
            assert c.health() == 1
            served_normally(agent, c)
    finally:
        trainer.close()


SCRIBBLER = r"""
import os, random, sys
from freeride.core.ring import HEADER_BYTES
path, passes, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
fd = os.open(path, os.O_RDWR)
size = os.fstat(fd).st_size
for n in range(1, passes + 1):
    os.pwrite(fd, rng.randbytes(size - HEADER_BYTES), HEADER_BYTES)  # every record, the header left alone
    if n % 500 == 0:
        print(n, flush=True)
"""


def test_garbage_written_over_a_ring_never_hurts_the_agent(agent: TaggedAgent, tmp_path: Path) -> None:
    trainer = Trainer(agent.target, tmp_path / "trainer.err", max_queue=1024)
    scribbler = None
    try:
        with agent.client() as c:
            assert trainer.ask("connect")["path"] == "shm"
            trainer.ask("train")
            [ring] = [p for p in rings(agent.socket.parent) if p.suffix == ".shm"]
            trainer.ask("after 1")
            assert c.stats().gpu.events > 0
            rejected = [c.stats().gpu.rejected_events]
            trained = trainer.ask("state")["iterations"]
            scribbler = subprocess.Popen(
                [sys.executable, "-c", SCRIBBLER, str(ring), "3000", str(random.getrandbits(32))],
                stdout=subprocess.PIPE, text=True,
            )
            assert scribbler.stdout is not None
            for _ in scribbler.stdout:  # every 500 passes over the records: the agent answers, counts never shrink
                rejected.append(stats_within(c, "while its ring was scribbled").gpu.rejected_events)
            assert scribbler.wait(30) == 0 and len(rejected) == 7
            assert rejected == sorted(rejected)
            assert trainer.ask("state")["iterations"] > trained  # the trainer trained on throughout
            trainer.finish()
            stats = wait_for_trainers(c, 0)
            assert agent.proc is not None and agent.proc.poll() is None
            assert stats.gpu.rejected_events >= rejected[0]
            assert rings(agent.socket.parent) == []
            served_normally(agent, c)  # the scribbled ring was that stream's only
    finally:
        if scribbler is not None and scribbler.poll() is None:
            scribbler.kill()
            scribbler.wait()
        trainer.close()


def _modes(*paths: Path) -> set[tuple[int, int]]:
    return {(stat.S_IMODE(p.stat().st_mode), p.stat().st_gid) for p in paths}


def test_ring_files_carry_the_socket_permissions_go_with_their_stream_and_open_only_to_its_key(tmp_path: Path) -> None:
    first = tagged_agent(tmp_path / "state")
    first.start()
    second = None
    try:
        directory = first.socket.parent
        with first.client() as c:
            raw = RawTrainer(first.target)
            # The default --socket-mode (0660): the ring and its hand-over socket are the agent socket's like.
            assert _modes(first.socket, raw.socket_path, raw.ring_path) == {(0o660, first.socket.stat().st_gid)}
            # A wrong key: the connection is closed, no descriptor passed; the socket stays for the right one.
            assert handshake(raw.socket_path, b"\0" * 16) == (b"", [])
            assert handshake(raw.socket_path, raw.welcome.ring_key[:8]) == (b"", [])
            msg, fds = handshake(raw.socket_path, raw.welcome.ring_key)
            assert msg == b"R" and len(fds) == 2
            ring_fd, wake_fd = fds
            assert os.fstat(ring_fd).st_ino == raw.ring_path.stat().st_ino
            assert os.readlink(f"/proc/self/fd/{wake_fd}") == "anon_inode:[eventfd]"
            wait_attached(c)
            assert not raw.socket_path.exists()  # one-shot: gone once handed over
            # They are the stream's ring: an edge written there reaches the agent.
            writer = RingWriter(map_ring(ring_fd, os.fstat(ring_fd).st_size), wake_fd)
            writer.put(EDGE_START, 0, 0, time.monotonic_ns(), 0, 0, 0)
            stats_within(c, "after an edge into a ring of scribbled commit words")
            raw.close()
            os.close(ring_fd)
            os.close(wake_fd)
            stats = wait_for_trainers(c, 0)
            assert (stats.gpu.events, stats.gpu.rejected_events) == (1, 0)
            assert rings(directory) == []  # removed with their stream
            # A ring offered, never fetched, when the agent is killed: its files stay behind...
            raw = RawTrainer(first.target)
        stale = [raw.ring_path, raw.socket_path]
        first.kill9()
        raw.close()
        assert all(p.exists() for p in stale)
        others = [directory / "notes.txt", directory / "ring-gpu1-1-1.shm", directory / "ring-gpu0-notes.txt"]
        for p in others:
            p.write_text("not the agent's to remove")
        # ...until the next agent of the GPU starts: it removes them and nothing else. Now with --socket-mode 0600.
        second = tagged_agent(first.state_dir, extra_args=[*FAST, "--socket-mode", "0600"])
        second.start()
        assert not any(p.exists() for p in stale)
        assert all(p.read_text() == "not the agent's to remove" for p in others)
        with second.client() as c:
            raw = RawTrainer(second.target)
            assert _modes(second.socket, raw.socket_path, raw.ring_path) == {(0o600, second.socket.stat().st_gid)}
            msg, fds = handshake(raw.socket_path, raw.welcome.ring_key)
            assert msg == b"R" and len(fds) == 2
            for fd in fds:
                os.close(fd)
            raw.close()
            wait_for_trainers(c, 0)
            assert rings(directory) == []
            served_normally(second, c)
    finally:
        for agent in (second, first):
            if agent is not None:
                assert agent.stop() in (0, -signal.SIGKILL), agent.log_tail()
                assert_all_reaped(agent.tag)
                assert_no_tracebacks(agent)


def test_commit_words_scribbled_into_rings_never_break_the_agents_stats(tmp_path: Path) -> None:
    records = 64
    agent = tagged_agent(tmp_path / "state")
    agent.start()
    try:
        scribble_three_rings(agent, records)
    finally:
        assert agent.stop() == 0, agent.log_tail()
        assert_all_reaped(agent.tag)
        assert_no_tracebacks(agent)


def scribble_three_rings(agent: TaggedAgent, records: int) -> None:
    with agent.client() as c:
        for _ in range(3):
            raw = RawTrainer(agent.target, records=records)
            _, (ring_fd, wake_fd) = handshake(raw.socket_path, raw.welcome.ring_key)
            writer = RingWriter(map_ring(ring_fd, ring_bytes(records)), wake_fd)
            # Another process with access to the ring file writes, in each record, a commit word that looks
            # like the writer lapped the agent by 2**57 laps; then the trainer writes its first edge.
            fd = os.open(raw.ring_path, os.O_RDWR)
            laps = (1 << 63) // records - 2
            for slot in range(records):
                os.pwrite(fd, struct.pack("<8q", 1, 2, 3, 4, 5, 6, 7, laps * records + slot + 1),
                          HEADER_BYTES + slot * RECORD_BYTES)
            os.close(fd)
            writer.put(EDGE_START, 0, 0, time.monotonic_ns(), 0, 0, 0)
            stats_within(c, "after an edge into a ring of scribbled commit words")
            raw.close()
            os.close(ring_fd)
            os.close(wake_fd)
            wait_for_trainers(c, 0)
        stats = c.stats()
        assert stats.gpu.events == 3
        assert stats.gpu.rejected_events <= 3 * records  # no more refused than the rings had records
