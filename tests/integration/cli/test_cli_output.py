"""The CLI's output against a real agent, through real pipes: whole rows, real numbers, quiet when cut off.

The input checks and the JSON shapes are specified in-process in tests/unit/cli/test_cli_input.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.agents import spec
from support.cli import clean_env
from support.paths import REPO

from freeride.errors import InvalidSpecError
from freeride.tooling.harness import AgentProcess
from freeride.v1 import tasks_pb2

LONG_NAME = "a-task-name-long-enough-that-an-80-column-table-would-have-to-fold-or-cut-it-" + "x" * 40


def _closed_pipe_run(*argv: str) -> subprocess.CompletedProcess[str]:
    """`freeride ARGV | head -0`, deterministically: stdout is a pipe whose reader has already gone."""
    env = clean_env()
    env.pop("COLUMNS")
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "freeride", *argv], cwd=REPO, env=env, stdout=write_end,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, timeout=30)
    finally:
        os.close(write_end)


def test_output_through_pipes(agent: AgentProcess, client):
    info = client.submit(tasks_pb2.TaskSpec(ref=spec("Counter").ref, args={"step_ms": "1"}, name=LONG_NAME,
                                            mem_limit_bytes=3 << 30))
    target = ["--agent", str(agent.socket)]

    # Piped without COLUMNS: whole rows, never cut to 80 columns.
    env = clean_env()
    env.pop("COLUMNS")
    res = subprocess.run([sys.executable, "-m", "freeride", "ls", *target], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert any(LONG_NAME in line and line.lstrip("│ ").startswith(info.id) for line in res.stdout.splitlines()), \
        res.stdout

    # JSON: 64-bit integers as numbers.
    res = subprocess.run([sys.executable, "-m", "freeride", "ls", "--json", *target], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    [listed] = json.loads(res.stdout)
    assert listed["spec"]["mem_limit_bytes"] == 3 << 30 and listed["agent"] == agent.target

    # The reader went away (`freeride ls | head -1`): no message, the exit status of a tool ended by SIGPIPE.
    for argv in (["ls"], ["ls", "--json"], ["stats"], ["show", info.id], ["health"], ["--help"]):
        res = _closed_pipe_run(*argv, *(target if argv != ["--help"] else []))
        assert res.stderr == "", f"{argv}: {res.stderr}"
        assert res.returncode in (0, 141), f"{argv}: exit {res.returncode}"  # --help: argparse ignores it

    # A raw API call with a negative max_restarts other than unset (the agent's default) is refused too.
    with pytest.raises(InvalidSpecError) as err:  # (INVALID_ARGUMENT on the wire)
        client.submit(tasks_pb2.TaskSpec(ref=spec("Counter").ref, max_restarts=-5))
    assert "max_restarts must be between -1 (agent default) and 1000, got -5" in str(err.value)
