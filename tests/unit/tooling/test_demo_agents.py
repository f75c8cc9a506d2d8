"""How `freeride demo` starts its agents: a loaded machine must not fail the demo's own submissions."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from freeride.agent.config import MAX_CHECK_TIMEOUT_S
from freeride.cli import app
from freeride.tooling.demo import run


class _Agent:
    """Takes what the demo gives an agent; starts nothing."""

    started: list[_Agent] = []

    def __init__(self, **kwargs: Any) -> None:
        self.extra_args: list[str] = list(kwargs["extra_args"])
        _Agent.started.append(self)

    def spawn(self) -> _Agent:
        return self

    def wait_ready(self) -> _Agent:
        return self

    def stop(self) -> None:
        pass


def test_the_demos_agents_give_each_submit_check_the_longest_time_an_agent_allows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every side task is submitted at once, each check imports torch: on a loaded 2-core machine the default 20 s
    # was not enough for sidetasks.pagerank.
    monkeypatch.setattr(run, "AgentProcess", _Agent)
    _Agent.started.clear()
    plan: Any = types.SimpleNamespace(pipeline=types.SimpleNamespace(stages=2), worker_nice=10,
                                      worker_sched="idle", cpus=None)
    with run._agents(tmp_path, plan, Console(quiet=True)) as agents:
        assert len(agents) == 2
    for agent in _Agent.started:
        args = agent.extra_args
        assert args[args.index("--check-timeout-s") + 1] == f"{MAX_CHECK_TIMEOUT_S:g}"
        ns = app.build_parser().parse_args(["agent", *args])  # flags the agent takes
        assert ns.check_timeout_s == MAX_CHECK_TIMEOUT_S
