"""Retention end to end: `freeride cancel` of several ids and --all, `rm` and its refusals, `prune` (dry run
and not), and an agent with `--retention` pruning at start; a restarted agent never brings a removed task back.

A real agent and the real CLI. The age of a finished task is its record's last change, moved into the past
in the state database while the agent is stopped: nothing waits for time to pass.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest
from support.agents import FAST, spec
from support.cli import run_freeride

from freeride.cli.app import main
from freeride.tooling.harness import AgentProcess, wait_for_task
from freeride.v1 import tasks_pb2

READY, CANCELLED = tasks_pb2.TASK_STATE_READY, tasks_pb2.TASK_STATE_CANCELLED
DAY_S = 86400


def freeride(agent: AgentProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return run_freeride(*args, "--agent", agent.socket)


def refused(res: subprocess.CompletedProcess[str]) -> list[str]:
    """Exit code 2 and no traceback; the lines on stderr."""
    assert res.returncode == 2 and "Traceback" not in res.stderr, res
    return res.stderr.splitlines()


def files(state_dir: Path, task_id: str) -> list[str]:
    return sorted(p.name for p in state_dir.glob(f"*/task-{task_id}.*"))


def ids(agent: AgentProcess) -> list[str]:
    with agent.client() as c:
        return sorted((t.id for t in c.list()), key=int)


def in_process(capsys: pytest.CaptureFixture[str], agent: AgentProcess, *args: str) -> str:
    """A command the CLI refuses before it calls the agent, run in this process (no interpreter to start):
    exit code 2 and its one line on stderr."""
    try:
        code = main([*args, "--agent", str(agent.socket)])
    except SystemExit as exc:  # (argparse's refusal)
        code = int(str(exc.code))
    (line,) = capsys.readouterr().err.splitlines()
    assert code == 2, line
    return line


def test_rm_prune_bulk_cancel_and_an_agents_retention(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    agent = AgentProcess(state_dir=state, extra_args=FAST).start()
    try:
        with agent.client() as c:
            t1, t2, t3, t4 = (wait_for_task(c, c.submit(spec("Counter", step_ms=1)).id, [READY]).id for _ in range(4))
        for name in (*(f"task-{t}.log.1" for t in (t1, t2, t3, t4)), f"task-{t1}0.log"):  # rotated output, a decoy
            (state / "logs" / name).write_text("earlier output\n")

        res = freeride(agent, "cancel", t1, t2, t3)  # several ids: each one's line
        assert res.returncode == 0, res
        assert res.stdout.splitlines() == [f"task {t} (Counter): CANCELLED" for t in (t1, t2, t3)]

        (line,) = refused(freeride(agent, "rm", t4))  # not finished: refused, and kept
        assert line == f"freeride: error: task {t4} is READY; cancel it first (`freeride cancel {t4}`), then remove it"
        assert t4 in ids(agent)

        with agent.client() as c:  # (the worker's checkpoint on cancel)
            wait_for_task(c, t2, [CANCELLED])
        assert files(state, t2) == [f"task-{t2}.ckpt", f"task-{t2}.log.1"]
        res = freeride(agent, "rm", t1, "nope")  # the valid one goes, the unknown one is refused
        assert res.stdout.startswith(f"removed task {t1} (Counter, CANCELLED): 2 files, "), res
        assert refused(res) == ["freeride: error: no task with id 'nope' on GPU 0 (see `freeride ls`)"]
        assert files(state, t1) == [] and ids(agent) == [t2, t3, t4]
        assert len(files(state, t2)) == 2 and (state / "logs" / f"task-{t1}0.log").exists()  # others' files stay

        assert freeride(agent, "prune", "--older-than", "1h").stdout == "no finished tasks older than 1h\n"
        res = freeride(agent, "prune", "--older-than", "0", "--state", "cancelled", "--dry-run", "--json")
        out = json.loads(res.stdout)
        assert out["dry_run"] and [t["id"] for t in out["agents"][0]["tasks"]] == [t2, t3], res
        assert out["total"]["tasks"] == 2 and out["total"]["files_removed"] >= 4
        assert ids(agent) == [t2, t3, t4] and len(files(state, t2)) == 2  # a dry run removes nothing
        line = in_process(capsys, agent, "prune", "--older-than", "7x")
        assert "bad duration '7x'" in line and "like 30m, 12h or 7d" in line
        line = in_process(capsys, agent, "prune", "--older-than", "0", "--state", "READY")
        assert "cancel unfinished tasks first" in line

        line = in_process(capsys, agent, "cancel")
        assert "or pass --all for every unfinished task" in line
        res = freeride(agent, "cancel", "--all")  # every unfinished task: t4
        assert res.returncode == 0 and res.stdout == f"task {t4} (Counter): CANCELLED\n", res
        assert freeride(agent, "cancel", "--all").stdout == "no unfinished tasks to cancel\n"
        with agent.client() as c:
            wait_for_task(c, t4, [CANCELLED])
    finally:
        assert agent.stop() == 0, agent.log_tail()

    with sqlite3.connect(state / "freeride.db") as db:  # t2 finished two days ago
        db.execute("UPDATE tasks SET updated_unix_s = updated_unix_s - ? WHERE id = ?", (2 * DAY_S, int(t2)))
    db.close()
    agent = AgentProcess(state_dir=state, extra_args=[*FAST, "--retention", "1d"]).start()
    try:
        assert ids(agent) == [t3, t4]  # t2 expired, pruned at start; the removed t1 is not back
        assert files(state, t2) == [] and len(files(state, t3)) == 2
        assert f"retention pass: removed 1 finished task(s) older than 1d ({t2})" in agent.log_tail(50)
        res = freeride(agent, "prune", "--older-than", "0")
        assert res.stdout.startswith(f"removed 2 finished tasks older than 0s: {t3}, {t4} (4 files, "), res
        assert files(state, t3) == files(state, t4) == []
    finally:
        assert agent.stop() == 0, agent.log_tail()

    agent = AgentProcess(state_dir=state, extra_args=FAST).start()
    try:
        assert ids(agent) == []  # a restarted agent brings none back
        with agent.client() as c:
            assert int(c.submit(spec("Counter", step_ms=1)).id) == int(t4) + 1  # and gives no id out again
    finally:
        assert agent.stop() == 0, agent.log_tail()
