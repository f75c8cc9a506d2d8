"""The agent's front door: what it finds at its socket path, and a submit whose task hangs at import.

Real `freeride agent` and `freeride submit` subprocesses, waits on the health RPC and on process exits.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.agents import wait_gone
from support.cli import clean_env
from support.jitter import fail_unless_loaded_past_cores

from freeride.client import AgentClient
from freeride.tooling.harness import AgentProcess


def _env() -> dict[str, str]:
    return clean_env(columns=None)


def _agent(sock: Path, state: Path, *extra: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "freeride", "agent", "--fake-gpu", "--state-dir", str(state), "--socket", str(sock),
         *extra],
        env=_env(), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )


def _one_line(res: subprocess.CompletedProcess[str]) -> str:
    lines = res.stderr.splitlines()
    assert res.returncode == 2, f"exit code {res.returncode}, stderr:\n{res.stderr}"
    assert "Traceback" not in res.stderr, res.stderr
    assert len(lines) == 1, res.stderr
    return lines[0]


# -- bug 1: what is at the socket path ------------------------------------------------------------
def _regular(p: Path) -> None:
    p.write_text("precious data\n")


def _directory(p: Path) -> None:
    p.mkdir()
    (p / "inside").write_text("precious data\n")


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _link_to_file(p: Path) -> None:
    target = p.with_name("target.txt")
    target.write_text("precious data\n")
    p.symlink_to(target)


def _dangling_link(p: Path) -> None:
    p.symlink_to(p.with_name("nowhere"))


@pytest.mark.parametrize(("make", "words"), [
    (_regular, "a regular file"), (_directory, "a directory"), (_fifo, "a fifo"),
    (_link_to_file, "a symlink to a regular file"), (_dangling_link, "a symlink to nothing"),
])
def test_the_agent_refuses_a_socket_path_that_holds_something_else_and_leaves_it_untouched(
    short_dir: Path, make, words: str
) -> None:
    sock = short_dir / "x.sock"
    make(sock)
    before = {p: (p.lstat().st_mode, p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
              for p in short_dir.rglob("*")}

    res = _agent(sock, short_dir / "state")

    line = _one_line(res)
    assert str(sock) in line and words in line and "--socket" in line, line
    after = {p: (p.lstat().st_mode, p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
             for p in short_dir.rglob("*") if not p.is_relative_to(short_dir / "state")}
    assert after == before


def test_a_stale_socket_is_taken_over(short_dir: Path) -> None:
    sock = short_dir / "x.sock"
    with socket.socket(socket.AF_UNIX) as s:  # bound, never listening, then closed: a dead agent's socket
        s.bind(str(sock))
    agent = subprocess.Popen(
        [sys.executable, "-m", "freeride", "agent", "--fake-gpu", "--state-dir", str(short_dir / "state"),
         "--socket", str(sock)], env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )
    try:
        with AgentClient(f"unix:{sock}") as c:
            c.wait_ready(20)
    finally:
        agent.terminate()
        _, err = agent.communicate(timeout=30)
    assert agent.returncode == 0, err
    assert not sock.exists()


# -- bug 2: a task file that hangs at import ------------------------------------------------------
def _hanging_task(folder: Path) -> tuple[Path, Path]:
    """A task file whose import starts a child process, says both pids through a fifo, then hangs."""
    fifo = folder / "pids.fifo"
    os.mkfifo(fifo)
    task = folder / "hangs.py"
    task.write_text(
        "import os, subprocess, time\n"
        "child = subprocess.Popen(['sleep', '1000'])\n"
        f"with open({str(fifo)!r}, 'w') as f:\n"
        "    f.write(f'{os.getpid()} {child.pid}')\n"
        "time.sleep(1000)\n"
        "import freeride\n"
        "class Hangs(freeride.IterativeTask):\n"
        "    def step(self):\n"
        "        pass\n"
    )
    return task, fifo


def _pids_from(fifo: Path, submit: subprocess.Popen[str]) -> list[int] | None:
    """The pids the task's import writes into `fifo` once the check has imported that far (an event, not a sleep),
    or None if the submit ended first: its check never got that far (its end closes the submit's stdout)."""
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # (no writer yet: not readable until the import opens it)
    try:
        assert submit.stdout is not None
        ready, _, _ = select.select([fd, submit.stdout], [], [])
        if fd not in ready:
            return None
        os.set_blocking(fd, True)
        data = b""
        while chunk := os.read(fd, 4096):  # to the writer's close
            data += chunk
        return [int(p) for p in data.split()]
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line for line in f)
    except FileNotFoundError:
        return False


CHECK_TIMEOUT_S = 3.0
# The submit returns this long at most after its check began importing: the check's limit plus its kill, the
# wait for its pipes (2 s at most) and a loaded 2-core runner's slack. Far below the 60 s a submit may wait in
# the queue for a slot and the 20 s default limit: a flag not honoured fails here, not by the test's timeout.
SUBMIT_BOUND_S = CHECK_TIMEOUT_S + 9.0


@pytest.fixture
def quick_check_agent(short_dir: Path) -> Iterator[AgentProcess]:
    agent = AgentProcess(state_dir=short_dir / "state",
                         extra_args=["--fake-gpu", "--check-timeout-s", f"{CHECK_TIMEOUT_S:g}"], env=_env()).start()
    try:
        yield agent
    finally:
        agent.stop()


def test_a_task_that_hangs_at_import_is_refused_in_bounded_time_and_its_check_is_killed(
    short_dir: Path, quick_check_agent: AgentProcess
) -> None:
    task, fifo = _hanging_task(short_dir)
    began = time.monotonic()  # before the submit: its check, and the check's limit, begin after this
    submit = subprocess.Popen(
        [sys.executable, "-m", "freeride", "submit", "--agent", quick_check_agent.target, f"{task}:Hangs"],
        env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    pids = _pids_from(fifo, submit)  # the check is in the task's import now: its limit runs
    if pids is None:  # its limit ran out before the check reached the task's import (a Python start, freeride's)
        submit.communicate()
        fail_unless_loaded_past_cores(f"the check did not reach the task's import in its {CHECK_TIMEOUT_S:g} s")
    try:
        out, err = submit.communicate(timeout=SUBMIT_BOUND_S)
    except subprocess.TimeoutExpired:
        submit.kill()
        submit.communicate()
        pytest.fail(f"the submit was still waiting {SUBMIT_BOUND_S:g} s after its check began importing, with "
                    f"--check-timeout-s {CHECK_TIMEOUT_S:g}: the check's limit was not honoured")
    waited_s = time.monotonic() - began
    # (from before the submit, so a loaded machine's late read of the fifo cannot make an honoured limit look short)
    assert waited_s >= CHECK_TIMEOUT_S, f"refused after {waited_s:.2f} s: before its {CHECK_TIMEOUT_S:g} s"

    line = _one_line(subprocess.CompletedProcess(submit.args, submit.returncode, out, err))
    assert f"importing '{task}' did not finish in {CHECK_TIMEOUT_S:g} s" in line, line
    assert wait_gone(pids, 10) == [], "the check (or what it started) outlived its time limit"
    with quick_check_agent.client() as c:  # the agent is still up and answers
        assert c.list() == []


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_a_running_check_never_outlives_the_agent(short_dir: Path, how: str) -> None:
    agent = AgentProcess(state_dir=short_dir / "state", extra_args=["--fake-gpu"], env=_env()).start()
    task, fifo = _hanging_task(short_dir)
    submit = subprocess.Popen(
        [sys.executable, "-m", "freeride", "submit", "--agent", agent.target, f"{task}:Hangs"],
        env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        pids = _pids_from(fifo, submit)
        assert pids is not None, f"the submit ended before its check reached the task's import: {submit.communicate()}"
        if how == "sigterm":
            assert agent.stop() == 0, agent.log_tail()
        else:
            agent.kill9()
        assert wait_gone(pids, 10) == [], f"the check outlived the agent ({how})"
    finally:
        agent.stop()
        submit.kill()
        submit.communicate()
