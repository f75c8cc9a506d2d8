"""What one window transition of a worker costs (freeride.worker.offwindow): demoting its other threads to
SCHED_IDLE when it starts to wait, restoring them on a grant; per thread count, as JSON.

    python tools/off_window_cost.py [--threads 1,4,16,64] [--rounds 2000]

Needs the right to leave SCHED_IDLE (root, CAP_SYS_NICE or RLIMIT_NICE). A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

from freeride.worker.offwindow import OffWindow, may_leave_idle, threads


def measure(count: int, rounds: int) -> dict[str, float]:
    stop = threading.Event()
    spare = frozenset(threads())
    pool = [threading.Thread(target=stop.wait, daemon=True) for _ in range(count)]
    for t in pool:
        t.start()
    off = OffWindow(True, lambda cpu, waited: None, time.monotonic_ns, spare=spare)
    enter, restore = [], []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        off.enter()
        t1 = time.perf_counter_ns()
        off.leave()
        t2 = time.perf_counter_ns()
        off.restore()
        t3 = time.perf_counter_ns()
        enter.append((t1 - t0) / 1e3)
        restore.append((t3 - t2) / 1e3)
    stop.set()
    return {"threads": count, "demote_p50_us": round(statistics.median(enter), 1),
            "restore_p50_us": round(statistics.median(restore), 1),
            "restore_p99_us": round(sorted(restore)[int(0.99 * len(restore))], 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,4,16,64")
    ap.add_argument("--rounds", type=int, default=2000)
    ns = ap.parse_args()
    problem = may_leave_idle(0)
    if problem:
        print(json.dumps({"error": problem}))
        return 2
    print(json.dumps([measure(int(n), ns.rounds) for n in ns.threads.split(",")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
