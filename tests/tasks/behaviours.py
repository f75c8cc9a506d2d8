"""Side tasks with known behaviour, for the integration tests (loaded by file reference)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from freeride import ImperativeTask, IterativeTask


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
        self.held.append(bytearray(b"x" * self.step_bytes))  # written, so resident


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
        tmp.write_text(json.dumps({"env": dict(os.environ), "device": self.context.device}))
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
