"""`freeride logs` and the capped task logs, against a real agent: a finished task's output and
traceback, following a running task until it is over, the cap, and an unknown id."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from support.agents import FAST, BackgroundTrainer
from support.cli import InProcess
from support.paths import TASK_FILES

from freeride.client import AgentClient
from freeride.tooling.harness import AgentProcess, wait_for_info, wait_for_task
from freeride.v1 import tasks_pb2

S = tasks_pb2
CHATTY = f"{TASK_FILES / 'escape.py'}:Chatty"

freeride = InProcess()  # `freeride ARGS` in this process: its exit code and output, no interpreter per call


def test_logs_of_a_failed_task_show_its_output_and_traceback(agent: AgentProcess, client: AgentClient) -> None:
    task = client.submit(S.TaskSpec(ref=CHATTY, args={"steps": "3", "lines_per_step": "2", "fail": "1"},
                                    max_restarts=0))
    with BackgroundTrainer(agent, [20.0]):
        wait_for_task(client, task.id, [S.TASK_STATE_FAILED], timeout_s=30)
    info = client.get(task.id)
    assert info.log_path.endswith(f"task-{task.id}.log")
    # Every answer that carries the task names its log, not only Get and List.
    assert {t.id: t.log_path for t in client.stats().tasks}[task.id] == info.log_path

    res = freeride("logs", task.id, "--agent", agent.socket)
    assert res.returncode == 0, res.stderr
    assert "".join(f"line {i}\n" for i in range(6)) + "last line\n" in res.stdout
    assert "Traceback (most recent call last)" in res.stdout and "ValueError: the end" in res.stdout

    tail = freeride("logs", task.id, "--tail", "3", "--agent", agent.socket)
    assert tail.returncode == 0 and len(tail.stdout.splitlines()) == 3, tail.stdout
    assert tail.stdout == "".join(res.stdout.splitlines(keepends=True)[-3:])

    show = freeride("show", task.id, "--agent", agent.socket)
    assert info.log_path in show.stdout, show.stdout


def test_logs_follow_a_running_task_until_it_is_cancelled(agent: AgentProcess, client: AgentClient) -> None:
    task = client.submit(S.TaskSpec(ref=CHATTY, args={"steps": "0"}))  # prints a line a step, forever
    with BackgroundTrainer(agent, [20.0]):
        stream = client.logs(task.id, follow=True)
        guard = threading.Timer(60, stream.cancel)  # a hang ends the stream, and fails the test, instead of blocking it
        guard.start()
        seen = b""
        try:
            for chunk in stream:
                seen += chunk.data
                if b"line 3\n" in seen and client.get(task.id).state != S.TASK_STATE_CANCELLED:
                    client.cancel(task.id)  # the stream goes on until the worker is gone, then ends by itself
        finally:
            fired = guard.finished.is_set()
            guard.cancel()
        assert not fired, "the follow did not end with its task: the guard cancelled it"
    assert wait_for_task(client, task.id, [S.TASK_STATE_CANCELLED]).pid == 0
    assert seen.startswith(b"line 0\nline 1\nline 2\nline 3\n")
    stored = b"".join(c.data for c in client.logs(task.id))
    assert stored == seen  # everything it wrote, once: the stored part, then the followed part


def test_a_task_printing_in_a_loop_stays_under_twice_the_cap(tmp_path: Path) -> None:
    cap = 64 * 1024
    with AgentProcess(state_dir=tmp_path / "state", extra_args=[*FAST, "--log-max-bytes", str(cap)]) as agent, \
            agent.client() as client:
        # 60 steps of 2000 lines: ~1.3 MB, 20x the cap.
        task = client.submit(S.TaskSpec(ref=CHATTY, args={"steps": "60", "lines_per_step": "2000"}))
        with BackgroundTrainer(agent, [20.0]):
            followed = b"".join(c.data for c in client.logs(task.id, follow=True))  # ends once its worker is gone
        assert wait_for_task(client, task.id, [S.TASK_STATE_DONE]).pid == 0
        assert b"line 119999\nlast line\n" in followed
        log = Path(client.get(task.id).log_path)
        old = log.with_name(log.name + ".1")
        assert log.stat().st_size <= cap and old.stat().st_size <= cap
        out = freeride("logs", task.id, "--agent", agent.socket)
        assert out.returncode == 0 and len(out.stdout) == log.stat().st_size + old.stat().st_size <= 2 * cap
        assert "line 119999\nlast line\n" in out.stdout  # the newest output is kept


def test_logs_of_an_unknown_task_is_one_line_and_exit_2(agent: AgentProcess) -> None:
    res = freeride("logs", "999", "--agent", agent.socket)
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1, res.stderr
    assert "no task with id '999'" in res.stderr and "Traceback" not in res.stderr


def test_an_agent_with_a_relative_state_dir_names_logs_absolutely_and_an_empty_log_says_so(tmp_path: Path) -> None:
    # `--state-dir state` is relative to the agent's working directory, which `show`'s reader does not share.
    socket = tmp_path / "a.sock"
    proc = subprocess.Popen([sys.executable, "-m", "freeride", "agent", "--state-dir", "state", "--socket",
                             str(socket), *FAST], cwd=tmp_path, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with AgentClient(f"unix:{socket}") as c:
            c.wait_ready(20)
            task = c.submit(S.TaskSpec(ref=f"{TASK_FILES / 'behaviours.py'}:Counter"))
            wait_for_task(c, task.id, [S.TASK_STATE_READY], timeout_s=30)
            log = c.get(task.id).log_path
            assert log == str(tmp_path / "state" / "logs" / f"task-{task.id}.log")
            show = freeride("show", task.id, "--agent", socket)
            assert log in show.stdout, show.stdout
            res = freeride("logs", task.id, "--agent", socket)
            assert (res.returncode, res.stdout) == (0, ""), res.stderr
            assert res.stderr == f"task {task.id} has written no output yet (its log: {log})\n"
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def test_the_agent_keeps_the_logs_of_all_tasks_under_log_total_bytes_removing_the_oldest(tmp_path: Path) -> None:
    """--log-total-bytes reaches the agent's log writer: three tasks of ~100 KiB of output each (each under its
    own cap of twice --log-max-bytes) pass the total together; the first task's files go, the last's stay."""
    cap, total = 64 * 1024, 128 * 1024
    args = [*FAST, "--log-max-bytes", str(cap), "--log-total-bytes", str(total)]
    with AgentProcess(state_dir=tmp_path / "state", extra_args=args) as agent, agent.client() as client, \
            BackgroundTrainer(agent, [20.0]):
        done = []
        for _ in range(3):  # one after another: the least recently written files are the first task's
            task = client.submit(S.TaskSpec(ref=CHATTY, args={"steps": "60", "lines_per_step": "150"}))
            # DONE, and its worker gone: the agent drains a worker's output into its log as the worker exits
            done.append(wait_for_info(client, task.id, lambda t: t.state == S.TASK_STATE_DONE and t.pid == 0, 60))
        logs = tmp_path / "state" / "logs"
        sizes = {p.name: p.stat().st_size for p in logs.glob("task-*.log*")}
        assert sum(sizes.values()) <= total, sizes
        first, last = (Path(info.log_path).name for info in (done[0], done[-1]))
        assert not any(name.startswith(first) for name in sizes), sizes  # the oldest output went first
        assert last in sizes
        assert (logs / last).read_text().endswith("line 8999\nlast line\n")  # the newest output is kept
