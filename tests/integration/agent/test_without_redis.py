"""redis-py is the `pool` extra: without it freeride imports, the agent runs its tasks, and a pool command or
the submit of a pool task says in one line how to install it (exit 2).

"Without it" is a sitecustomize that blocks `import redis` in every process the test starts (the CLI, the
agent, its reference checks and workers inherit PYTHONPATH), as an environment without the package would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.agents import FAST, spec
from support.cli import clean_env
from support.paths import REPO

from freeride.pool.driver import NEEDS_REDIS
from freeride.tooling.harness import AgentProcess, wait_for_task
from freeride.v1 import tasks_pb2

POOL_TASK = f"{REPO / 'tests' / 'tasks' / 'faulty.py'}:SegfaultPool"
LINE = f"freeride: error: {NEEDS_REDIS}"


@pytest.fixture
def no_redis(tmp_path: Path) -> dict[str, str]:
    """An environment in which `import redis` fails, as where the package is not installed."""
    block = tmp_path / "no-redis"
    block.mkdir()
    (block / "sitecustomize.py").write_text("import sys\nsys.modules['redis'] = None  # import redis: ImportError\n")
    env = clean_env(columns=None)
    env["PYTHONPATH"] = os.pathsep.join([str(block), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def test_the_blocker_blocks(no_redis: dict[str, str]) -> None:
    res = run(no_redis, "-c", "import redis")
    assert res.returncode == 1 and "ModuleNotFoundError" in res.stderr


def test_freeride_imports_and_the_agent_command_starts_without_redis(no_redis: dict[str, str]) -> None:
    res = run(no_redis, "-c", "import sys, freeride, freeride.pool, freeride.sdk.pool; "
                              "freeride.PoolTask, freeride.PoolItem, freeride.Client; "
                              "print('redis' in sys.modules and sys.modules['redis'] is not None)")
    assert res.returncode == 0 and res.stdout == "False\n", res.stderr
    res = run(no_redis, "-m", "freeride", "agent", "--help")
    assert res.returncode == 0 and "--state-dir" in res.stdout, res.stderr


@pytest.mark.parametrize("args", [
    ["status", "redis://localhost:1/jobs"],
    ["create", "redis://localhost:1/jobs", "--range", "3"],
    ["retry-failed", "redis://:s3cret@localhost:1/jobs"],
    ["delete", "unix:///tmp/redis.sock/jobs", "--force"],
])
def test_a_pool_command_without_redis_says_how_to_install_it(no_redis: dict[str, str], args: list[str]) -> None:
    res = run(no_redis, "-m", "freeride", "pool", *args)
    assert res.returncode == 2, res.stderr
    assert res.stderr == LINE + "\n" and res.stdout == ""


@pytest.fixture
def agent_without_redis(tmp_path: Path, no_redis: dict[str, str]) -> Iterator[AgentProcess]:
    proc = AgentProcess(state_dir=tmp_path / "state", extra_args=FAST, env=no_redis).start()
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.log_tail()


def test_the_agent_runs_tasks_and_refuses_a_pool_task_in_one_line_without_redis(
    agent_without_redis: AgentProcess, no_redis: dict[str, str]
) -> None:
    agent = agent_without_redis
    with agent.client() as c:
        task = c.submit(spec("Counter"))
        assert wait_for_task(c, task.id, [tasks_pb2.TASK_STATE_READY]).state == tasks_pb2.TASK_STATE_READY
    res = run(no_redis, "-m", "freeride", "submit", POOL_TASK, "pool=redis://localhost:1/jobs",
              f"out_dir={agent.state_dir.parent / 'out'}", "poison=7", "--agent", str(agent.socket))
    assert res.returncode == 2 and res.stdout == "", res.stderr
    [line] = res.stderr.splitlines()
    assert line.startswith("freeride: error: ") and line.endswith(NEEDS_REDIS), line
    with agent.client() as c:
        assert [t.id for t in c.list()] == [task.id]  # nothing was made of the refused submit
