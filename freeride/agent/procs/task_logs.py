"""Task logs: every worker's stdout and stderr through a pipe to one writer thread, capped per task.

Why a pipe and a thread: the agent, not the task, decides where output goes, so a task printing in
a loop cannot fill the disk, and the agent's loop never does file I/O. One thread waits on all the
pipes at once (a selector, woken by the kernel when a worker writes and by a wake-up pipe for the
agent's requests; no polling) and appends what it reads to `task-N.log`. At `max_bytes` that file
becomes `task-N.log.1` (replacing an older one) and a new one starts: at most 2x the cap per task,
and the newest output (a traceback) always kept. All tasks' logs together stay under a total
(`--log-total-bytes`, freeride.agent.procs.logbudget): past it, the least recently written files go first.
What a worker wrote before it died (a segfault's last words) is still in its pipe: `drain` reads it
before the agent looks at the log's last line.

Readers (`freeride logs`) get the stored log (the rotated file first), then, when they follow, each
chunk as the thread writes it: the thread hands it to the follower's buffer and wakes the loop once
per batch. A follower that reads slower than the task writes loses the excess, and is told so.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import queue
import selectors
import threading
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from freeride.agent.procs.logbudget import TaskLogBudget
from freeride.core.private import create_private, private_dir

log = logging.getLogger(__name__)
_T = TypeVar("_T")

_READ_BYTES = 64 * 1024
_READS_PER_TURN = 16  # per pipe and wake-up, so one chatty task cannot starve the others
_CHUNK_BYTES = 256 * 1024  # bytes per message to a reader
_FOLLOWER_BUDGET_BYTES = 8 * 1024 * 1024  # buffered for a slow follower before its excess is skipped
_DRAIN_READS = 64  # a drain takes what the pipe holds (at most 1 MiB), not an escaped writer's endless output
_DRAIN_S = 5.0
_F_SETPIPE_SZ = 1031
_PIPE_BYTES = 1 << 20


def log_path(log_dir: Path, task_id: str) -> Path:
    return log_dir / f"task-{task_id}.log"


def rotated(path: Path) -> Path:
    """The previous part of a log (task-N.log.1): written before the current file."""
    return path.with_name(path.name + ".1")


class _Follower:
    """One reader's pending chunks: filled by the writer thread, emptied on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._chunks: deque[bytes] = deque()
        self._pending = 0
        self._skipped = 0
        self._scheduled = False
        self.event = asyncio.Event()

    def push(self, data: bytes) -> None:  # (the writer thread)
        with self._lock:
            if self._pending + len(data) > _FOLLOWER_BUDGET_BYTES:
                self._skipped += len(data)
            else:
                self._chunks.append(data)
                self._pending += len(data)
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody reads any more
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        with self._lock:
            self._scheduled = False
        self.event.set()

    def take(self) -> list[bytes]:
        with self._lock:
            chunks, self._chunks, self._pending = list(self._chunks), deque(), 0
            skipped, self._skipped = self._skipped, 0
        if skipped:
            chunks.append(f"\n[freeride: {skipped} bytes of output skipped: this reader fell behind]\n".encode())
        return chunks


@dataclass
class _TaskFile:
    path: Path
    max_bytes: int
    budget: TaskLogBudget | None = None
    fd: int = -1
    size: int = 0
    pipes: int = 0  # open pipes writing to it
    failed: bool = False  # a write failed (disk full): said once

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self.fd < 0:
                self.fd = create_private(self.path)
                self.size = os.fstat(self.fd).st_size
            room = self.max_bytes - self.size
            if room <= 0:
                self.close()
                with contextlib.suppress(FileNotFoundError):  # removed meanwhile (freeride rm)
                    os.replace(self.path, rotated(self.path))
                    if self.budget is not None:
                        self.budget.renamed(self.path, rotated(self.path))
                continue
            n = os.write(self.fd, view[:room])
            self.size += n
            view = view[n:]
            if self.budget is not None:
                self.budget.wrote(self.path, n)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass
class _Pipe:
    task_id: str
    drains: list[asyncio.Future[None]] = field(default_factory=list)


class TaskLogs:
    """Every task's log file, written by one thread; `close()` once no worker is left."""

    def __init__(self, log_dir: Path, max_bytes: int, total_bytes: int | None = None) -> None:
        """`total_bytes`: the budget of all tasks' logs together (None: none, each task's cap alone)."""
        self.log_dir = log_dir
        self.max_bytes = max_bytes
        self._budget = TaskLogBudget(log_dir, total_bytes) if total_bytes is not None else None
        self._loop = asyncio.get_running_loop()
        self._files: dict[str, _TaskFile] = {}  # tasks with an open pipe (the writer thread's)
        self._pipes: dict[int, _Pipe] = {}  # read end -> its task (the writer thread's)
        self._followers: dict[str, set[_Follower]] = {}
        self._lock = threading.Lock()  # the files' contents and sizes against a reader's snapshot
        self._followers_lock = threading.Lock()  # (held only briefly: the loop takes it)
        self._requests: queue.SimpleQueue[tuple[str, int, object]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._run, name="freeride-task-logs", daemon=True)
        private_dir(log_dir)
        self._thread.start()

    def path(self, task_id: str) -> Path:
        return log_path(self.log_dir, task_id)

    # -- the agent's side (its loop) --------------------------------------------------------------
    def pipe(self, task_id: str) -> tuple[int, int]:
        """A new pipe for a worker's output: (read end, kept by the writer; write end, for the child to
        inherit: close it once the child has started)."""
        r, w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(r, False)
        with contextlib.suppress(OSError):  # room for a burst while the thread writes (1 MiB: the usual limit)
            fcntl.fcntl(r, _F_SETPIPE_SZ, _PIPE_BYTES)
        self._request("add", r, task_id)
        return r, w

    async def drain(self, read_fd: int) -> None:
        """Until everything written to this pipe so far is in the log (its worker has exited)."""
        done: asyncio.Future[None] = self._loop.create_future()
        self._request("drain", read_fd, done)
        try:
            await asyncio.wait_for(done, _DRAIN_S)
        except TimeoutError:  # the writer is stuck (a hung disk): the exit is handled without its last words
            log.warning("task logs: the writer did not take a pipe's output within %.0f s", _DRAIN_S)

    def poke(self, task_id: str) -> None:
        """The task's state or worker changed: its followers look again whether it is over."""
        with self._followers_lock:
            followers = list(self._followers.get(task_id, ()))
        for f in followers:
            f.event.set()

    async def read(self, task_id: str, tail_lines: int, follow: bool,
                   over: Callable[[], bool]) -> AsyncGenerator[bytes, None]:
        """The stored log (its last `tail_lines` lines; 0: all of it), then with `follow` what is written
        after, until `over()` (checked after every wake-up: output, poke) says the task's worker is gone."""
        follower = _Follower(self._loop) if follow else None
        stored: list[tuple[int, int, int]] = []  # the snapshot's open files: closed here, once, whatever happens
        try:
            try:
                await _in_thread(self._snapshot, task_id, follower, stored)
                parts = await _in_thread(_tail, stored, tail_lines) if tail_lines else stored
                for fd, start, end in parts:
                    while start < end:
                        chunk = await _in_thread(os.pread, fd, min(_CHUNK_BYTES, end - start), start)
                        if not chunk:
                            break
                        start += len(chunk)
                        yield chunk
            finally:
                for fd, _, _ in stored:
                    os.close(fd)
                stored.clear()
            while follower is not None:
                follower.event.clear()
                finished = over()
                chunks = follower.take()
                for chunk in chunks:
                    yield chunk
                if finished:
                    return
                if not chunks:
                    await follower.event.wait()
        finally:
            if follower is not None:
                with self._followers_lock:
                    followers = self._followers.get(task_id, set())
                    followers.discard(follower)
                    if not followers:
                        self._followers.pop(task_id, None)

    def close(self) -> None:
        """Take what is left in the pipes, close the files, end the thread."""
        self._request("stop", -1, None)
        self._thread.join(timeout=10)
        if self._thread.is_alive():
            log.warning("task logs: the writer thread did not stop within 10 s")
            return
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    def _request(self, what: str, fd: int, arg: object) -> None:
        self._requests.put((what, fd, arg))
        with contextlib.suppress(BlockingIOError):  # full: a wake-up is pending anyway
            os.write(self._wake_w, b"\0")

    def _snapshot(self, task_id: str, follower: _Follower | None, parts: list[tuple[int, int, int]]) -> None:
        """(fd, start, end) of the stored log into `parts`, as of the moment the follower (if any) starts
        receiving."""
        path = self.path(task_id)
        with self._lock:
            for p in (rotated(path), path):
                with contextlib.suppress(FileNotFoundError):
                    fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
                    parts.append((fd, 0, os.fstat(fd).st_size))
            if follower is not None:
                with self._followers_lock:
                    self._followers.setdefault(task_id, set()).add(follower)

    # -- the writer thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                if not self._serve():
                    return
            except Exception:  # a bug here must not stop every task's log (nor hold up a drain)
                log.exception("task logs: the writer thread failed on a wake-up; going on")

    def _serve(self) -> bool:
        for key, _ in self._selector.select():
            if key.fd != self._wake_r:
                if key.fd in self._pipes:  # (a drain earlier in this turn may have read it to its end)
                    self._pump(key.fd, _READS_PER_TURN)
                continue
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 4096)
            while True:
                try:
                    what, fd, arg = self._requests.get_nowait()
                except queue.Empty:
                    break
                if what == "add":
                    self._add(fd, str(arg))
                elif what == "drain":
                    assert isinstance(arg, asyncio.Future)
                    self._drain(fd, arg)
                else:
                    self._stop()
                    return False
        return True

    def _add(self, fd: int, task_id: str) -> None:
        self._pipes[fd] = _Pipe(task_id)
        file = self._files.get(task_id)
        if file is None:
            file = self._files[task_id] = _TaskFile(self.path(task_id), self.max_bytes, self._budget)
        file.pipes += 1
        self._selector.register(fd, selectors.EVENT_READ)

    def _drain(self, fd: int, done: asyncio.Future[None]) -> None:
        if fd in self._pipes:
            self._pump(fd, _DRAIN_READS)
        with contextlib.suppress(RuntimeError):  # the loop closed
            self._loop.call_soon_threadsafe(_resolve, done)

    def _pump(self, fd: int, reads: int) -> None:
        """Read what the pipe holds (at most `reads` blocks) into its task's log."""
        pipe = self._pipes[fd]
        for _ in range(reads):
            try:
                data = os.read(fd, _READ_BYTES)
            except BlockingIOError:
                return
            if not data:
                self._eof(fd, pipe)
                return
            self._write(pipe.task_id, data)

    def _write(self, task_id: str, data: bytes) -> None:
        file = self._files[task_id]
        with self._lock:
            try:
                file.write(data)
                file.failed = False
                if self._budget is not None:
                    self._budget.enforce(self._close_path)
            except OSError as exc:  # a full disk: this output is lost, the worker is not held up
                file.close()
                if not file.failed:
                    log.warning("task %s: writing its log %s failed (%s); its output is dropped meanwhile",
                                task_id, file.path, exc)
                file.failed = True
            with self._followers_lock:
                for follower in self._followers.get(task_id, ()):
                    follower.push(data)

    def _close_path(self, path: Path) -> None:
        """The budget removes `path`: if a task's file open now is that one, close it (its next output starts a
        new file). (The writer thread, under the lock.)"""
        for file in self._files.values():
            if file.path == path:
                file.close()

    def _eof(self, fd: int, pipe: _Pipe) -> None:
        self._selector.unregister(fd)
        os.close(fd)
        del self._pipes[fd]
        file = self._files[pipe.task_id]
        file.pipes -= 1
        if file.pipes == 0:
            with self._lock:
                file.close()
            del self._files[pipe.task_id]

    def _stop(self) -> None:
        for fd in list(self._pipes):
            self._pump(fd, _DRAIN_READS)
        for fd in list(self._pipes):  # held open by a process outside the agent's reach: let it go
            self._selector.unregister(fd)
            os.close(fd)
        with self._lock:
            for file in self._files.values():
                file.close()
        self._pipes.clear()
        self._files.clear()
        self._selector.close()


async def _in_thread(func: Callable[..., _T], *args: object) -> _T:
    """`func(*args)` in a thread, awaited to its end even when the caller is cancelled meanwhile: it works on
    file descriptors the caller closes once it returns (closed under it, a number could be reused)."""
    done = asyncio.ensure_future(asyncio.to_thread(func, *args))
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await done
        raise


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


def _tail(parts: list[tuple[int, int, int]], lines: int) -> list[tuple[int, int, int]]:
    """The parts cut to their last `lines` lines (a last line without its newline counts); no fd is closed
    (the caller closes every part's)."""
    seen, last = 0, True
    for k in range(len(parts) - 1, -1, -1):
        fd, start, end = parts[k]
        pos = end
        while pos > start:
            lo = max(start, pos - _READ_BYTES)
            block = os.pread(fd, pos - lo, lo)
            if last and block.endswith(b"\n"):
                block = block[:-1]  # the newline ending the last line starts no line of its own
            last = False
            i = len(block)
            while (i := block.rfind(b"\n", 0, i)) >= 0:
                seen += 1
                if seen == lines:
                    return [(fd, lo + i + 1, end), *parts[k + 1:]]
            pos = lo
    return parts
