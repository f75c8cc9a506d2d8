"""What waking a sleeping process costs on this machine: the floor under any trainer -> agent hop.

A child process runs a bare asyncio loop waiting on an eventfd (as the agent waits on a ring's);
this process writes the eventfd after the same sleeps the synthetic trainer takes. Reported:
the write's cost in the writer ("wake_write_us": an IPI to a halted CPU, on a VM an exit to
the hypervisor) and the time from before the write to the child's callback ("wake_delay_us").
No freeride code runs in either: the numbers are the machine's, the bench's others are ours.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from freeride.core.stats import percentile
from freeride.tooling.harness import sleep_until

_CHILD = """
import asyncio, os, sys
fd, n = int(sys.argv[1]), int(sys.argv[2])
if sys.argv[3]:  # the agent's CPUs, where the bench puts the agent on its own
    os.sched_setaffinity(0, {int(c) for c in sys.argv[3].split(",")})
woke = []
async def main():
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    def cb():
        woke.append(__import__("time").monotonic_ns())
        os.read(fd, 8)
        if len(woke) == n:
            done.set_result(None)
    loop.add_reader(fd, cb)
    print("ready", flush=True)
    await done
asyncio.run(main())
print(" ".join(map(str, woke)), flush=True)
"""


def measure(count: int, gap_ms: float, cpus: frozenset[int] | None = None) -> dict[str, float]:
    """`cpus`: where the woken child runs (the agent's CPUs); None: where the scheduler puts it."""
    fd = os.eventfd(0, os.EFD_SEMAPHORE)  # one callback per write, even if two writes land before it runs
    one = (1).to_bytes(8, "little")
    where = ",".join(map(str, sorted(cpus or ())))
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(fd), str(count), where], pass_fds=(fd,),
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        child.stdout.readline()  # "ready": its reader is registered
        writes: list[int] = []
        sent: list[int] = []
        t = time.monotonic_ns()
        for _ in range(count):
            t += int(gap_ms * 1e6)
            sleep_until(t)
            a = time.perf_counter_ns()
            sent.append(time.monotonic_ns())
            os.write(fd, one)
            writes.append(time.perf_counter_ns() - a)
        woke = [int(x) for x in child.stdout.readline().split()]
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        os.close(fd)
    delays = [(w - s) / 1e3 for s, w in zip(sent, woke, strict=True)]
    return {
        "wake_write_us_p50": round(percentile([w / 1e3 for w in writes], 0.5), 2),
        "wake_write_us_p99": round(percentile([w / 1e3 for w in writes], 0.99), 2),
        "wake_delay_us_p50": round(percentile(delays, 0.5), 1),
        "wake_delay_us_p99": round(percentile(delays, 0.99), 1),
    }
