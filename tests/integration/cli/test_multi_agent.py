"""One CLI over many agents: `--agent` repeated or `--all`, aggregated `stats`/`ls`, `submit` to each, `top`."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.agents import FAST, TASKS, bubbles, drive
from support.cli import InProcess, assert_usage_error, clean_env

from freeride.tooling.harness import AgentProcess, wait_for_task
from freeride.v1 import tasks_pb2

READY = tasks_pb2.TASK_STATE_READY

freeride = InProcess()  # `freeride ARGS` in this process: its exit code and output, no interpreter per call


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[AgentProcess]]]:
    """Agents for GPU 0 and 1 with sockets side by side; task 1 on each, task 2 on GPU 1 only; bubbles on GPU 0."""
    root = tmp_path_factory.mktemp("node")
    procs = [AgentProcess(state_dir=root / f"state{g}", gpu=g) for g in (0, 1)]
    try:
        for p in procs:
            p.start()
        names = {0: ["a0"], 1: ["b1", "b2"]}
        for gpu, p in enumerate(procs):
            with p.client() as c:
                for name in names[gpu]:
                    info = c.submit(tasks_pb2.TaskSpec(ref="freeride.tooling.tasks:SleepTask", args={"step_ms": "1"},
                                                       name=name))
                    wait_for_task(c, info.id, [READY])
        drive(procs[0], bubbles(4, [5.0]))
        yield root, procs
    finally:
        for p in procs:
            p.stop()


def test_stats_over_repeated_agents_has_a_row_per_agent_and_totals(two):
    _root, procs = two
    res = freeride("stats", "--agent", procs[0].socket, "--agent", procs[1].socket, "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert [a["gpu"]["gpu"] for a in out["agents"]] == [0, 1]
    assert [a["agent"] for a in out["agents"]] == [p.target for p in procs]
    per = [p.client().stats() for p in procs]
    total = out["total"]
    assert total["agents"] == 2 and total["tasks"] == 3
    assert total["bubbles"] == sum(s.gpu.bubbles for s in per) == 4
    assert total["bubble_s"] == pytest.approx(sum(s.gpu.bubble_s for s in per))
    assert total["efficiency"] == pytest.approx(total["harvested_s"] / total["bubble_s"])


def test_all_finds_every_socket_in_the_runtime_directory(two):
    root, procs = two
    env = clean_env(FREERIDE_SOCKET_DIR=str(root))
    stats = json.loads(freeride("stats", "--all", "--json", env=env).stdout)
    assert [a["agent"] for a in stats["agents"]] == [p.target for p in procs]
    tasks = json.loads(freeride("ls", "--all", "--json", env=env).stdout)
    assert sorted((t["agent"], t["spec"]["name"]) for t in tasks) == [
        (procs[0].target, "a0"), (procs[1].target, "b1"), (procs[1].target, "b2")]
    table = freeride("stats", "--all", env=env)
    assert table.returncode == 0 and "2 agents" in table.stdout and "all" in table.stdout


def test_a_task_command_goes_to_the_agent_that_owns_the_id_or_fails_in_one_line(two):
    root, _procs = two
    env = clean_env(FREERIDE_SOCKET_DIR=str(root))
    shown = freeride("show", "2", "--all", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["spec"]["name"] == "b2"  # only GPU 1's agent has a task 2
    assert "exists on" in assert_usage_error(freeride("pause", "1", "--all", env=env))  # both have a task 1
    assert "no agent of 2 has task '9'" in assert_usage_error(freeride("cancel", "9", "--all", env=env))
    assert "talks to one agent" in assert_usage_error(freeride("health", "--all", env=env))


def test_all_with_an_empty_runtime_directory_says_where_it_looked(tmp_path):
    line = assert_usage_error(freeride("stats", "--all", env=clean_env(FREERIDE_SOCKET_DIR=str(tmp_path))))
    assert str(tmp_path) in line and "no agent sockets" in line


def test_top_once_prints_tasks_and_gpus_of_every_agent(two):
    root, procs = two
    res = freeride("top", "--once", "--all", env=clean_env(FREERIDE_SOCKET_DIR=str(root)))
    assert res.returncode == 0, res.stderr
    assert "2/2 agents" in res.stdout
    for word in ("a0", "b1", "b2", "READY", "steps=", procs[0].target, procs[1].target):
        assert word in res.stdout, word


def test_top_runs_live_in_a_terminal_and_ctrl_c_exits_cleanly(two):
    _root, procs = two
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "freeride", "top", "--agent", procs[0].socket, "--interval", "0.2"],
        stdin=follower, stdout=follower, stderr=follower, env=clean_env(), start_new_session=True,
    )
    os.close(follower)
    seen = b""

    def read_until(done: object, timeout_s: float) -> None:
        nonlocal seen
        deadline = time.monotonic() + timeout_s
        while not done() and time.monotonic() < deadline:  # type: ignore[operator]
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    seen += os.read(leader, 65536)
                except OSError:  # the terminal closed: top has exited
                    return

    try:
        read_until(lambda: b"a0" in seen, 20)  # the first frame
        assert b"a0" in seen, seen.decode(errors="replace")
        proc.send_signal(signal.SIGINT)
        read_until(lambda: proc.poll() is not None, 10)  # keep reading: a full terminal would block its writes
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            signals = [line for line in status.splitlines() if line.startswith(("SigIgn", "SigCgt"))]
            raise AssertionError(f"top still runs 15 s after Ctrl-C; {signals}; its terminal's last output: "
                                 f"{seen[-600:].decode(errors='replace')!r}") from None
        assert code == 0, seen[-600:].decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)


def _stale_socket(path: Path) -> None:
    """A socket file nobody listens on, as an agent killed with -9 leaves it."""
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()


def test_all_skips_a_stale_socket_with_a_warning(two, tmp_path):
    _root, procs = two
    for p in procs:
        (tmp_path / p.socket.name).symlink_to(p.socket)
    _stale_socket(tmp_path / "agent-gpu9.sock")  # left behind by an agent that died
    res = freeride("stats", "--all", "--json", env=clean_env(FREERIDE_SOCKET_DIR=str(tmp_path)))
    assert res.returncode == 0, res.stderr
    assert len(json.loads(res.stdout)["agents"]) == 2
    assert "agent-gpu9.sock; skipped" in res.stderr


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[AgentProcess]]]:
    """Two agents on fake GPUs 0 and 1, sockets side by side, no tasks: what `submit --all` submits to."""
    root = tmp_path_factory.mktemp("submit")
    procs = [AgentProcess(state_dir=root / f"state{g}", gpu=g, extra_args=[*FAST, "--fake-gpu"]) for g in (0, 1)]
    try:
        for p in procs:
            p.spawn()
        for p in procs:
            p.wait_ready()
        yield root, procs
    finally:
        for p in procs:
            p.stop()


def _names(procs: list[AgentProcess]) -> list[list[str]]:
    out = []
    for p in procs:
        with p.client() as c:
            out.append(sorted(t.spec.name for t in c.list()))
    return out


def test_submit_all_gives_every_agent_the_task(pair):
    root, procs = pair
    res = freeride("submit", "--all", f"{TASKS}:Counter", "step_ms=1", "--name", "everywhere",
                   env=clean_env(FREERIDE_SOCKET_DIR=str(root)))
    assert res.returncode == 0 and res.stderr == "", res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 2
    for p, line in zip(procs, lines, strict=True):
        m = re.fullmatch(rf"agent {re.escape(p.target)}: submitted task (\S+) \(everywhere\): (\w+)", line)
        assert m, line
        with p.client() as c:
            assert c.get(m.group(1)).spec.name == "everywhere"
    res = freeride("submit", "--agent", procs[0].socket, "--agent", procs[1].socket, f"{TASKS}:Counter",
                       "step_ms=1", "--name", "json", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert [(a["agent"], a["task"]["spec"]["name"], a["error"]) for a in out] == [
        (p.target, "json", None) for p in procs]
    assert all(names.count("everywhere") == 1 and names.count("json") == 1 for names in _names(procs))


def test_submit_all_says_which_agent_refused_and_the_others_keep_theirs(pair, tmp_path):
    _root, procs = pair
    before = _names(procs)
    for p in procs:
        (tmp_path / p.socket.name).symlink_to(p.socket)
    _stale_socket(tmp_path / "agent-gpu7.sock")  # left behind by an agent that died
    res = freeride("submit", "--all", f"{TASKS}:Counter", "step_ms=1", "--name", "partly",
                   env=clean_env(FREERIDE_SOCKET_DIR=str(tmp_path)))
    assert res.returncode == 2
    assert [line.split(": submitted")[0] for line in res.stdout.splitlines()] == [
        f"agent unix:{tmp_path / p.socket.name}" for p in procs]
    [error] = res.stderr.splitlines()
    assert error == f"freeride: error: agent unix:{tmp_path / 'agent-gpu7.sock'}: no agent answers there: start it " \
                    "with `freeride agent` or leave it out"
    assert [sorted([*names, "partly"]) for names in before] == _names(procs)

    res = freeride("submit", "--agent", procs[0].socket, "--agent", procs[1].socket, f"{TASKS}:Counter", "nope=1",
                   "--json")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.splitlines()) == 2 and all("no argument 'nope'" in e for e in res.stderr.splitlines())
    assert [(a["agent"], a["task"]) for a in json.loads(res.stdout)] == [(p.target, None) for p in procs]
    assert [sorted([*names, "partly"]) for names in before] == _names(procs)
