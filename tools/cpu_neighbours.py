"""What a busy CPU trainer pays for its freeride neighbours: iteration median and p95 per case, as JSON.

    python tools/cpu_neighbours.py [--seconds 12] [--before PATH] [--burst 200]

A trainer of two ranks, one process pinned to each of the first two CPUs, each iteration a fixed pure-Python
computation and then a 10 ms bubble reported to the agent (the agent grants windows in it). Cases, each with a
fresh agent (CPU mode, defaults: workers at nice 19):
  - baseline: the agent, no task;
  - burner: a task whose thread spins outside its windows (tests/tasks/placement.py:BurnsBetweenWindows);
  - forks: a task that forks 8 processes spinning for ever (ForksSpinners: a bounded fork bomb);
  - burst: `--burst` quick submits at once (the reference checks, the workers' starts, the database);
  - prune: `freeride prune`-style prunes in a loop, each over tasks just finished.
With `--before PATH` (another checkout, e.g. `git worktree add /tmp/before <commit>`), every case runs with
the agent from PATH and from this checkout, back to back, alternated. Iteration time is each rank's compute
part (the bubble's sleep excluded), both ranks pooled. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
TASKS = HERE / "tests" / "tasks" / "placement.py"

RANK = """
import json, sys, time
from freeride.trainer.reporter import BubbleReporter
target, rank, seconds, work = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
rep = BubbleReporter(target, rank=rank)
rep.wait_connected(10)
out, end = [], time.monotonic() + seconds
it = 0
while time.monotonic() < end:
    rep.set_iteration(it); it += 1
    t0 = time.perf_counter_ns()
    x = 0
    for i in range(work):
        x += i * i
    out.append((time.perf_counter_ns() - t0) / 1e6)
    rep.start(0)
    time.sleep(0.01)
    rep.end(0)
rep.close()
print(json.dumps(out[3:]))
"""


def _trainer(target: str, seconds: float, work: int, env: dict[str, str]) -> list[float]:
    cpus = sorted(os.sched_getaffinity(0))[:2]
    procs = [subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", RANK, target, str(rank),
                               str(seconds), str(work)], stdout=subprocess.PIPE, env=env)
             for rank, cpu in enumerate(cpus)]
    times: list[float] = []
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 60)
        times += json.loads(out)
    return times


def _summary(times: list[float]) -> dict[str, float]:
    times = sorted(times)
    return {"median_ms": round(statistics.median(times), 1), "p95_ms": round(times[int(0.95 * len(times))], 1),
            "iterations": len(times)}


def _case(name: str, tree: Path, seconds: float, work: int, burst: int) -> dict[str, float]:
    from freeride.tooling.harness import AgentProcess
    from freeride.v1 import tasks_pb2

    env = {**os.environ, "PYTHONPATH": str(tree)}
    # `python -m` puts its working directory first on sys.path, before PYTHONPATH: the agent (and what it starts)
    # must start in the tree it is to run, or every case runs this checkout.
    os.chdir(tree)
    with tempfile.TemporaryDirectory() as tmp:
        agent = AgentProcess(state_dir=Path(tmp) / "state", env=env)
        stop = threading.Event()
        background: list[threading.Thread] = []
        with agent, agent.client() as c:
            if name == "burner":
                c.submit(tasks_pb2.TaskSpec(ref=f"{TASKS}:BurnsBetweenWindows"))
            elif name == "forks":
                c.submit(tasks_pb2.TaskSpec(ref=f"{TASKS}:ForksSpinners"))
            elif name == "burst":
                def submit_all() -> None:
                    with ThreadPoolExecutor(32) as pool:
                        list(pool.map(lambda _: c.submit(tasks_pb2.TaskSpec(ref=f"{TASKS}:Quiet")), range(burst)))
                background.append(threading.Thread(target=submit_all, daemon=True))
            elif name == "prune":
                def prune_loop() -> None:
                    while not stop.is_set():
                        for _ in range(20):
                            t = c.submit(tasks_pb2.TaskSpec(ref=f"{TASKS}:Quiet"))
                            c.cancel(t.id)
                        c.prune(older_than_s=0)
                background.append(threading.Thread(target=prune_loop, daemon=True))
            for t in background:
                t.start()
            times = _trainer(agent.target, seconds, work, env)
            stop.set()
        return _summary(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--work", type=int, default=1_500_000, help="loop turns per iteration (~150 ms here)")
    ap.add_argument("--burst", type=int, default=200)
    ap.add_argument("--before", type=Path, help="another checkout: its agent runs each case too, alternated")
    ap.add_argument("--cases", default="baseline,burner,forks,burst,prune")
    ns = ap.parse_args()
    trees = [("before", ns.before), ("after", HERE)] if ns.before else [("after", HERE)]
    result: dict[str, dict[str, dict[str, float]]] = {}
    for case in ns.cases.split(","):
        for label, tree in trees:
            result.setdefault(case, {})[label] = _case(case, tree, ns.seconds, ns.work, ns.burst)
            print(json.dumps({case: {label: result[case][label]}}), file=sys.stderr, flush=True)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
