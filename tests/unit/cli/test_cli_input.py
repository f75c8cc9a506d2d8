"""The CLI in-process, against fake agents: bad input is one line and exit 2, JSON has one shape and real numbers.

Nothing here starts an agent; tests/integration/cli/test_cli_output.py proves the same wiring against a real one.
"""

from __future__ import annotations

import argparse
import json
import math
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from freeride.cli import _agents, app, tasks
from freeride.cli.common import message_dict, print_json
from freeride.v1 import tasks_pb2


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`freeride ARGV` in-process: (exit code, stdout, stderr)."""
    try:
        code = app.main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def usage_line(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, out, err = run_cli(capsys, *argv)
    lines = err.splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and "Traceback" not in err, (code, out, err)
    return lines[0]


@pytest.mark.parametrize(("argv", "words"), [
    (["submit", "--priority", "1e9", "t.py:T"], ["--priority", "whole number between 0 and 100", "'1e9'"]),
    (["submit", "--priority", "-1", "t.py:T"], ["--priority", "between 0 and 100", "'-1'"]),
    (["submit", "--max-restarts", "-5", "t.py:T"], ["--max-restarts", "between 0 and 1000", "'-5'",
                                                    "leave it out for the agent's default"]),
    (["submit", "--max-restarts", "two", "t.py:T"], ["--max-restarts", "'two'"]),
    (["submit", "--checkpoint-interval", "nan", "t.py:T"], ["--checkpoint-interval", "seconds", "'nan'"]),
    (["submit", "--checkpoint-interval", "-1", "t.py:T"], ["--checkpoint-interval", ">= 0", "'-1'"]),
    (["submit", "--mem", "0", "t.py:T"], ["--mem 0 is no memory cap", "4GiB", "leave --mem out"]),
    (["submit", "--mem", "0GiB", "t.py:T"], ["--mem 0GiB is no memory cap"]),
    (["submit", "t.py:T", "n=1", "n=2"], ["task argument 'n' is given twice", "n=1, n=2"]),
    (["ls", "--gpu", "-1"], ["--gpu", "whole number >= 0", "'-1'"]),
    (["health", "--timeout-s", "0"], ["--timeout-s", "> 0", "'0'"]),
    (["health", "--wait-s", "inf"], ["--wait-s", "'inf'"]),
    (["top", "--interval", "0"], ["--interval", "> 0"]),
    (["doctor", "--gpu", "x"], ["--gpu", "'x'"]),
    (["agent", "--margin-ms", "nan"], ["--margin-ms", "give a number", "'nan'"]),
    (["agent", "--hang-timeout-s", "5s"], ["--hang-timeout-s", "give a number", "'5s'"]),
    (["agent", "--metrics-port", "9400.5"], ["--metrics-port", "whole number", "'9400.5'"]),
    (["agent", "--max-workers", "0"], ["--max-workers must be >= 1, got 0"]),
    (["agent", "--check-timeout-s", "41"], ["--check-timeout-s must be > 0 and at most 40", "got 41.0"]),
    (["agent", "--check-timeout-s", "0"], ["--check-timeout-s must be > 0", "got 0.0"]),
])
def test_bad_numbers_and_arguments_are_one_line_saying_what_to_give(capsys, argv, words):
    line = usage_line(capsys, *argv)
    assert line.startswith("freeride"), line
    for w in words:
        assert w in line, line


def test_help_says_where_the_state_dir_is_by_default(capsys):
    for argv in (["--help"], ["agent", "--help"]):
        code, out, _ = run_cli(capsys, *argv)
        assert code == 0 and "./freeride-state" in out and "relative" in out, out


def test_an_address_that_is_no_socket_says_what_it_is(capsys, tmp_path: Path):
    (tmp_path / "agent.sock").write_text("data")
    line = usage_line(capsys, "ls", "--agent", str(tmp_path / "agent.sock"))
    assert line == (f"freeride: error: {tmp_path / 'agent.sock'} is not a socket: it is a regular file; pass the "
                    "agent's socket (the --socket it was started with)")
    line = usage_line(capsys, "stats", "--agent", str(tmp_path))
    assert f"{tmp_path} is not a socket: it is a directory" in line
    assert (tmp_path / "agent.sock").read_text() == "data"  # only looked at


@pytest.fixture
def socket_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """FREERIDE_SOCKET_DIR with a bound (stale) socket, a regular file and a directory named like agent sockets."""
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(tmp_path / "agent-gpu1.sock"))
    stale.close()
    (tmp_path / "agent-gpu0.sock").write_text("not an agent")
    (tmp_path / "agent-gpu2.sock").mkdir()
    monkeypatch.setenv("FREERIDE_SOCKET_DIR", str(tmp_path))
    yield tmp_path


def test_all_counts_only_sockets_as_agents(socket_dir: Path):
    agents = _agents.resolve(app.build_parser().parse_args(["ls", "--all"]))
    assert agents.targets == [f"unix:{socket_dir / 'agent-gpu1.sock'}"]


def test_all_with_no_socket_at_all_says_where_it_looked(capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "agent-gpu0.sock").write_text("")
    monkeypatch.setenv("FREERIDE_SOCKET_DIR", str(tmp_path))
    assert f"no agent sockets in {tmp_path}" in usage_line(capsys, "ls", "--all")


# -- JSON -----------------------------------------------------------------------------------------
def test_json_has_64_bit_numbers_as_numbers_and_no_nan():
    info = tasks_pb2.TaskInfo(id="1", state=tasks_pb2.TASK_STATE_READY, checkpoint_steps=7)
    info.spec.mem_limit_bytes = 3 << 40
    info.counters.steps = 2**40
    info.progress["loss"] = math.nan
    info.progress["best"] = math.inf
    d = message_dict(info)
    assert d["spec"]["mem_limit_bytes"] == 3 << 40 and d["counters"]["steps"] == 2**40 and d["checkpoint_steps"] == 7
    assert d["progress"] == {"loss": None, "best": None}
    assert d["state"] == "TASK_STATE_READY"
    assert d["spec"]["max_restarts"] is None  # unset optional: present, null (the agent's default)
    assert message_dict(tasks_pb2.TaskSpec(max_restarts=0))["max_restarts"] == 0
    assert "peak_memory_bytes" in message_dict(tasks_pb2.TaskInfo())["counters"]  # unset message: all its fields


def test_print_json_is_strict_json(capsys):
    print_json({"a": math.nan, "b": [1.5, math.inf], "c": {"d": -math.inf}})
    assert json.loads(capsys.readouterr().out) == {"a": None, "b": [1.5, None], "c": {"d": None}}


class FakeClient:
    """What `ls` and `stats` call on an agent: one task, 4 bubbles."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.task = tasks_pb2.TaskInfo(id="1", state=tasks_pb2.TASK_STATE_READY)
        self.task.spec.name = "t"
        self.task.counters.harvested_s = 0.5
        self.task.counters.steps = 9

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def list(self, states: object = None) -> list[tasks_pb2.TaskInfo]:
        return [self.task]

    def get(self, task_id: str) -> tasks_pb2.TaskInfo:
        return self.task

    cancel = pause = resume = get

    def stats(self) -> tasks_pb2.StatsResponse:
        s = tasks_pb2.StatsResponse(tasks=[self.task])
        s.gpu.bubbles, s.gpu.bubble_s, s.gpu.harvested_s = 4, 2.0, 0.5
        return s


@pytest.fixture
def fake_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_agents, "client", lambda ns, target: FakeClient(target))


@pytest.mark.parametrize("command", ["ls", "stats", "show"])
def test_json_has_one_shape_for_one_agent_and_for_several(capsys, fake_agents, command):
    extra = ["1"] if command == "show" else []
    code, one, err = run_cli(capsys, command, *extra, "--json", "--agent", "unix:/nonexistent/a.sock")
    assert code == 0, err
    code, two, err = run_cli(capsys, command, *extra, "--json", "--agent", "unix:/nonexistent/a.sock",
                             "--agent", "unix:/nonexistent/b.sock")
    if command == "show":  # two agents have task 1: that is an error, one agent's answer is one task
        assert code == 2 and "exists on" in err
        assert json.loads(one)["agent"] == "unix:/nonexistent/a.sock" and json.loads(one)["id"] == "1"
        return
    assert code == 0, err
    one_out, two_out = json.loads(one), json.loads(two)
    if command == "ls":
        assert [t["agent"] for t in one_out] == ["unix:/nonexistent/a.sock"]
        assert [t["agent"] for t in two_out] == ["unix:/nonexistent/a.sock", "unix:/nonexistent/b.sock"]
        assert one_out[0].keys() == two_out[0].keys()
        assert one_out[0]["counters"]["steps"] == 9  # a number, not "9"
    else:
        assert one_out.keys() == two_out.keys() == {"agents", "total"}
        assert one_out["agents"][0].keys() == two_out["agents"][0].keys()
        (a,) = one_out["agents"]
        assert a["agent"] == "unix:/nonexistent/a.sock" and a["gpu"]["bubbles"] == 4
        assert a["gpu"]["efficiency"] == 0.25 and a["tasks"][0]["counters"]["efficiency"] == 0.25
        assert one_out["total"]["agents"] == 1 and two_out["total"]["bubbles"] == 8


def test_tables_are_not_cut_to_80_columns_when_piped(capsys, fake_agents, monkeypatch: pytest.MonkeyPatch):
    reason = "waiting for memory: " + "x" * 150
    monkeypatch.setattr(FakeClient, "list", lambda self, states=None: [tasks_pb2.TaskInfo(id="1", reason=reason)])
    monkeypatch.delenv("COLUMNS", raising=False)
    code, out, err = run_cli(capsys, "ls", "--agent", "unix:/nonexistent/a.sock")
    assert code == 0, err
    assert any(reason in line for line in out.splitlines()), out  # the whole row on one line
    monkeypatch.setenv("COLUMNS", "100")  # an explicit width still wins
    code, out, err = run_cli(capsys, "ls", "--agent", "unix:/nonexistent/a.sock")
    assert code == 0 and max(len(line) for line in out.splitlines()) <= 100, out


def test_health_and_json_listing_load_no_table_library_and_no_benchmark():
    """What makes `health`/`ls`/`stats` slow on a loaded host is what they import: not rich (tables only),
    not the demo, the benchmarks or the profile (psutil, the harness, the what-if: any of freeride.tooling, ~60 ms
    also for every agent started as `freeride agent`). A subprocess: this test process has them loaded."""
    code = (
        "import sys\n"
        "from freeride.main import main\n"
        "main(['health', '--agent', '/nonexistent/a.sock'])\n"
        "main(['ls', '--json', '--agent', '/nonexistent/a.sock'])\n"
        "print(sorted(m for m in sys.modules\n"
        "             if m in ('rich', 'psutil', 'redis') or m.startswith('freeride.tooling')))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "[]", res.stdout + res.stderr


def test_submit_takes_flags_after_the_reference_and_between_its_arguments(capsys, monkeypatch):
    seen: list[argparse.Namespace] = []
    monkeypatch.setattr(tasks, "cmd_submit", lambda ns: seen.append(ns) or 0)  # what the command was given
    argv = ["submit", "t.py:T", "--mem", "4GiB", "n=1", "--name", "x", "lr=0.1", "--no-mps"]
    assert run_cli(capsys, *argv) == (0, "", "")
    assert run_cli(capsys, "submit", "--mem", "4GiB", "t.py:T", "n=1") == (0, "", "")  # as before
    (ns, before) = seen
    assert (ns.ref, ns.args, ns.mem, ns.name, ns.no_mps) == ("t.py:T", ["n=1", "lr=0.1"], "4GiB", "x", True)
    assert (before.ref, before.args, before.mem) == ("t.py:T", ["n=1"], "4GiB")


def test_an_unknown_flag_after_the_reference_is_still_a_usage_line(capsys):
    line = usage_line(capsys, "submit", "t.py:T", "n=1", "--memory", "4GiB")
    assert "unrecognized arguments: --memory 4GiB" in line, line
    assert "unrecognized arguments: x" in usage_line(capsys, "ls", "x")
