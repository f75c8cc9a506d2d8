"""Who may do what on a host shared by several users: the socket's mode, the state directory's, and what
another user is told when the socket keeps them out. Real `freeride agent` processes, real sockets."""

from __future__ import annotations

import grp
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support.agents import FAST, bubbles, drive, drive_until_a_step_ran, spec, task_ref

from freeride.tooling.harness import AgentProcess, wait_for_info, wait_for_task
from freeride.v1 import tasks_pb2 as S


def _freeride(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "freeride", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "1000"})  # whole table rows


def test_a_world_open_socket_mode_stops_the_agent_with_one_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    done = _freeride("agent", "--state-dir", str(state), "--socket", str(tmp_path / "a.sock"),
                     "--fake-gpu", "--socket-mode", "0666")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--socket-mode 0666 lets every local user" in lines[0], lines
    assert "--allow-world-socket" in lines[0] and not (tmp_path / "a.sock").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the warning is for an agent running as root")
def test_an_agent_running_as_root_warns_once_that_its_group_may_run_code_as_root(tmp_path: Path) -> None:
    with AgentProcess(state_dir=tmp_path / "state", extra_args=[*FAST, "--fake-gpu"]) as agent:
        warnings = [line for line in agent.log_tail(100).splitlines() if "runs as root" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0] and "open to group" in warnings[0], warnings


def _modes(state: Path) -> dict[str, int]:
    """Each file's permission bits under `state`; one removed while it is walked (a worker's record as its worker
    exits) is left out."""
    modes = {}
    for p in state.rglob("*"):
        try:
            modes[p.relative_to(state).as_posix()] = stat.S_IMODE(p.lstat().st_mode)
        except FileNotFoundError:
            continue
    return modes


def test_the_state_dir_and_every_file_in_it_are_owner_only_and_a_wider_one_is_tightened(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "logs").mkdir(parents=True, mode=0o755)  # as an older freeride left it
    os.chmod(state, 0o755)
    (state / "logs" / "task-9.log").write_text("old output\n")
    os.chmod(state / "logs" / "task-9.log", 0o644)
    old = os.umask(0o022)  # the agent's files would be 0644 and its directories 0755 under this umask
    try:
        with AgentProcess(state_dir=state, extra_args=[*FAST, "--fake-gpu"]) as agent, agent.client() as c:
            task = c.submit(spec("Says"))  # prints a line: its log file is created
            wait_for_task(c, task.id, [S.TASK_STATE_READY])
            drive_until_a_step_ran(agent, c)
            c.pause(task.id)
            assert wait_for_info(c, task.id, lambda i: i.pid == 0).checkpoint_steps > 0
            log = agent.log_tail(200)
            modes = _modes(state)
    finally:
        os.umask(old)
    for name in ("freeride.db", "freeride.db-wal", "freeride.db-shm", "agent.lock", f"logs/task-{task.id}.log",
                 f"checkpoints/task-{task.id}.ckpt", "logs/task-9.log"):
        assert modes.pop(name) == 0o600, name
    assert all(mode & 0o077 == 0 for mode in modes.values()), modes  # the run/ window files, the directories
    assert {modes["logs"], modes["checkpoints"]} == {0o700}
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert (state / "logs" / "task-9.log").read_text() == "old output\n"  # tightened, never removed
    tightened = [line for line in log.splitlines() if "was open to other users" in line]
    assert len(tightened) == 1 and "0644, 0755" in tightened[0], tightened


def test_a_password_in_a_task_argument_is_never_printed_and_only_the_task_gets_it(tmp_path: Path) -> None:
    url = "redis://:hunter2-s3cret@localhost:6379/0/pool"
    with AgentProcess(state_dir=tmp_path / "state", extra_args=[*FAST, "--fake-gpu"]) as agent, agent.client() as c:
        task = c.submit(spec("Says", text=url))
        wait_for_task(c, task.id, [S.TASK_STATE_READY])
        outputs = [task.spec.args["text"], c.get(task.id).spec.args["text"], c.list()[0].spec.args["text"]]
        for command in (["ls"], ["ls", "--json"], ["show", task.id], ["show", task.id, "--json"]):
            done = _freeride(*command, "--agent", agent.target)
            assert done.returncode == 0, done.stderr
            outputs.append(done.stdout)
        log = agent.log_tail(200)
    assert all("hunter2" not in out for out in [*outputs, log]), outputs
    masked = "redis://:***@localhost:6379/0/pool"
    assert outputs[:3] == [masked] * 3 and all(masked in out for out in outputs[4:])  # (the ls table has no args)
    assert url in (agent.state_dir / "logs" / f"task-{task.id}.log").read_text()  # the task itself got it
    # The database keeps the URL masked; the password sits in an owner-only file of its own (docs/pools.md).
    database = b"".join(p.read_bytes() for p in agent.state_dir.glob("freeride.db*"))
    assert b"hunter2" not in database and masked.encode() in database
    secret = agent.state_dir / "secrets" / f"task-{task.id}.json"
    assert b"hunter2" in secret.read_bytes() and stat.S_IMODE(secret.stat().st_mode) == 0o600


# As root (file modes do not stop root): the client runs as nobody, able to read and search any file (to load
# Python from root's home) but not to write one; connecting to the 0660 root:root socket needs write permission.
_AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=+dac_read_search",
              "--ambient-caps=+dac_read_search"]
_REPORTER = """
import logging, sys
from freeride.trainer import BubbleReporter
logging.basicConfig(level=logging.WARNING, format="%(message)s")
reporter = BubbleReporter(sys.argv[1])
assert not reporter.wait_connected(3)  # bounded: it never connects, the test waits for the warning below
reporter.close()
"""


def _kept_out(agent: AgentProcess) -> tuple[list[str], str]:
    """The argv prefix that runs a command as a user this agent's socket keeps out, and the line it must get.
    As root: nobody, not in the socket's group. Otherwise: this user, with the socket's mode bits taken away."""
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("as root, running a client as another user needs setpriv")
        return _AS_NOBODY, (f"permission denied: not in group root of socket {agent.socket} (mode 0660); "
                            "ask the agent's operator to add you to root, then log in again")
    os.chmod(agent.socket, 0)
    group = grp.getgrgid(agent.socket.stat().st_gid).gr_name
    return [], f"permission denied on socket {agent.socket} (mode 0000, group {group})"


@pytest.mark.parametrize("command", [["ls"], ["top", "--once"], ["stats"], ["health"], ["show", "1"]])
def test_a_user_the_socket_keeps_out_is_told_so_not_that_no_agent_answers(command: list[str], tmp_path: Path) -> None:
    with AgentProcess(state_dir=tmp_path / "state", extra_args=[*FAST, "--fake-gpu"]) as agent:
        prefix, expected = _kept_out(agent)
        run = [*prefix, sys.executable, "-m", "freeride", *command]
        alone = subprocess.run([*run, "--agent", agent.target], capture_output=True, text=True, timeout=60)
        found = subprocess.run([*run, "--all"], capture_output=True, text=True, timeout=60,
                               env={**os.environ, "FREERIDE_SOCKET_DIR": str(agent.socket.parent)})
    assert alone.returncode == 2, alone
    assert alone.stderr.strip() == f"freeride: error: {expected}", alone.stderr
    if command[0] != "health":  # (health takes one agent)
        assert found.returncode == 2, found
        assert found.stderr.strip().splitlines()[-1] == f"freeride: error: {expected}", found.stderr


def test_a_trainer_the_socket_keeps_out_is_told_so_and_trains_on(tmp_path: Path) -> None:
    with AgentProcess(state_dir=tmp_path / "state", extra_args=[*FAST, "--fake-gpu"]) as agent:
        prefix, expected = _kept_out(agent)
        done = subprocess.run([*prefix, sys.executable, "-c", _REPORTER, agent.target], capture_output=True,
                              text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == f"{expected}; training goes on without reporting bubbles (retrying in " \
        "the background)", done.stderr


def test_terminal_escapes_and_newlines_in_names_and_exceptions_are_shown_escaped_and_never_forge_a_log_line(
    tmp_path: Path,
) -> None:
    name = "evil\x1b[2J\nFORGED name"
    text = "boom\x1b]0;pwned\x07\nINFO freeride.agent: forged line"
    with AgentProcess(state_dir=tmp_path / "state", extra_args=[*FAST, "--fake-gpu"]) as agent, agent.client() as c:
        submitted = _freeride("submit", task_ref("Says"), f"text={text}", "fail=1", "--name", name,
                              "--max-restarts", "0", "--agent", agent.target)
        assert submitted.returncode == 0, submitted.stderr
        task_id = c.list()[0].id
        wait_for_task(c, task_id, [S.TASK_STATE_READY])
        drive(agent, bubbles(3, [20.0]))
        failed = wait_for_task(c, task_id, [S.TASK_STATE_FAILED])
        assert failed.spec.name == name and text in failed.reason  # the API keeps them as given
        outputs = [submitted.stdout]
        for command in (["ls"], ["show", task_id]):
            done = _freeride(*command, "--agent", agent.target)
            assert done.returncode == 0, done.stderr
            outputs.append(done.stdout)
        log = agent.log_tail(200)
    for out in [*outputs, log]:
        assert "\x1b" not in out and "\x07" not in out, out
        assert not any(line.startswith(("FORGED", "INFO freeride.agent: forged")) for line in out.splitlines()), out
    assert outputs[0].startswith(f"submitted task {task_id} (evil\\x1b[2J\\nFORGED name): ")
    assert outputs[0].count("\n") == 1 and all("evil\\x1b[2J\\nFORGED" in out for out in outputs[1:]), outputs
    assert "boom\\x1b]0;pwned\\x07\\nINFO freeride.agent: forged line" in outputs[2]  # show's reason
    assert "boom\\x1b]0;pwned\\x07\\nINFO freeride.agent: forged line" in log
