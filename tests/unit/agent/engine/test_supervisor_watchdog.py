"""Specification of the memory watchdog's tick off the loop: its reads (each worker's memory, its process tree)
run on the supervisor's thread, and only their results are applied on the loop.

In-process: the real thread (`ThreadOffload`), a probe whose read blocks until the test releases it, manual
timers for the tick. Nothing sleeps: the test waits on the probe's events, each with a deadline.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from support.engine_fakes import MiB, Rig, in_loop
from test_supervisor import bubble, grants

from freeride.agent.domain.events import Ready
from freeride.agent.domain.model import TaskState
from freeride.agent.engine.offload import ThreadOffload

_DEADLINE_S = 10.0  # bound on every wait here: a broken watchdog fails the test rather than hanging it


class BlockingProbe:
    """Memory per pid, as a test sets it; each read blocks until the test releases it."""

    def __init__(self) -> None:
        self.bytes: dict[int, int] = {}
        self.entered = threading.Event()  # a read has begun
        self.release = threading.Event()
        self.reads_in: list[str] = []  # the thread of each read

    def usage(self, pids: list[int]) -> dict[int, int]:
        self.reads_in.append(threading.current_thread().name)
        self.entered.set()
        if not self.release.wait(_DEADLINE_S):
            raise TimeoutError("the test never released the read")
        return {p: self.bytes[p] for p in pids if p in self.bytes}


class ClosingOffload(ThreadOffload):
    def __init__(self) -> None:
        super().__init__("test-sample")
        self.closed = False

    def close(self) -> None:
        super().close()
        self.closed = True


def blocking_rig(tmp_path: Path) -> tuple[Rig, BlockingProbe, ClosingOffload]:
    offload = ClosingOffload()
    rig = Rig(tmp_path, offload=offload)
    probe = BlockingProbe()
    rig.memory._probe = probe  # (the guard's probe: what the watchdog samples with)
    return rig, probe, offload


async def read_begun(probe: BlockingProbe) -> None:
    """Until the watchdog's read has begun in its thread (the loop stays free meanwhile)."""
    assert await asyncio.to_thread(probe.entered.wait, _DEADLINE_S), "the watchdog never read"


@in_loop
async def test_the_loop_grants_a_window_while_the_watchdogs_sample_blocks(tmp_path: Path) -> None:
    rig, probe, offload = blocking_rig(tmp_path)
    try:
        rec = rig.task(cap_bytes=100 * MiB)
        await rig.sup.start(rec)
        worker = rig.worker(rec)
        rig.streams.on_worker_message(rec.id, worker.instance, Ready("iterative", 0, {}))
        probe.bytes[worker.pid] = 101 * MiB
        rig.sup.watch_memory()
        rig.timers.fire_next()  # the tick: its read starts in the watchdog's thread
        await read_begun(probe)
        bubble(rig, 0)  # a bubble edge, handled on the loop while the read is still blocked
        assert grants(worker) == [1]
        assert rig.table.live[rec.id].memory_bytes is None and worker.kills == []  # nothing applied yet
        assert rig.timers.pending() == []  # and no second sample is set while this one is in flight
        probe.release.set()
        await rig.watchdog.watched()
        assert probe.reads_in == ["test-sample_0"]
        (scan,) = rig.launcher.scans
        assert (scan.read_in, scan.applied_in) == ("test-sample_0", threading.current_thread().name)
        assert rig.table.live[rec.id].memory_bytes == 101 * MiB and rec.peak_memory_bytes == 101 * MiB
        assert len(worker.kills) == 1 and worker.kills[0].startswith("memory_cap_exceeded: 101 MiB")
        assert [t.at for t in rig.timers.pending()] == [2 * rig.config.memory_check_s]  # the next, once it ended
    finally:
        probe.release.set()
        offload.close()


@in_loop
async def test_a_worker_that_exits_while_its_sample_is_read_is_left_alone(tmp_path: Path) -> None:
    rig, probe, offload = blocking_rig(tmp_path)
    try:
        rec = rig.task(cap_bytes=100 * MiB)
        await rig.sup.start(rec)
        old = rig.worker(rec)
        probe.bytes[old.pid] = 500 * MiB
        checking = asyncio.ensure_future(rig.watchdog.check())
        await read_begun(probe)
        old.exit(1)  # it crashed meanwhile: restarted after its backoff
        rig.timers.fire_next()
        await rig.sup.settle()
        new = rig.worker(rec)
        probe.release.set()
        await checking
        assert old.kills == [] and new.kills == []  # the old sample is neither the dead worker's nor the new one's
        assert rec.peak_memory_bytes == 0 and rig.table.live[rec.id].memory_bytes is None
        assert "memory_cap" not in rec.reason
    finally:
        probe.release.set()
        offload.close()


@in_loop
async def test_shutdown_waits_for_the_sample_in_flight_applies_nothing_and_releases_the_thread(
        tmp_path: Path) -> None:
    rig, probe, offload = blocking_rig(tmp_path)
    try:
        rec = rig.task(cap_bytes=100 * MiB)
        await rig.sup.start(rec)
        worker = rig.worker(rec)
        probe.bytes[worker.pid] = 500 * MiB
        rig.sup.watch_memory()
        rig.timers.fire_next()
        await read_begun(probe)
        seen: list[object] = []

        def release() -> None:  # runs after the shutdown's first steps (callbacks run in order)
            seen.extend([rig.sup.stopping, list(worker.kills), offload.closed])
            probe.release.set()

        stopping = asyncio.ensure_future(rig.sup.shutdown())
        asyncio.get_running_loop().call_soon(release)
        await worker.killed.wait()  # the shutdown's kill (not attached), not the cap's
        assert seen == [True, [], False]  # shutdown began, then waited for the read before it stopped anyone
        assert worker.kills == ["agent shutting down"]
        worker.exit(-9)
        await stopping
        assert offload.closed and rig.timers.pending() == []
        assert rec.state is TaskState.STARTING
    finally:
        probe.release.set()
        offload.close()
