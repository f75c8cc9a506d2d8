"""Side tasks that start processes which try to outlive them (tests/faults/test_escape.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from freeride import IterativeTask


class Escapee(IterativeTask):
    """In setup, starts a process that sleeps 1000 s the way a daemon escapes: fork, setsid() (out of the worker's
    process group), an empty environment (no worker mark), exec. "<worker pid> <escapee pid>" goes into `pidfile`
    before the task is READY, once the escapee says it runs: Popen returns as the exec begins, before the new
    program's environment is in place (/proc/PID/environ read empty there once, on a loaded machine). keep_env=1
    keeps the environment (and so the mark). Done after `steps` steps (0: never)."""

    def __init__(self, pidfile: str, steps: int = 1, keep_env: int = 0) -> None:
        self.pidfile = Path(pidfile)
        self.steps = steps
        self.env = None if keep_env else {}
        self.done = 0

    def setup(self) -> None:
        child = subprocess.Popen([sys.executable, "-c", "import os, time; os.write(1, b'x'); time.sleep(1000)"],
                                 env=self.env, start_new_session=True, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE)
        assert child.stdout is not None
        with child.stdout:
            child.stdout.read(1)  # it runs: its exec is done, its environment in place
        tmp = self.pidfile.with_suffix(".tmp")
        tmp.write_text(f"{os.getpid()} {child.pid}")
        os.replace(tmp, self.pidfile)

    def step(self) -> None:
        self.done += 1
        time.sleep(0.001)

    def is_done(self) -> bool:
        return 0 < self.steps <= self.done


class Chatty(IterativeTask):
    """Prints `lines_per_step` numbered lines each step ("line N"); after `steps` steps (0: never) prints
    "last line" and, with fail=1, raises ValueError("the end")."""

    def __init__(self, steps: int = 0, lines_per_step: int = 1, fail: int = 0) -> None:
        self.steps = steps
        self.per_step = lines_per_step
        self.fail = fail
        self.n = 0
        self.done = 0

    def step(self) -> None:
        out = []
        for _ in range(self.per_step):
            out.append(f"line {self.n}\n")
            self.n += 1
        sys.stdout.write("".join(out))
        self.done += 1
        if self.steps and self.done >= self.steps:
            print("last line", flush=True)
            if self.fail:
                raise ValueError("the end")

    def is_done(self) -> bool:
        return 0 < self.steps <= self.done
