"""Shared fixtures: a real agent process per test (or one per rank), its client, a Redis server, a short directory
for unix sockets. What they are built from lives in tests/support/."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.agents import FAST, Agents
from support.jitter import skip_if_loaded_past_cores
from support.redis_server import RedisServer, need_redis

from freeride.agent.config import MAX_CHECK_TIMEOUT_S
from freeride.client import AgentClient
from freeride.errors import TaskRefError
from freeride.tooling.harness import AgentProcess

# Workers keep their session's autogroup at nice 0 here (freeride.core.cpu.autogroup_wanted): the suite runs dozens
# of workers, agents and pipelines on 2 cores, and workers at true low priority (the product's default, fix 59) would
# starve the lifecycle tests. tests/unit/core/test_autogroup.py turns it back on.
os.environ.setdefault("FREERIDE_WORKER_AUTOGROUP", "0")
# Every agent the tests start checks a submitted task's import for up to the longest time allowed (40 s, not the
# default 20): with the machine's load at twice its cores (the pool tests alone start eight agents and their
# workers), importing torch for a shipped task took over 20 s, and a submit refused for the machine's speed says
# nothing of the product. test_front_door gives its agent a short limit of its own, to test the limit itself.
os.environ.setdefault("FREERIDE_CHECK_TIMEOUT_S", f"{MAX_CHECK_TIMEOUT_S:g}")


# The markers that give a test its own run in ./dev.sh test (after the rest, which run in parallel): `serial`, alone;
# `background`, beside the serial run in an idle CPU cgroup (pyproject.toml says what each asks of a test).
PHASES = ("serial", "background")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Before `-m` deselects anything: a test in both phases is refused (it would run twice); where ./dev.sh test
    asks (SUITE_MARKED_FILES, a folder), the files that hold a serial test, one per line in its file `serial`, so that
    the serial run collects those files alone (1 s, not 8: the whole tree imports torch, DeepSpeed and every test
    module) and still every serial test."""
    both = [item.nodeid for item in items if all(item.get_closest_marker(phase) for phase in PHASES)]
    if both:
        raise pytest.UsageError(f"marked both {' and '.join(PHASES)} (each test runs in one): {', '.join(both)}")
    where = os.environ.get("SUITE_MARKED_FILES")
    # only a run of the whole tree (testpaths): a pytest that a test runs on its own file (test_hf_models) inherits
    # the variable, and its list would leave out every other serial test
    if not where or config.args_source != pytest.Config.ArgsSource.TESTPATHS:
        return
    files = sorted({str(item.path.relative_to(config.rootpath)) for item in items if item.get_closest_marker("serial")})
    tmp = Path(where) / f"serial.{os.getpid()}"  # each xdist worker writes the same list: whole, one rename each
    tmp.write_text("".join(f"{f}\n" for f in files))
    os.replace(tmp, Path(where) / "serial")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> object:
    """A submit refused because its import check ran out of time on a machine loaded past its cores is the machine's
    speed, not a verdict on the product: the test skips, saying so with the load. So is a task that never got
    there because, the agent says, its steps took longer than any bubble (a 1 ms step measured at 537 ms, p95, at
    twice the cores' load). On a machine that is not that busy either fails the test as any error does (a task
    whose import hangs is refused exactly so)."""
    try:
        return (yield)
    except TaskRefError as exc:
        if "did not finish in" in str(exc):
            skip_if_loaded_past_cores(f"a submit's import check ran out of time ({str(exc)[:100]}...)")
        raise
    except TimeoutError as exc:  # freeride.tooling.harness.wait_for_task's, with the agent's reason
        if "do not fit any bubble" in str(exc):
            skip_if_loaded_past_cores(str(exc)[:200])
        raise


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server on a unix socket (skips, saying why, where redis-server is not installed)."""
    need_redis()
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    proc = AgentProcess(state_dir=tmp_path / "state", extra_args=FAST).start()
    try:
        yield proc
    finally:
        code = proc.stop()
        assert code == 0, f"agent exited with {code}:\n{proc.log_tail()}"


@pytest.fixture
def client(agent: AgentProcess) -> Iterator[AgentClient]:
    with agent.client() as c:
        yield c


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    a = Agents(tmp_path).start()
    try:
        yield a
    finally:
        a.stop()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory for unix sockets: their paths must fit in 108 bytes, which a pytest tmp_path (longer under
    xdist: popen-gwN/) need not leave room for."""
    with tempfile.TemporaryDirectory(prefix="fr-", dir="/tmp") as d:
        yield Path(d)
