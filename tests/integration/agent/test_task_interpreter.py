"""A task run in its own interpreter (`freeride submit --python PATH`) by a real agent: its check and its worker
run there, `show` names it, and once the interpreter is gone the task's start fails saying so.

The second interpreter is this one behind a script that marks its environment (FREERIDE_TEST_INTERPRETER): what
the task writes down proves which way it was started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.agents import FAST
from support.paths import TASK_FILES

from freeride.tooling.harness import AgentProcess, wait_for_task
from freeride.v1 import tasks_pb2

TASK = TASK_FILES / "interpreter.py"


def test_a_task_runs_its_check_and_its_worker_in_its_own_interpreter_and_fails_to_start_once_it_is_gone(
        tmp_path: Path) -> None:
    python = tmp_path / "env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nFREERIDE_TEST_INTERPRETER=1 exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    out = tmp_path / "ran.json"
    agent = AgentProcess(state_dir=tmp_path / "state", extra_args=FAST)
    with agent, agent.client() as c:
        info = c.submit(f"{TASK}:ReportsInterpreter", args={"path": out}, python=str(python), max_restarts=0)
        assert info.spec.python == str(python.parent.resolve() / "python")
        wait_for_task(c, info.id, [tasks_pb2.TASK_STATE_READY], timeout_s=60)
        assert json.loads(out.with_suffix(".check.json").read_text())["marked"] == "1"  # the check: through it
        assert json.loads(out.read_text())["marked"] == "1"  # the worker: through it too

        shown = subprocess.run([sys.executable, "-m", "freeride", "show", info.id, "--agent", str(agent.socket)],
                               capture_output=True, text=True, env={**os.environ, "COLUMNS": "250"}, check=True)
        row = [line.replace("│", " ").split() for line in shown.stdout.splitlines() if info.spec.python in line]
        assert row == [["python", info.spec.python]]

        c.pause(info.id)
        wait_for_task(c, info.id, [tasks_pb2.TASK_STATE_PAUSED])
        python.unlink()  # the environment is removed while the task waits
        c.resume(info.id)
        failed = wait_for_task(c, info.id, [tasks_pb2.TASK_STATE_FAILED], timeout_s=60)
        assert f"could not start its worker: its interpreter {info.spec.python} is gone" in failed.reason
