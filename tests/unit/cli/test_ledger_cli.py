"""`freeride ledger show|reset`: the documented way to correct a GPU's harvest ledger (round 3, item 2: a trainer's
forged weight wrote centuries into it, and nothing could take them out). Tasks are never touched."""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from freeride.agent.domain.model import Counters, TaskRecord, TaskSpec, TaskState
from freeride.agent.state.registry import Registry
from freeride.cli.app import main
from freeride.cli.ledger import DATABASE, LOCK

CENTURIES_NS = 199 * 365 * 86_400 * 10**9
POISONED = Counters(steps=40, harvested_ns=30 * 10**9, windows=50, bubbles=1 << 40, bubble_ns=CENTURIES_NS,
                    events=10**9, training_ns=3_600 * 10**9)
TASK_COUNTERS = Counters(steps=40, harvested_ns=30 * 10**9, windows=50, bubbles=50, bubble_ns=60 * 10**9)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A stopped agent's state directory: one task with its own counters, GPU 3's poisoned ledger."""
    reg = Registry(tmp_path / DATABASE)
    task_id = reg.insert(TaskRecord("", TaskSpec(name="counter", ref="pkg.mod:Counter"), TaskState.PAUSED,
                                    created_unix_s=1.0, updated_unix_s=1.0))
    reg.save([replace(reg.load()[0], id=task_id, counters=TASK_COUNTERS)], 3, POISONED)
    reg.close()
    return tmp_path


def stored(state: Path) -> tuple[Counters, list[TaskRecord]]:
    reg = Registry(state / DATABASE)
    try:
        return reg.load_ledger(3), reg.load()
    finally:
        reg.close()


def test_reset_zeroes_the_bubble_figures_and_keeps_the_harvest_and_every_task(
        state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ledger", "reset", "--state-dir", str(state), "--json"]) == 0
    ledger, tasks = stored(state)
    assert ledger == replace(POISONED, bubbles=0, bubble_ns=0, events=0)
    assert [(t.spec.name, t.state, t.counters) for t in tasks] == [("counter", TaskState.PAUSED, TASK_COUNTERS)]
    assert json.loads(capsys.readouterr().out)["ledgers"]["3"]["bubble_ns"] == 0


def test_reset_all_zeroes_every_figure_of_the_gpu_and_still_keeps_the_tasks(state: Path) -> None:
    assert main(["ledger", "reset", "--all", "--gpu", "3", "--state-dir", str(state)]) == 0
    ledger, tasks = stored(state)
    assert ledger == Counters() and [t.counters for t in tasks] == [TASK_COUNTERS]


def test_reset_refuses_while_an_agent_holds_the_state_dir_and_says_what_to_do(
        state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A running agent keeps the ledger in memory and would write it back over the reset."""
    fd = os.open(state / LOCK, os.O_RDWR | os.O_CREAT, 0o600)  # as freeride.agent.server holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, b"4242")
        assert main(["ledger", "reset", "--state-dir", str(state)]) == 2
    finally:
        os.close(fd)
    err = capsys.readouterr().err
    assert "an agent (pid 4242) is running" in err and "stop it first" in err
    assert stored(state)[0] == POISONED


def test_no_database_is_created_where_none_was_and_an_unknown_gpu_is_named(
        tmp_path: Path, state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    for command in ("show", "reset"):
        assert main(["ledger", command, "--state-dir", str(empty)]) == 2
        assert "give the agent's --state-dir" in capsys.readouterr().err
    assert list(empty.iterdir()) == []  # no database made there, nor a lock file
    assert main(["ledger", "reset", "--gpu", "0", "--state-dir", str(state)]) == 2
    assert "holds no ledger of GPU 0 (it has: 3)" in capsys.readouterr().err
    assert stored(state)[0] == POISONED
