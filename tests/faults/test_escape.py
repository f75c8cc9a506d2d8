"""Bug 4: a task's process that forks, calls setsid(), clears its environment and execs a program that sleeps.

With cgroups (the agent may create cgroup v2 groups: root here, or a systemd unit with Delegate=yes)
it dies when its task ends, when the task is cancelled and when the agent stops, and the worker's
group is removed. Without (--cgroups off) the agent reaches the worker's process group, what carries
the worker's environment mark and what its record of the worker's tree names (written on the memory
watchdog's tick): the escapee dies with its task once it is written down.

Bug 27: after a `kill -9` of the agent, the escapee outlived it, the restarted agent ("1 still hold
processes") and that agent's SIGTERM. A restarted agent now kills what its predecessor's workers left
(their cgroups) before it restarts their tasks; a worker that lost its agent kills what its record names
(round 3, item 3: a new agent no longer trusts records, which a task can write).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support.agents import FAST, BackgroundTrainer
from support.faults import ref, wait_gone

from freeride.agent.procs.cgroups import open_cgroups
from freeride.agent.procs.records import ProcRecords
from freeride.tooling.harness import AgentProcess, wait_for_task
from freeride.v1 import tasks_pb2

S = tasks_pb2


def _cgroup_root(state_dir: Path) -> Path | None:
    state_dir.mkdir(parents=True, exist_ok=True)
    tree, _ = open_cgroups(state_dir)
    if tree is None:
        return None
    tree.close(remove_root=True)
    return tree.root


@contextlib.contextmanager
def _escapee(agent: AgentProcess, tmp_path: Path, steps: int, keep_env: int = 0) -> Iterator[tuple[str, int]]:
    """Submit an Escapee; (task id, escapee pid) once it is READY. Whatever it leaves is killed afterwards."""
    tmp_path.mkdir(exist_ok=True)
    pidfile = tmp_path / "pids"
    with agent.client() as c:
        task = c.submit(S.TaskSpec(ref=ref("escape", "Escapee"), max_restarts=0,
                                   args={"pidfile": str(pidfile), "steps": str(steps), "keep_env": str(keep_env)}))
        wait_for_task(c, task.id, [S.TASK_STATE_READY])
    worker_pid, pid = map(int, pidfile.read_text().split())
    escapee = psutil.Process(pid)
    try:
        # What makes it an escapee: its own session, no worker mark in its environment.
        assert os.getsid(pid) != os.getsid(worker_pid) and os.getpgid(pid) != worker_pid
        environ = escapee.environ()
        if escapee.status() == psutil.STATUS_ZOMBIE:  # (an exited process shows no environment) seen once, at load 9
            with agent.client() as c:
                info = c.get(task.id)
            pytest.fail(f"the escapee exited before it was looked at; its task is {S.TaskState.Name(info.state)} "
                        f"({info.reason!r}); the agent's log:\n{agent.log_tail()}")
        assert (environ == {}) != bool(keep_env)
        yield task.id, pid
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            escapee.kill()


@pytest.fixture
def cgroup_root(tmp_path: Path) -> Path:
    root = _cgroup_root(tmp_path / "state")
    if root is None:
        pytest.skip(f"cgroups not writable here ({open_cgroups(tmp_path / 'state')[1]}): the fallback tests run")
    return root


@pytest.mark.parametrize("end", ["task-done", "cancel", "agent-sigterm"])
def test_an_escaped_process_dies_with_its_task_in_a_cgroup(tmp_path: Path, cgroup_root: Path, end: str) -> None:
    agent = AgentProcess(state_dir=tmp_path / "state", extra_args=FAST).start()
    try:
        with _escapee(agent, tmp_path, steps=1 if end == "task-done" else 0) as (task_id, pid):
            groups = [p.name for p in cgroup_root.iterdir() if p.is_dir()]
            assert len(groups) == 1 and groups[0].startswith(f"task-{task_id}-"), groups
            with agent.client() as c:
                if end == "task-done":
                    with BackgroundTrainer(agent, [20.0]):
                        wait_for_task(c, task_id, [S.TASK_STATE_DONE], timeout_s=30)
                elif end == "cancel":
                    c.cancel(task_id)
            if end == "agent-sigterm":
                assert agent.stop() == 0, agent.log_tail()
            assert wait_gone([pid], 30) == [], f"escaped process {pid} outlived its task ({end})"
            assert agent.stop() == 0, agent.log_tail()
            assert not cgroup_root.exists(), "the agent left its workers' cgroups behind"
    finally:
        agent.stop()


def test_a_new_agent_removes_the_empty_groups_a_killed_one_left(tmp_path: Path, cgroup_root: Path) -> None:
    agent = AgentProcess(state_dir=tmp_path / "state", extra_args=FAST).start()
    try:
        with _escapee(agent, tmp_path, steps=0) as (_, pid):
            agent.kill9()  # its worker checkpoints and exits; its group and the escapee stay
            (group,) = [p for p in cgroup_root.iterdir() if p.is_dir()]
            psutil.Process(pid).kill()
            assert wait_gone([pid], 10) == []
            agent = AgentProcess(state_dir=tmp_path / "state", extra_args=FAST).start()
            assert not group.exists() or (group / "cgroup.procs").read_text().strip(), "an empty group was kept"
    finally:
        assert agent.stop() == 0, agent.log_tail()


def _recorded(state_dir: Path, pid: int, timeout_s: float = 30) -> None:
    """Until the agent has written `pid` down in a worker's record (the watchdog's tick, every 0.25 s: no
    event announces it, so this asks every 50 ms up to a deadline)."""
    records = ProcRecords(state_dir / "run" / "workers")
    deadline = time.monotonic() + timeout_s
    while not any(pid in procs for procs in records.left().values()):
        assert time.monotonic() < deadline, f"{pid} was never written down: {records.left()}"
        time.sleep(0.05)


def test_without_cgroups_a_recorded_escapee_dies_with_its_task_and_a_marked_one_too(tmp_path: Path) -> None:
    """Without cgroups: a process that left the process group AND cleared its environment is found by the
    record of its worker's tree; one that kept its environment by the mark as well."""
    state = tmp_path / "state"
    agent = AgentProcess(state_dir=state, extra_args=FAST, env={**os.environ, "FREERIDE_CGROUPS": "off"}).start()
    try:
        with _escapee(agent, tmp_path / "marked", steps=0, keep_env=1) as (marked_task, marked), \
                _escapee(agent, tmp_path / "unmarked", steps=0) as (unmarked_task, unmarked), agent.client() as c:
            _recorded(state, unmarked)
            c.cancel(marked_task)
            c.cancel(unmarked_task)
            assert wait_gone([marked, unmarked], 30) == [], "an escapee outlived its task"
            assert agent.stop() == 0, agent.log_tail()
            assert ProcRecords(state / "run" / "workers").left() == {}, "records of exited workers were kept"
    finally:
        agent.stop()


@pytest.mark.parametrize("cgroups", ["auto", "off"])
def test_a_worker_that_lost_its_agent_kills_what_its_task_left(tmp_path: Path, cgroups: str) -> None:
    """After a `kill -9` of the agent, the worker checkpoints and, before it exits, kills the escapee (a new agent
    no longer kills by records: a task can write them, round 3 item 3); the restarted agent restarts the task."""
    state = tmp_path / "state"
    if cgroups == "auto" and _cgroup_root(state) is None:
        pytest.skip(f"cgroups not writable here ({open_cgroups(state)[1]})")
    env = {**os.environ, "FREERIDE_CGROUPS": cgroups}
    agent = AgentProcess(state_dir=state, extra_args=FAST, env=env).start()
    try:
        with _escapee(agent, tmp_path, steps=0) as (task_id, pid):
            if cgroups == "off":
                _recorded(state, pid)
            with agent.client() as c:
                worker = c.get(task_id).pid
            agent.kill9()  # its worker checkpoints, kills what its task left, and exits
            assert wait_gone([worker, pid], 30) == [], "the escapee outlived its worker, whose agent was killed"
            agent = AgentProcess(state_dir=state, extra_args=FAST, env=env).start()
            with agent.client() as c:  # and its task came back, a new worker of its own
                info = wait_for_task(c, task_id, [S.TASK_STATE_READY])
            assert info.pid not in (0, worker)
            assert agent.stop() == 0, agent.log_tail()
            assert ProcRecords(state / "run" / "workers").left() == {}
    finally:
        agent.stop()


def test_a_restarted_agent_kills_what_a_killed_worker_left_in_its_cgroup(tmp_path: Path, cgroup_root: Path) -> None:
    """The worker killed too (it cannot clean up): what its task left is still in its cgroup, which the restarted
    agent kills before it restarts the task. (Without cgroups nothing proves such a process was the task's.)"""
    state = tmp_path / "state"
    agent = AgentProcess(state_dir=state, extra_args=FAST).start()
    try:
        with _escapee(agent, tmp_path, steps=0) as (task_id, pid):
            with agent.client() as c:
                worker = c.get(task_id).pid
            os.kill(worker, signal.SIGSTOP)  # it must not see its agent go
            agent.kill9()
            os.kill(worker, signal.SIGKILL)
            assert wait_gone([worker], 30) == [] and psutil.pid_exists(pid)
            agent = AgentProcess(state_dir=state, extra_args=FAST).start()
            # Killed before the agent serves (a pidfd wait: the kill is done, its reaping is init's).
            assert wait_gone([pid], 5) == [], "the escapee outlived the restart"
            assert "killed 1 process(es) the workers of a previous agent left running" in agent.log_path.read_text()
            assert agent.stop() == 0, agent.log_tail()
    finally:
        agent.stop()
