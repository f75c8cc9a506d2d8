"""Side tasks with known behaviour, for the integration tests (loaded by file reference)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from freeride import ImperativeTask, IterativeTask, Unavailable
from freeride.tooling.tasks import touched


class Counter(IterativeTask):
    """Counts its steps; each step sleeps step_ms. Checkpoints the count."""

    def __init__(self, step_ms: float = 1.0, steps: int = 0) -> None:
        self.step_s = step_ms / 1e3
        self.limit = steps
        self.count = 0

    def step(self) -> None:
        time.sleep(self.step_s)
        self.count += 1

    def is_done(self) -> bool:
        return self.limit > 0 and self.count >= self.limit

    def progress(self) -> Mapping[str, float]:
        return {"count": float(self.count)}

    def state_dict(self) -> Mapping[str, Any]:
        return {"count": self.count}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.count = int(state["count"])


class CrashOnce(Counter):
    """Raises once, at step `at`, the first time only (a marker file remembers)."""

    def __init__(self, marker: str, at: int = 20, step_ms: float = 1.0, steps: int = 0) -> None:
        super().__init__(step_ms, steps)
        self.marker = Path(marker)
        self.at = at

    def step(self) -> None:
        super().step()
        if self.count == self.at and not self.marker.exists():
            self.marker.write_text("crashed")
            raise RuntimeError("injected crash")


class AlwaysFails(IterativeTask):
    def step(self) -> None:
        raise RuntimeError("boom")


class Hangs(Counter):
    """Hangs forever in step `at` (once, remembered by a marker file)."""

    def __init__(self, marker: str, at: int = 5) -> None:
        super().__init__(1.0)
        self.marker = Path(marker)
        self.at = at

    def step(self) -> None:
        super().step()
        if self.count == self.at and not self.marker.exists():
            self.marker.write_text("hung")
            time.sleep(3600)


class Exits(IterativeTask):
    def step(self) -> None:
        sys.exit(3)


class Aborts(IterativeTask):
    def step(self) -> None:
        os.abort()


class Pieces(ImperativeTask):
    """An imperative loop: `pieces` pieces of work with a yield point after each."""

    def __init__(self, pieces: int = 50, piece_ms: float = 1.0) -> None:
        self.pieces = pieces
        self.piece_s = piece_ms / 1e3
        self.done = 0

    def run(self) -> None:
        while self.done < self.pieces:
            time.sleep(self.piece_s)
            self.done += 1
            self.yield_point()

    def progress(self) -> Mapping[str, float]:
        return {"pieces": float(self.done)}

    def state_dict(self) -> Mapping[str, Any]:
        return {"done": self.done}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.done = int(state["done"])


class Hog(Counter):
    """Grows by `step_mb` of touched memory every step (each at least `step_ms` long): past any cap, eventually."""

    def __init__(self, step_mb: int = 4, step_ms: float = 1.0) -> None:
        super().__init__(step_ms)
        self.step_bytes = step_mb * 2**20
        self.held: list[bytearray] = []

    def step(self) -> None:
        super().step()
        self.held.append(touched(self.step_bytes))  # resident, at a page fault a page


class ForkedIdle(Counter):
    """Like a DataLoader's workers: in setup, touches `before_mb`, forks `children` idle children (each
    blocked on a pipe: the pages stay shared with it), then touches `after_mb` more in itself alone.
    The children exit at teardown (or when the worker dies: their pipe closes)."""

    def __init__(self, children: int = 8, before_mb: int = 64, after_mb: int = 64) -> None:
        super().__init__(1.0)
        self.n, self.before, self.after = children, before_mb * 2**20, after_mb * 2**20
        self.held: list[bytearray] = []
        self.pids: list[int] = []
        self.w = -1

    def setup(self) -> None:
        self.held.append(bytearray(b"x" * self.before))  # written, so resident, then shared with each child
        r, self.w = os.pipe()
        for _ in range(self.n):
            pid = os.fork()
            if pid == 0:  # the child: nothing but a read until its parent goes
                os.close(self.w)
                os.read(r, 1)
                os._exit(0)
            self.pids.append(pid)
        os.close(r)
        self.held.append(bytearray(b"x" * self.after))

    def teardown(self) -> None:
        os.close(self.w)
        for pid in self.pids:
            os.waitpid(pid, 0)


class NotATask:
    def step(self) -> None:
        pass


class EnvDump(Counter):
    """Writes its environment and the device it was given (JSON) to `path` in setup, then counts."""

    def __init__(self, path: str) -> None:
        super().__init__(1.0)
        self.path = Path(path)

    def setup(self) -> None:
        import json

        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"env": dict(os.environ), "device": self.context.device, "gpu": self.context.gpu}))
        os.replace(tmp, self.path)


class TimedHog(Hog):
    """A Hog that writes the wall-clock time at which its own memory first passed `mark_mb` into `marker`."""

    def __init__(self, marker: str, mark_mb: int, step_mb: int = 4, step_ms: float = 1.0) -> None:
        super().__init__(step_mb, step_ms)
        self.marker = Path(marker)
        self.mark_bytes = mark_mb * 2**20

    def setup(self) -> None:
        import psutil  # here, not in the first step: an import would make that step look 50 ms long

        self.me = psutil.Process()
        self.marked = self.marker.exists()

    def step(self) -> None:
        super().step()
        if not self.marked and self.me.memory_info().rss > self.mark_bytes:
            self.marker.write_text(repr(time.time()))
            self.marked = True


class NeedsFile(Counter):
    """A Counter whose resource is a file: while `marker` is absent its step raises Unavailable, and
    available() (the worker's check between backoffs) looks for the file."""

    def __init__(self, marker: str, steps: int = 0, retry_s: float = 0.05, max_retry_s: float = 0.2) -> None:
        super().__init__(1.0, steps)
        self.marker = Path(marker)
        self.retry_s, self.max_retry_s = retry_s, max_retry_s

    def step(self) -> None:
        if not self.marker.exists():
            raise Unavailable(f"{self.marker.name} is missing", retry_s=self.retry_s, max_retry_s=self.max_retry_s)
        super().step()

    def available(self) -> bool:
        return self.marker.exists()


class WaitsInRun(ImperativeTask):
    """Raises Unavailable from run(): a mistake (only a step can be given back), reported as such."""

    def run(self) -> None:
        self.yield_point()
        raise Unavailable("the database is down")


class Picky(Counter):
    """Refuses, at submit, a size that is not positive (ValueError) and size=13 (any other exception)."""

    def __init__(self, size: int = 1) -> None:
        super().__init__(1.0)
        self.size = size

    @classmethod
    def check_args(cls, **kwargs: Any) -> None:
        size = kwargs.get("size", 1)
        if size == 13:
            raise RuntimeError("unlucky\nsize")
        if size <= 0:
            raise ValueError(f"size must be positive, got {size}")


class Says(Counter):
    """Prints `text` in setup, then counts; with `fail`, its first step raises RuntimeError(text)."""

    def __init__(self, text: str = "hello", fail: int = 0) -> None:
        super().__init__()
        self.text = text
        self.fail = fail

    def setup(self) -> None:
        print(self.text, flush=True)

    def step(self) -> None:
        if self.fail:
            raise RuntimeError(self.text)
        super().step()


class HugeProgress(Counter):
    """A Counter whose progress() returns `keys` entries (300,000: about 5 MiB on the wire), a NaN and a string."""

    def __init__(self, keys: int = 300_000, step_ms: float = 1.0, steps: int = 0) -> None:
        super().__init__(step_ms, steps)
        self.huge: dict[str, Any] = {"count": 0.0, "loss": float("nan"), "phase": "warm-up"}
        self.huge.update((f"metric_{i:07d}", float(i)) for i in range(keys))  # built once: progress() stays cheap

    def progress(self) -> Mapping[str, float]:
        self.huge["count"] = float(self.count)
        return self.huge


class Ballast(Counter):
    """A Counter whose checkpoint carries `ballast_bytes` of padding (a large model state on the disk)."""

    def __init__(self, ballast_bytes: int = 1 << 20, steps: int = 0) -> None:
        super().__init__(steps=steps)
        self.ballast = b"\0" * ballast_bytes

    def state_dict(self) -> Mapping[str, Any]:
        return {"count": self.count, "ballast": self.ballast}


class Prints(Counter):
    """A Counter that prints a line of `line_bytes` every step (a chatty task: its logs grow as it runs)."""

    def __init__(self, line_bytes: int = 1024, steps: int = 0) -> None:
        super().__init__(steps=steps)
        self.line = "x" * max(0, line_bytes - 16)

    def step(self) -> None:
        super().step()
        print(f"{self.count:>14} {self.line}", flush=True)
