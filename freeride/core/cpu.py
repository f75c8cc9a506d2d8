"""Where and how eagerly a process runs on the CPU: CPU lists ("0-3,8"), niceness, SCHED_IDLE.

The agent may keep itself to some CPUs (`--agent-cpus`, `pin_threads`): off the training ranks'
cores, a woken agent never preempts a rank in the middle of its bubble hook.

The agent decides a side-task worker's placement (`--worker-nice`, `--worker-cpus`, `--worker-sched`)
and passes it in the worker's environment; the worker applies it to itself first thing, to every
thread it has, so that every thread and process it starts later inherits it. Linux keeps niceness,
affinity and policy per thread: applied from outside after the spawn, a thread started meanwhile
would escape.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

NICE_ENV = "FREERIDE_WORKER_NICE"
CPUS_ENV = "FREERIDE_WORKER_CPUS"
SCHED_ENV = "FREERIDE_WORKER_SCHED"
SCHEDS = ("other", "idle")  # SCHED_OTHER (with its niceness) or SCHED_IDLE (runs only on an otherwise idle CPU)


def parse_cpu_list(text: str) -> frozenset[int]:
    """ "0-3,8" -> {0, 1, 2, 3, 8}; ValueError saying what is wrong."""
    cpus: set[int] = set()
    for part in text.replace(" ", "").split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"{text!r} is not a CPU list like 0-3,8")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"{text!r}: range {part} runs backwards")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """{0, 1, 2, 3, 8} -> "0-3,8"."""
    out: list[str] = []
    for cpu in sorted(set(cpus)):
        if out and out[-1].rpartition("-")[2] == str(cpu - 1):
            out[-1] = f"{out[-1].partition('-')[0]}-{cpu}"
        else:
            out.append(str(cpu))
    return ",".join(out)


def lowest_nice_allowed() -> int:
    """The lowest niceness this process may give a thread: its own unless root or RLIMIT_NICE allows lower."""
    if os.geteuid() == 0:
        return -20
    own = os.getpriority(os.PRIO_PROCESS, 0)
    return min(own, 20 - resource.getrlimit(resource.RLIMIT_NICE)[0])


def allowed_cpus(cpus: frozenset[int], flag: str, whose: str = "the agent's") -> frozenset[int]:
    """`cpus` if this process may run there; ValueError naming `flag` (and `whose` CPUs these are) otherwise."""
    if not hasattr(os, "sched_setaffinity"):
        raise ValueError(f"{flag} needs Linux (sched_setaffinity); leave it out")
    allowed = os.sched_getaffinity(0)
    outside = cpus - allowed
    if not cpus or outside:
        raise ValueError(f"{flag} {format_cpu_list(cpus)}: CPU {format_cpu_list(outside) or '-'} "
                         f"is not among {whose} CPUs ({format_cpu_list(allowed)}); pick from those")
    return cpus


def _threads(tasks_dir: Path) -> list[int]:
    try:
        return [int(t.name) for t in tasks_dir.iterdir()]
    except OSError:  # no /proc: the calling thread only
        return [0]


def pin_threads(cpus: frozenset[int], tasks_dir: Path = Path("/proc/self/task")) -> None:
    """Every thread of this process to `cpus` (Linux keeps affinity per thread; later threads inherit it)."""
    for tid in _threads(tasks_dir):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)


@dataclass(frozen=True)
class Placement:
    """A worker's CPU placement: niceness (0..19), the CPUs it may use (None: any), its scheduling policy."""

    nice: int = 0
    cpus: frozenset[int] | None = None
    sched: str = "other"

    def check(self) -> Placement:
        """ValueError naming the setting (as an agent flag) that this host cannot give."""
        if not 0 <= self.nice <= 19:
            raise ValueError(f"--worker-nice must be 0..19 (19: the lowest priority), got {self.nice}")
        if self.nice < lowest_nice_allowed():
            own = os.getpriority(os.PRIO_PROCESS, 0)
            raise ValueError(f"--worker-nice {self.nice}: the agent runs at nice {own} and may not raise a worker "
                             f"above it (that needs root or CAP_SYS_NICE); use {own}..19")
        if self.sched not in SCHEDS:
            raise ValueError(f"--worker-sched must be other or idle, got {self.sched!r}")
        if self.sched == "idle" and not hasattr(os, "SCHED_IDLE"):
            raise ValueError("--worker-sched idle needs Linux (SCHED_IDLE); use other")
        if self.cpus is not None:
            allowed_cpus(self.cpus, "--worker-cpus")
        return self

    def describe(self) -> str:
        where = f"CPUs {format_cpu_list(self.cpus)}" if self.cpus is not None else "any CPU"
        how = "SCHED_IDLE" if self.sched == "idle" else f"nice {self.nice}"
        return f"{how}, {where}"

    def to_env(self) -> dict[str, str]:
        return {NICE_ENV: str(self.nice), CPUS_ENV: format_cpu_list(self.cpus) if self.cpus is not None else "",
                SCHED_ENV: self.sched}

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Placement | None:
        """What the agent put in a worker's environment; None when it put nothing (leave the process as it is)."""
        if not env.get(NICE_ENV):
            return None
        cpus = env.get(CPUS_ENV, "")
        return cls(nice=int(env[NICE_ENV]), cpus=parse_cpu_list(cpus) if cpus else None,
                   sched=env.get(SCHED_ENV) or "other")

    def start_at(self, pid: int) -> None:
        """A process the agent just spawned, to this placement at once from outside: its interpreter's start-up and
        imports (~0.1 s of CPU for a worker, ~50 ms for a check) ran at the agent's own priority until it applied
        the placement itself (`apply`, which still covers every thread it has). Never raises: the process
        applies it anyway, and one that already ended has nothing to move."""
        with contextlib.suppress(OSError):
            if self.cpus is not None:
                os.sched_setaffinity(pid, self.cpus)
            if self.sched == "idle":
                os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
            if os.getpriority(os.PRIO_PROCESS, pid) < self.nice:
                os.setpriority(os.PRIO_PROCESS, pid, self.nice)
        if autogroup_wanted():
            lower_autogroup(pid, self.nice)

    def apply(self, tasks_dir: Path = Path("/proc/self/task")) -> None:
        """To every thread of this process (its own niceness, affinity and policy each); OSError if refused."""
        for tid in _threads(tasks_dir):
            if self.cpus is not None:
                os.sched_setaffinity(tid, self.cpus)
            if self.sched == "idle":
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            if os.getpriority(os.PRIO_PROCESS, tid) != self.nice:
                os.setpriority(os.PRIO_PROCESS, tid, self.nice)
        if autogroup_wanted():
            lower_autogroup(os.getpid(), self.nice)


def autogroup_wanted() -> bool:
    """Whether workers raise their session's autogroup nice (the default). FREERIDE_WORKER_AUTOGROUP=0 turns it off:
    the test suite does, where dozens of workers, agents and pipelines share 2 cores and truly low-priority workers
    would starve the lifecycle tests (tests/conftest.py); its own tests turn it back on."""
    return os.environ.get("FREERIDE_WORKER_AUTOGROUP", "1") != "0"


def lower_autogroup(pid: int, nice: int, proc: Path = Path("/proc")) -> bool:
    """The nice of the scheduler autogroup of `pid`'s session, raised to `nice`, when `pid` leads that session.

    With autogroup scheduling on (`kernel.sched_autogroup_enabled`, the default of most desktop and many server
    kernels), the scheduler first shares a CPU fairly between sessions, and only then by nice within each. A worker
    runs in a session of its own: at nice 19, or even at SCHED_IDLE, it still took a fair half of a core from a
    rank of another session (a spinning thread between windows cost a busy trainer +46 % on the 2-core VM, round 3
    of the adversary). The autogroup's own nice is what weighs against other sessions. Only a session leader
    changes it (else the autogroup is the agent's or the user's shell's); an unprivileged process may raise it,
    never lower it. True when written; never raises (no autogroup, an older kernel, a process gone)."""
    try:
        if os.getsid(pid) != pid:
            return False
        path = proc / str(pid) / "autogroup"
        current = path.read_text().split()  # "/autogroup-331 nice 0"
        if len(current) == 3 and int(current[2]) >= nice:
            return False
        path.write_text(str(nice))
        return True
    except (OSError, ValueError):
        return False


BACKGROUND_NICE = 19  # the agent's bursty work off the control path (prune's deletions, database writes)


def lower_this_thread(nice: int = BACKGROUND_NICE) -> None:
    """This thread alone (Linux keeps niceness per thread) to `nice`, as a thread pool's initializer: the agent's
    bursty work that no bubble waits for then yields to training, while its event loop and gRPC's threads (the
    control path) keep their priority. Never raises: a thread left at its priority still does its work."""
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)


def apply_from_env(env: Mapping[str, str]) -> str:
    """Apply the placement the agent put in this process's environment (a worker's, a submit's check); ""
    when done or none was given, else what went wrong (the caller says it in its own words)."""
    try:
        placement = Placement.from_env(env)
        if placement is not None:
            placement.apply()
    except (ValueError, OSError) as exc:
        return str(exc)
    return ""
