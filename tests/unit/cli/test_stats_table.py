"""`freeride stats` as a person reads it: the tasks table's figures, not only the --json ones (tests/integration/
test_cli.py checks those against a real agent)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

import pytest

from freeride.cli import stats as stats_cli
from freeride.cli._agents import AgentSet
from freeride.v1 import tasks_pb2


class _Client:
    def __init__(self, answer: tasks_pb2.StatsResponse) -> None:
        self._answer = answer

    def stats(self) -> tasks_pb2.StatsResponse:
        return self._answer


def test_the_tasks_table_shows_each_task_s_harvest_in_gpu_hours(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A task that harvested 5400 s has 1.5 GPU-hours (not 90: seconds / 60 are minutes)."""
    answer = tasks_pb2.StatsResponse(gpu=tasks_pb2.GpuStats(gpu=0, bubble_s=36_000.0, harvested_s=9_000.0))
    task = answer.tasks.add(id="7", state=tasks_pb2.TASK_STATE_READY)
    task.spec.name = "counter"
    task.counters.harvested_s = 5_400.0
    ns = argparse.Namespace(json=False, target="unix:/nowhere", gpu_hour_price=None, training_slowdown=None)

    @contextlib.contextmanager
    def one(_: argparse.Namespace) -> Iterator[_Client]:
        yield _Client(answer)

    monkeypatch.setattr(stats_cli._agents, "resolve", lambda _: AgentSet(["unix:/nowhere"], multi=False))
    monkeypatch.setattr(stats_cli, "one_client", one)
    monkeypatch.setenv("COLUMNS", "300")  # every column whole
    assert stats_cli.cmd_stats(ns) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "GPU-h" in line and "share of bubbles" in line)
    row = next(line for line in out.splitlines() if "counter" in line)
    columns = [c.strip() for c in header.split("┃")]
    cells = [c.strip() for c in row.split("│")]
    assert cells[columns.index("GPU-h")] == "1.5"
    assert cells[columns.index("share of bubbles")] == "15.0%"
