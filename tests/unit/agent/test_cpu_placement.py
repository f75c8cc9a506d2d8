"""Side-task workers' CPU placement (--worker-nice, --worker-cpus, --worker-sched): parsing, validation at
start, and applying it to every thread of a process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from freeride.agent.config import AgentConfig, ConfigError, env_defaults
from freeride.core.cpu import Placement, format_cpu_list, parse_cpu_list

ALLOWED = sorted(os.sched_getaffinity(0))


@pytest.mark.parametrize(("text", "cpus"), [("0", {0}), ("0-3,8", {0, 1, 2, 3, 8}), ("1,0, 2", {0, 1, 2}),
                                            ("2-2", {2})])
def test_a_cpu_list_parses_and_prints_back_compactly(text: str, cpus: set[int]) -> None:
    assert parse_cpu_list(text) == cpus
    assert parse_cpu_list(format_cpu_list(cpus)) == cpus
    assert format_cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"


@pytest.mark.parametrize("text", ["", "a", "1-", "-1", "3-1", "0,,1", "1.5"])
def test_a_malformed_cpu_list_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"CPU list|backwards"):
        parse_cpu_list(text)


def test_workers_run_at_the_lowest_priority_on_any_cpu_by_default() -> None:
    placement = AgentConfig().validate().worker_placement()
    assert placement == Placement(nice=19, cpus=None, sched="other")
    assert placement.describe() == "nice 19, any CPU"


@pytest.mark.parametrize(("change", "words"), [
    ({"worker_nice": 20}, "--worker-nice must be 0..19"),
    ({"worker_nice": -1}, "--worker-nice must be 0..19"),
    ({"worker_cpus": "4096"}, "--worker-cpus 4096: CPU 4096 is not among the agent's CPUs"),
    ({"worker_cpus": "0-x"}, "--worker-cpus '0-x' is not a CPU list"),
    ({"worker_sched": "fifo"}, "--worker-sched must be other or idle"),
    ({"agent_cpus": "4096"}, "--agent-cpus 4096: CPU 4096 is not among the agent's CPUs"),
    ({"agent_cpus": "1-0"}, "--agent-cpus '1-0': range 1-0 runs backwards"),
])
def test_a_placement_this_host_cannot_give_is_refused_at_start(change: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        AgentConfig(**change).validate()  # type: ignore[arg-type]


def test_the_placement_flags_have_env_twins() -> None:
    env = {"FREERIDE_WORKER_NICE": "5", "FREERIDE_WORKER_CPUS": str(ALLOWED[0]), "FREERIDE_WORKER_SCHED": "idle"}
    c = AgentConfig(**env_defaults(env)).validate()  # type: ignore[arg-type]
    assert c.worker_placement() == Placement(5, frozenset({ALLOWED[0]}), "idle")
    assert AgentConfig(**env_defaults({"FREERIDE_AGENT_CPUS": str(ALLOWED[0])})).agent_cpu_set() == {ALLOWED[0]}  # type: ignore[arg-type]
    assert AgentConfig().agent_cpu_set() is None  # the agent stays where it was started


def test_the_placement_travels_in_the_environment() -> None:
    p = Placement(7, frozenset(ALLOWED[:1]), "idle")
    assert Placement.from_env(p.to_env()) == p
    assert Placement.from_env({}) is None  # a worker not started by an agent stays as it is


def test_apply_sets_niceness_affinity_and_sched_idle_on_each_thread_it_is_given(tmp_path: Path) -> None:
    """On a thread of this process (a real kernel call each) that then ends: the test process is untouched."""
    done, tid = threading.Event(), []
    ready = threading.Event()

    def park() -> None:
        tid.append(threading.get_native_id())
        ready.set()
        done.wait(10)

    t = threading.Thread(target=park)
    t.start()
    try:
        ready.wait(10)
        (tmp_path / str(tid[0])).mkdir()  # the one thread apply() sees (it reads /proc/self/task by default)
        Placement(nice=max(13, os.getpriority(os.PRIO_PROCESS, 0)), cpus=frozenset(ALLOWED[:1]),
                  sched="idle").apply(tmp_path)
        assert os.sched_getaffinity(tid[0]) == set(ALLOWED[:1])
        assert os.getpriority(os.PRIO_PROCESS, tid[0]) == max(13, os.getpriority(os.PRIO_PROCESS, 0))
        assert os.sched_getscheduler(tid[0]) == os.SCHED_IDLE
        assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the calling thread was not in the list
    finally:
        done.set()
        t.join()


def test_a_bad_placement_is_one_line_and_exit_2_from_the_cli() -> None:
    res = subprocess.run([sys.executable, "-m", "freeride", "agent", "--worker-cpus", "4096"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "--worker-cpus 4096" in lines[0] and "pick from those" in lines[0], res.stderr
