"""A side task that reports the CPU placement of each of its threads and of a process it starts."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

from freeride import IterativeTask


def _placement(pid: int) -> list[dict[str, object]]:
    """Niceness, CPUs and policy of every thread of `pid`."""
    out: list[dict[str, object]] = []
    for tid in sorted(int(t) for t in os.listdir(f"/proc/{pid}/task")):
        out.append({"nice": os.getpriority(os.PRIO_PROCESS, tid), "cpus": sorted(os.sched_getaffinity(tid)),
                    "sched": os.sched_getscheduler(tid)})
    return out


class ReportsPlacement(IterativeTask):
    """In setup: starts a thread and a child process, then writes every placement to `path` (JSON)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    @classmethod
    def check_args(cls, **kwargs: object) -> None:
        """Runs in the submit's reference check: where that process runs goes beside `path` (.check.json)."""
        out = Path(str(kwargs["path"])).with_suffix(".check.json")
        out.with_suffix(".tmp").write_text(json.dumps(_placement(os.getpid())))
        os.replace(out.with_suffix(".tmp"), out)

    def setup(self) -> None:
        started = threading.Event()
        threading.Thread(target=lambda: (started.set(), threading.Event().wait()), daemon=True).start()
        started.wait()
        child = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL)  # dies with the worker's group
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"worker": _placement(os.getpid()), "child": _placement(child.pid)}))
        os.replace(tmp, self.path)

    def step(self) -> None:
        pass


class BurnsBetweenWindows(IterativeTask):
    """Starts a thread that spins for ever, windows or not: training pays for it between windows too."""

    def setup(self) -> None:
        def spin() -> None:
            n = 0
            while True:
                n += 1

        threading.Thread(target=spin, name="spinner", daemon=True).start()

    def step(self) -> None:
        pass


class ForksSpinners(IterativeTask):
    """Forks `children` processes (8 by default) that spin for ever, windows or not: a bounded fork bomb. They die
    with the worker's process group (or its cgroup) when the task ends."""

    def __init__(self, children: str = "8") -> None:
        self.children = int(children)

    def setup(self) -> None:
        for _ in range(self.children):
            if os.fork() == 0:
                while True:
                    pass

    def step(self) -> None:
        pass


class Quiet(IterativeTask):
    """Uses the CPU only in its steps."""

    def step(self) -> None:
        sum(range(1000))
