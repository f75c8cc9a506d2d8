"""Side tasks whose checkpoints are slow or fail, or that break their worker's plumbing (loaded by file reference).

The lifecycle tests (tests/faults/test_task_lifecycle.py, tests/unit/worker/test_worker_lifecycle.py) use them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from behaviours import Counter  # beside this file: task files import their neighbours

from freeride import PermanentError


class SlowCheckpoint(Counter):
    """A Counter whose state_dict() takes `checkpoint_s` (a large state being gathered and pickled).

    With `fifo`, it writes `b` into that FIFO when a state_dict() begins and `e` when it ends, never blocking
    (a test opens the FIFO first and blocks on it to act while a checkpoint runs).
    """

    def __init__(self, checkpoint_s: float = 3.0, step_ms: float = 1.0, fifo: str = "") -> None:
        super().__init__(step_ms)
        self.checkpoint_s = checkpoint_s
        self.fifo = fifo

    def _say(self, what: bytes) -> None:
        if not self.fifo:
            return
        try:
            fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # no reader
            return
        try:
            os.write(fd, what)
        except OSError:
            pass
        finally:
            os.close(fd)

    def state_dict(self) -> Mapping[str, Any]:
        self._say(b"b")
        time.sleep(self.checkpoint_s)
        self._say(b"e")
        return super().state_dict()


class BadStateDict(Counter):
    """state_dict() raises."""

    def state_dict(self) -> Mapping[str, Any]:
        raise RuntimeError("cannot gather the state")


class BadLoad(Counter):
    """load_state_dict() raises (its checkpoint is written fine)."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        raise KeyError("weights")


class ClosesFds(Counter):
    """Closes every file descriptor from 3 up in step `at` (a sloppy daemonising helper would)."""

    def __init__(self, at: int = 3) -> None:
        super().__init__(1.0)
        self.at = at

    def step(self) -> None:
        super().step()
        if self.count == self.at:
            os.closerange(3, 1024)


class ClosesFdsWhenBuilt(Counter):
    """Closes every file descriptor from 3 up in its constructor (`where="init"`) or in setup() (`"setup"`)."""

    def __init__(self, where: str = "init") -> None:
        super().__init__(1.0)
        self.where = where
        if where == "init":
            os.closerange(3, 1024)

    def setup(self) -> None:
        super().setup()
        if self.where == "setup":
            os.closerange(3, 1024)


class CannotRunHere(Counter):
    """setup() (or, with `where="step"`, the first step) finds the task cannot run: a restart would meet it again."""

    def __init__(self, where: str = "setup") -> None:
        super().__init__()
        self.where = where

    def setup(self) -> None:
        if self.where == "setup":
            raise PermanentError("prompts.jsonl line 3: an empty prompt")

    def step(self) -> None:
        if self.where == "step":
            raise PermanentError("item 7 holds token 300; the model's ids are 0..255")
        super().step()
