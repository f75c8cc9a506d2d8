"""Side tasks that fail in the ways real user code does, for the fault-injection suite.

Loaded by file reference; the plain failures (raises, sys.exit, abort, hangs, memory hog) live in
behaviours.py and are reused from there.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

from behaviours import Counter  # beside this file: task files import their neighbours

from freeride import IterativeTask, PoolItem, PoolTask

_SLEEPER = "import time; time.sleep(3600)"


class Segfaults(IterativeTask):
    """Dereferences a null pointer in its first step: the worker dies of SIGSEGV."""

    def step(self) -> None:
        ctypes.string_at(0)


class SegfaultPool(PoolTask):
    """Writes `out_dir/ID` (holding the id) for each item, except those in `poison` (ids, comma-separated), on
    which the worker kills itself with SIGSEGV. Every call of process() first appends the id to `out_dir/journal`
    (O_APPEND: one line per call)."""

    def __init__(self, pool: str, out_dir: str, poison: str) -> None:
        super().__init__(pool)
        self.out_dir = Path(out_dir)
        self.poison = set(poison.split(","))

    def setup(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def process(self, item: PoolItem) -> None:
        fd = os.open(self.out_dir / "journal", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{item.id}\n".encode())
        finally:
            os.close(fd)
        if item.id in self.poison:
            os.kill(os.getpid(), signal.SIGSEGV)
        tmp = self.out_dir / f".{item.id}.tmp"
        tmp.write_text(item.id)
        os.replace(tmp, self.out_dir / item.id)


class ForksAndDies(IterativeTask):
    """Leaves children behind, then dies in its first step.

    Two children it would normally wait for, plus one grandchild whose parent exits at once (so it
    is re-parented away from the worker, like a daemonised helper); with how="escape" also a child
    that starts a session of its own (setsid), out of the worker's process group. Every pid goes
    into `pidfile` before the worker dies, so a test can check that each one was reaped.
    """

    def __init__(self, pidfile: str, how: str = "raise") -> None:
        self.pidfile = Path(pidfile)
        self.how = how

    def step(self) -> None:
        children = [subprocess.Popen([sys.executable, "-c", _SLEEPER]) for _ in range(2)]
        pids = [c.pid for c in children]
        r, w = os.pipe()
        middle = os.fork()
        if middle == 0:  # the middle process: start the grandchild, report its pid, vanish
            os.close(r)
            grandchild = subprocess.Popen([sys.executable, "-c", _SLEEPER])
            os.write(w, str(grandchild.pid).encode())
            os._exit(0)
        os.close(w)
        pids.append(int(os.read(r, 64)))
        os.close(r)
        os.waitpid(middle, 0)
        if self.how == "escape":  # one more child, in a session of its own: out of the worker's process group
            pids.append(subprocess.Popen([sys.executable, "-c", _SLEEPER], start_new_session=True).pid)
        self.pidfile.write_text(" ".join(map(str, pids)))
        if self.how == "exit":
            os._exit(9)
        if self.how == "hang":
            time.sleep(3600)
        raise RuntimeError("died leaving children behind")


class UnmarkedChild(IterativeTask):
    """Starts a child in setup that only the kill of the worker's process group can reach.

    The child clears its environment (so it carries no worker mark for the agent's /proc scan to
    find) and stays in the worker's process group (no setsid). "<worker pid> <child pid>" goes into
    `pidfile` before the task is READY. Then the task is done after its first step, or with
    how="hang" hangs in that step.
    """

    def __init__(self, pidfile: str, how: str = "done") -> None:
        self.pidfile = Path(pidfile)
        self.how = how
        self.steps = 0

    def setup(self) -> None:
        child = subprocess.Popen([shutil.which("sleep") or "/bin/sleep", "3600"], env={}, stdin=subprocess.DEVNULL)
        tmp = self.pidfile.with_suffix(".tmp")
        tmp.write_text(f"{os.getpid()} {child.pid}")
        os.replace(tmp, self.pidfile)

    def step(self) -> None:
        self.steps += 1
        if self.how == "hang":
            time.sleep(3600)

    def is_done(self) -> bool:
        return self.steps >= 1


class SlowOnce(IterativeTask):
    """One step, `at`, takes `slow_ms` (longer than any bubble, as under a burst of load); the rest take 1 ms.

    Done after `steps` steps: it finishes only if that one slow step does not keep it out of
    every later bubble.
    """

    def __init__(self, at: int = 3, slow_ms: float = 300.0, steps: int = 60) -> None:
        self.at = at
        self.slow_s = slow_ms / 1e3
        self.steps = steps
        self.count = 0

    def step(self) -> None:
        self.count += 1
        time.sleep(self.slow_s if self.count == self.at else 1e-3)

    def is_done(self) -> bool:
        return self.count >= self.steps


class Beacon(Counter):
    """Counts 1 ms steps and writes each step's end (monotonic ns, 8 bytes) into a FIFO, never blocking.

    A test blocks on the FIFO to act while a step is running in a window, and reads when the
    steps stopped. Writes are dropped while nobody reads or the FIFO is full.
    """

    def __init__(self, fifo: str, step_ms: float = 1.0) -> None:
        super().__init__(step_ms)
        self.fifo = fifo
        self._fd: int | None = None

    def step(self) -> None:
        super().step()
        try:
            if self._fd is None:
                self._fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.write(self._fd, struct.pack("<q", time.monotonic_ns()))
        except OSError:  # no reader yet (ENXIO), full (EAGAIN), reader gone (EPIPE)
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
