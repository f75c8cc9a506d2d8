"""`freeride timeline` draws a running agent's recent bubbles and side-task steps; tasks' progress shows in the CLI.

A real agent, a synthetic trainer reporting real bubble edges, a real worker running Counter
(whose progress() is its step count), and the CLI as a subprocess.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from support.agents import FAST, BackgroundTrainer, spec
from support.cli import InProcess, assert_usage_error

from freeride.client import AgentClient
from freeride.tooling.harness import AgentProcess, WindowCollector, wait_for_task
from freeride.v1 import tasks_pb2

READY = tasks_pb2.TASK_STATE_READY
BUBBLES_MS = [20.0, 10.0]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

freeride = InProcess()  # `freeride ARGS` in this process: its exit code and output, no interpreter per call


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AgentProcess, AgentClient, str]]:
    """An agent whose trainer keeps reporting bubbles through the module, and a Counter that has run
    steps in at least eight of them: (agent, client, task id)."""
    agent = AgentProcess(state_dir=tmp_path_factory.mktemp("timeline") / "state", extra_args=FAST).start()
    try:
        with agent.client() as client:
            task = wait_for_task(client, client.submit(spec("Counter", step_ms=1)).id, [READY])
            with WindowCollector(client) as windows, BackgroundTrainer(agent, BUBBLES_MS):
                assert windows.wait_for(8, timeout_s=60), f"only {len(windows.windows)} windows: {agent.log_tail()}"
                yield agent, client, task.id
    finally:
        assert agent.stop() == 0, agent.log_tail()


def test_the_agent_keeps_recent_bubbles_and_every_side_task_step(running):
    _, client, task_id = running
    resp = client.timeline()
    assert resp.gpu == 0 and resp.now_ns > 0
    assert {b.slot for b in resp.bubbles} == {0, 1}
    for b in resp.bubbles:
        assert b.end_ns > b.start_ns
    assert [t.id for t in resp.tasks] == [task_id]
    with_steps = [w for w in resp.windows if w.shares and w.shares[0].steps]
    assert with_steps, "no window ran a step"
    for w in with_steps:
        (share,) = w.shares
        assert share.task_id == task_id
        assert len(share.step_spans) == share.steps
        assert sum(s.duration_ns for s in share.step_spans) == share.busy_ns
        assert share.step_spans[0].start_ns >= w.bubble_start_ns  # granted at START, never before
        assert all(s.start_ns < w.until_ns for s in share.step_spans)  # a step begins only inside its window
    latest = max(w.bubble_end_ns for w in resp.windows)
    newer = client.timeline(since_ns=latest)
    assert all(w.bubble_end_ns > latest for w in newer.windows)


def test_timeline_writes_a_png_of_the_recent_activity(running, tmp_path):
    agent = running[0]
    out = tmp_path / "pics" / "agent.png"
    res = freeride("timeline", "--out", out, "--span-ms", 200, "--agent", agent.socket, "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["out"] == str(out) and summary["bubbles"] > 0 and summary["steps"] > 0
    assert summary["end_ns"] - summary["start_ns"] == 200_000_000
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


@pytest.mark.parametrize(("argv", "words"), [
    (["--out", "t.jpg"], ["must name a .png file"]),
    (["--out", "t.png", "--span-ms", "0"], ["--span-ms must be positive"]),
    ([], ["--out"]),
])
def test_timeline_bad_input_is_one_line(running, argv, words):
    line = assert_usage_error(freeride("timeline", *argv, "--agent", running[0].socket))
    for word in words:
        assert word in line


def test_timeline_of_an_agent_without_bubbles_says_what_is_missing(agent, tmp_path):
    line = assert_usage_error(freeride("timeline", "--out", tmp_path / "t.png", "--agent", agent.socket))
    assert "no bubbles yet" in line and "trainer" in line
    assert not (tmp_path / "t.png").exists()


def test_ls_show_and_stats_show_each_tasks_latest_progress(running):
    agent, client, task_id = running
    counted = client.get(task_id).progress["count"]
    assert counted > 0
    for argv in (["ls"], ["show", task_id], ["stats"]):
        res = freeride(*argv, "--agent", agent.socket)
        assert res.returncode == 0, res.stderr
        assert "count" in res.stdout, f"{argv}: {res.stdout}"
    assert "count=" in freeride("ls", "--agent", agent.socket).stdout
    listed = json.loads(freeride("ls", "--json", "--agent", agent.socket).stdout)
    shown = json.loads(freeride("show", task_id, "--json", "--agent", agent.socket).stdout)
    [stats] = json.loads(freeride("stats", "--json", "--agent", agent.socket).stdout)["agents"]
    for info in (listed[0], shown, stats["tasks"][0]):
        assert info["progress"]["count"] >= counted  # the latest: it only grows while the trainer runs
