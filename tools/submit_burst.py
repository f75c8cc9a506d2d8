"""Measure a burst of quick submits against a real agent: submit latency, the host's peak memory, and the
agent's own memory before and after (issue 11, "bounded resources").

    python tools/submit_burst.py [--tasks 200] [--steps 20] [-- AGENT ARGS...]

Starts `freeride agent` (CPU mode) with a synthetic trainer rank reporting 20 ms bubbles, submits
`--tasks` small tasks at once (one thread each), waits until all are DONE, then reports:
  - submit latency (p50, p95, max) and the burst's wall time;
  - peak RSS of the agent's process tree (agent + checks + workers) and peak worker count during the run,
    sampled every 50 ms (a measurement, not a control path);
  - the agent's RSS after start-up and one warm-up task, and after the burst has finished and settled.
To measure another version: `cd` out of this checkout and set PYTHONPATH to that version's tree.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from freeride.errors import FreerideError
from freeride.tooling.harness import AgentProcess, replay, wait_for
from freeride.tooling.trace import Segment
from freeride.trainer.reporter import BubbleReporter
from freeride.v1 import tasks_pb2

TASK = """
from freeride import IterativeTask

class Quick(IterativeTask):
    def __init__(self, steps: int = 20) -> None:
        self.limit, self.count = steps, 0

    def step(self) -> None:
        self.count += 1

    def is_done(self) -> bool:
        return self.count >= self.limit
"""


_OVER = (tasks_pb2.TASK_STATE_DONE, tasks_pb2.TASK_STATE_FAILED, tasks_pb2.TASK_STATE_CANCELLED)


class Sampler:
    """Peak RSS of a process tree and its peak number of worker processes, every `every_s`."""

    def __init__(self, pid: int, every_s: float = 0.05) -> None:
        self._root = psutil.Process(pid)
        self._every_s = every_s
        self._stop = threading.Event()
        self.peak_rss_bytes = 0
        self.peak_workers = 0
        self.peak_checks = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            rss, workers, checks = 0, 0, 0
            for p in [self._root, *self._root.children(recursive=True)]:
                try:
                    rss += p.memory_info().rss
                    cmd = p.cmdline()  # words: the worker is `-m freeride.worker`, the check `.worker.check`
                except psutil.NoSuchProcess:
                    continue
                workers += "freeride.worker" in cmd
                checks += "freeride.worker.check" in cmd
            self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
            self.peak_workers = max(self.peak_workers, workers)
            self.peak_checks = max(self.peak_checks, checks)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _trainer(agent: AgentProcess, stop: threading.Event) -> None:
    reporter = BubbleReporter(agent.target, rank=0)
    assert reporter.wait_connected(10), "reporter did not connect"
    iteration = [[Segment(0.002, False), Segment(0.020, True, 0)]] * 10
    while not stop.is_set():
        replay(reporter, iteration)
    reporter.close()


def _wait_done(agent: AgentProcess, ids: set[str], timeout_s: float) -> bool:
    done: set[str] = set()
    with agent.client() as c:
        def now() -> bool | None:
            done.update(t.id for t in c.list() if t.state in _OVER)
            return True if done >= ids else None

        def on_event(ev: tasks_pb2.AgentEvent) -> bool | None:
            if ev.HasField("task") and ev.task.state in _OVER:
                done.add(ev.task.id)
            return True if done >= ids else None

        return bool(wait_for(c, now, on_event, timeout_s))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=200)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--settle-s", type=float, default=3.0, help="wait after the burst before the last RSS reading")
    p.add_argument("--timeout-s", type=float, default=600.0, help="give up waiting for the tasks after this long")
    p.add_argument("agent_args", nargs="*")
    ns = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="frburst-", dir="/tmp") as tmp:
        task_file = Path(tmp) / "quick.py"
        task_file.write_text(TASK)
        spec = tasks_pb2.TaskSpec(ref=f"{task_file}:Quick", args={"steps": str(ns.steps)})
        agent = AgentProcess(state_dir=Path(tmp) / "state", extra_args=ns.agent_args).start()
        stop = threading.Event()
        trainer = threading.Thread(target=_trainer, args=(agent, stop), daemon=True)
        trainer.start()
        try:
            assert agent.proc is not None
            proc = psutil.Process(agent.proc.pid)
            with agent.client() as c:
                warm = c.submit(spec).id
            assert _wait_done(agent, {warm}, 60), "the warm-up task did not finish"
            rss_before = proc.memory_info().rss

            def submit(_: int) -> tuple[str, float]:
                """The task's id ("" if the submit failed) and the submit's latency."""
                with agent.client() as c:
                    t0 = time.monotonic()
                    try:
                        task_id = c.submit(spec).id
                    except FreerideError as exc:
                        failures[f"{type(exc).__name__}: {exc}"[:100]] += 1
                        task_id = ""
                    return task_id, time.monotonic() - t0

            failures: collections.Counter[str] = collections.Counter()

            with Sampler(agent.proc.pid) as sampler:
                t0 = time.monotonic()
                with ThreadPoolExecutor(ns.tasks) as pool:
                    results = list(pool.map(submit, range(ns.tasks)))
                burst_s = time.monotonic() - t0
                all_done = _wait_done(agent, {i for i, _ in results if i}, ns.timeout_s)
                run_s = time.monotonic() - t0
            time.sleep(ns.settle_s)  # a measurement: let the agent's loop go quiet before reading its RSS
            rss_after = proc.memory_info().rss
            with agent.client() as c:
                states = collections.Counter(tasks_pb2.TaskState.Name(t.state) for t in c.list())
                left = collections.Counter(t.reason[:100] for t in c.list() if t.state != tasks_pb2.TASK_STATE_DONE)
            if left:
                print("not DONE:", dict(left.most_common(5)))
        finally:
            stop.set()
            trainer.join(10)
            code = agent.stop()
    if failures:
        print(f"{sum(failures.values())} submits failed: {dict(failures)}")
    lat = sorted(s for _, s in results)
    q = statistics.quantiles(lat, n=20)
    mib = 2**20
    print(f"tasks {ns.tasks} ({ns.steps} steps each), all over: {all_done} {dict(states)}, agent exit {code}")
    print(f"submit latency s: p50 {statistics.median(lat):.2f}  p95 {q[-1]:.2f}  max {lat[-1]:.2f}; "
          f"all submitted in {burst_s:.1f} s, all done in {run_s:.1f} s")
    print(f"peak during the run: tree RSS {sampler.peak_rss_bytes / mib:.0f} MiB, "
          f"{sampler.peak_workers} workers, {sampler.peak_checks} checks at once")
    print(f"agent RSS: {rss_before / mib:.0f} MiB before, {rss_after / mib:.0f} MiB after")
    return 0 if all_done else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
