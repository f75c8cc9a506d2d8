"""Task logs in-process: pipes written here stand in for workers (freeride.agent.procs.task_logs)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from freeride.agent.procs import task_logs as logs_module
from freeride.agent.procs.task_logs import TaskLogs, rotated
from freeride.agent.procs.workers import last_log_line, said_reason
from freeride.core.exits import REASON_MARK


@pytest.fixture
def run() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


async def _collect(it: AsyncIterator[bytes]) -> bytes:
    return b"".join([c async for c in it])


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def test_output_is_capped_and_rotated_keeping_the_newest(run: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    async def main() -> tuple[bytes, bytes, int, int]:
        logs = TaskLogs(tmp_path, max_bytes=10_000)
        try:
            r, w = logs.pipe("1")
            lines = b"".join(b"line %06d\n" % i for i in range(20_000))  # 220 kB: 22x the cap
            _write(w, lines + b"Traceback: the end\n")
            os.close(w)
            await logs.drain(r)
            stored = await _collect(logs.read("1", 0, False, lambda: True))
            tail = await _collect(logs.read("1", 2, False, lambda: True))
        finally:
            logs.close()
        return stored, tail, logs.path("1").stat().st_size, rotated(logs.path("1")).stat().st_size

    stored, tail, size, old_size = run.run_until_complete(main())
    assert size <= 10_000 and old_size == 10_000  # at most 2x the cap on disk
    assert stored.endswith(b"line 019999\nTraceback: the end\n") and len(stored) == size + old_size
    assert tail == b"line 019999\nTraceback: the end\n"
    assert last_log_line(tmp_path / "task-1.log") == "Traceback: the end"


def test_last_log_line_reads_the_rotated_part_when_the_new_one_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "task-2.log"
    rotated(path).write_text("x\nValueError: boom\n")
    path.write_text("")
    assert last_log_line(path) == "ValueError: boom"


# What gRPC's poller logs, over and over, once a task closed its descriptors (glog-style: never a cause).
GRPC_NOISE = "E1126 00:44:37.123456   4242 ev_epoll1_linux.cc:686] epoll_wait: Bad file descriptor (9)\n"


def test_the_last_line_is_never_a_piece_of_one_cut_by_the_window(tmp_path: Path) -> None:
    path = tmp_path / "task-3.log"
    path.write_text("ValueError: the cause\n" + GRPC_NOISE * 200)  # 17 kB of noise: the window starts mid-line
    assert last_log_line(path) == ""  # before: "poll_wait: Bad file descriptor (9)", a cut line taken for a cause


def test_a_workers_marked_reason_is_found_behind_the_noise_grpc_logs_after_it(tmp_path: Path) -> None:
    path = tmp_path / "task-4.log"
    path.write_text("some output\n" + f"{REASON_MARK}the task closed the worker's window pipe (fd 5)\n"
                    + GRPC_NOISE * 1000 + "E1126 00:44:37.1")  # and a line cut by the process's end
    assert said_reason(path) == "the task closed the worker's window pipe (fd 5)"
    path.write_text("ValueError: a crash, not a reason said\n")
    assert said_reason(path) == ""


def test_a_follower_gets_new_output_until_the_task_is_over(run: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    async def main() -> list[bytes]:
        logs = TaskLogs(tmp_path, max_bytes=1 << 20)
        over = False
        got: list[bytes] = []
        try:
            r, w = logs.pipe("3")
            _write(w, b"before\n")
            await logs.drain(r)

            live = asyncio.Event()

            async def follow() -> None:
                async for chunk in logs.read("3", 0, True, lambda: over):
                    got.append(chunk)
                    if chunk.endswith(b"before\n"):
                        _write(w, b"after\n")  # written once the follower has the stored part
                    if chunk.endswith(b"after\n"):
                        live.set()

            follower = asyncio.ensure_future(follow())
            await asyncio.wait_for(live.wait(), 5)
            assert not follower.done()  # the task is not over: it follows on
            os.close(w)
            await logs.drain(r)
            over = True
            logs.poke("3")
            await asyncio.wait_for(follower, 5)
        finally:
            logs.close()
        return got

    assert b"".join(run.run_until_complete(main())) == b"before\nafter\n"


def test_an_unknown_task_has_an_empty_log(run: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    async def main() -> bytes:
        logs = TaskLogs(tmp_path, max_bytes=1 << 20)
        try:
            return await _collect(logs.read("9", 10, False, lambda: True))
        finally:
            logs.close()

    assert run.run_until_complete(main()) == b""



def test_a_reader_cancelled_during_its_tail_closes_each_file_once(
    run: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tail is cut in a thread on the snapshot's descriptors: a reader that goes away meanwhile (Ctrl-C on
    `freeride logs --tail`) must not close them under that thread, nor may the thread close them again."""
    started, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    real_tail = logs_module._tail

    def slow_tail(parts: list[tuple[int, int, int]], lines: int) -> list[tuple[int, int, int]]:
        started.set()
        release.wait(10)
        try:
            return real_tail(parts, lines)
        except BaseException as exc:
            errors.append(exc)
            raise

    monkeypatch.setattr(logs_module, "_tail", slow_tail)

    async def main() -> bool:
        logs = TaskLogs(tmp_path, max_bytes=10_000)
        try:
            r, w = logs.pipe("1")
            _write(w, b"".join(b"line %06d\n" % i for i in range(2_000)))  # 22 kB: a rotated part and the current
            os.close(w)
            await logs.drain(r)
            reader = asyncio.ensure_future(_collect(logs.read("1", 2, False, lambda: True)))
            await asyncio.to_thread(started.wait, 10)
            reader.cancel()
            for _ in range(3):  # the reader's turns to act on its cancellation
                await asyncio.sleep(0)
            release.set()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            return reader.cancelled()
        finally:
            release.set()
            logs.close()

    fds_before = set(os.listdir("/proc/self/fd"))
    assert run.run_until_complete(main())
    assert errors == []  # the thread read (and closed nothing) on descriptors still open
    assert set(os.listdir("/proc/self/fd")) <= fds_before
