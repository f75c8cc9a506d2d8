"""The `freeride` command line against a real agent: in-process (`cli`: `freeride.main.main`, with the caller's
cwd and environment as a subprocess would have them, and its output captured), and as a real subprocess
(`freeride`) where the process is the point: the `agent` command's refusals, the entry point itself.

Bad input never shows a traceback: it exits with code 2 and one line on stderr that says what is
wrong and what to do. Good input reaches the agent, and every command can print a table or JSON.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.agents import FAST, TASKS, drive_until_a_step_ran, spec
from support.cli import InProcess, assert_usage_error, clean_env, run_freeride
from support.paths import REPO

from freeride.tooling.harness import AgentProcess, WindowCollector, wait_for_task, wait_for_trainers
from freeride.trainer.reporter import BubbleReporter
from freeride.v1 import tasks_pb2

READY, PAUSED, CANCELLED = tasks_pb2.TASK_STATE_READY, tasks_pb2.TASK_STATE_PAUSED, tasks_pb2.TASK_STATE_CANCELLED
STARTING = tasks_pb2.TASK_STATE_STARTING
REL_TASKS = str(TASKS.relative_to(REPO))  # tests/tasks/behaviours.py, relative to the cwd REPO


@pytest.fixture
def cli() -> InProcess:
    return InProcess()


def test_the_entry_point_is_the_same_command_in_a_subprocess(shared_agent, cli):
    """The console entry point itself, once: the in-process calls below stand for it."""
    for argv in (["ls", "--json"], ["show", "nope"]):
        real, here = run_freeride(*argv, "--agent", shared_agent.socket), cli(*argv, "--agent", shared_agent.socket)
        assert (real.returncode, real.stdout, real.stderr) == (here.returncode, here.stdout, here.stderr)


# (id, argv after `freeride`, words the one line must contain); every one is rejected before anything is created.
BAD_INPUTS = [
    ("unknown-module", ["submit", "no.such:Task"], ["no module named 'no.such'"]),
    ("not-a-task-relative-path", ["submit", f"{REL_TASKS}:NotATask"], ["is not a task", "IterativeTask"]),
    ("not-a-task-absolute-path", ["submit", f"{TASKS}:NotATask"], ["is not a task", "ImperativeTask"]),
    ("missing-class", ["submit", f"{REL_TASKS}:Missing"], ["has no attribute 'Missing'"]),
    ("missing-file", ["submit", "no_such_file.py:Counter"], ["does not exist"]),
    ("ref-without-class", ["submit", "justaword"], ["must look like"]),
    ("bad-mem-unit", ["submit", "--mem", "12XB", f"{REL_TASKS}:Counter"], ["'12XB'", "GiB", "MB"]),
    ("priority-above-100", ["submit", "--priority", "101", f"{REL_TASKS}:Counter"], ["between 0 and 100", "101"]),
    ("priority-not-a-number", ["submit", "--priority", "high", f"{REL_TASKS}:Counter"], ["--priority", "'high'"]),
    ("arg-without-equals", ["submit", f"{REL_TASKS}:Counter", "k"], ["'k'", "key=value"]),
    ("arg-without-key", ["submit", f"{REL_TASKS}:Counter", "=1"], ["'=1'", "key=value"]),
    ("arg-the-task-does-not-take", ["submit", f"{REL_TASKS}:Counter", "nope=1"], ["no argument 'nope'", "step_ms"]),
    ("arg-of-wrong-type", ["submit", f"{REL_TASKS}:Counter", "step_ms=fast"], ["step_ms", "float"]),
    ("check-args-refuses", ["submit", f"{REL_TASKS}:Picky", "size=-2"], ["error: size must be positive, got -2"]),
    ("check-args-raises", ["submit", f"{REL_TASKS}:Picky", "size=13"],
     ["check_args raised RuntimeError: unlucky size"]),
    ("python-missing", ["submit", "--python", "/no/such/python", f"{REL_TASKS}:Counter"],
     ["interpreter /no/such/python does not exist"]),
    ("python-not-on-path", ["submit", "--python", "no-such-python3", f"{REL_TASKS}:Counter"],
     ["--python no-such-python3: no such command on PATH"]),
    ("python-not-a-python", ["submit", "--python", "/bin/false", f"{REL_TASKS}:Counter"],
     ["bin/false failed at `-m freeride.worker --protocol` (exit code 1", "pip install freeride=="]),
    ("show-unknown-id", ["show", "nope"], ["no task with id 'nope'"]),
    ("cancel-unknown-id", ["cancel", "nope"], ["no task with id 'nope'"]),
    ("pause-unknown-id", ["pause", "nope"], ["no task with id 'nope'"]),
    ("resume-unknown-id", ["resume", "nope"], ["no task with id 'nope'"]),
    ("ls-unknown-state", ["ls", "--state", "sleeping"], ["unknown state 'sleeping'", "PAUSED"]),
    ("unknown-flag", ["ls", "--colour"], ["unrecognized arguments: --colour"]),
    ("unknown-command", ["launch"], ["invalid choice: 'launch'"]),
]


@pytest.fixture(scope="module")
def shared_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    """One agent for the read-only bad-input cases (each only checks the CLI's answer)."""
    proc = AgentProcess(state_dir=tmp_path_factory.mktemp("cli") / "state", extra_args=FAST).start()
    try:
        yield proc
    finally:
        code = proc.stop()
        assert code == 0, f"agent exited with {code}:\n{proc.log_tail()}"


@pytest.mark.parametrize(("argv", "words"), [pytest.param(a, w, id=i) for i, a, w in BAD_INPUTS])
def test_bad_input_exits_2_with_one_line_that_names_the_problem(shared_agent, argv, words, cli):
    line = assert_usage_error(cli(*argv, "--agent", shared_agent.socket))
    for word in words:
        assert word in line


def test_bad_inputs_leave_the_agent_serving_and_create_no_task(agent, client, cli):
    results = [cli(*argv, "--agent", agent.socket) for _, argv, _ in BAD_INPUTS]
    for (name, _, _), res in zip(BAD_INPUTS, results, strict=True):
        assert res.returncode == 2, f"{name}: {res.stderr}"
    assert client.health() == 1  # SERVING
    assert client.list() == []
    assert client.stats().gpu.bubbles == 0


def test_no_agent_running_says_how_to_start_one(tmp_path, cli):
    missing = tmp_path / "nowhere" / "none.sock"
    line = assert_usage_error(cli("ls", "--agent", missing))
    assert str(missing) in line
    assert "freeride agent" in line


def test_resuming_a_task_that_is_not_paused_is_refused_and_leaves_it_running(agent, client, cli):
    task = wait_for_task(client, client.submit(spec("Counter", step_ms=1)).id, [READY])
    line = assert_usage_error(cli("resume", task.id, "--agent", agent.socket))
    assert f"task {task.id} is READY; only a PAUSED task can be resumed" in line
    after = client.get(task.id)
    assert after.state == READY and after.restarts == 0 and after.pid == task.pid


def test_submit_resolves_a_file_ref_against_the_cwd_and_prints_the_id(agent, client, cli):
    res = cli("submit", "behaviours.py:Counter", "step_ms=1", "--agent", agent.socket, cwd=TASKS.parent)
    assert res.returncode == 0, res.stderr
    m = re.fullmatch(r"submitted task (\S+) \((\S+)\): (\w+)\n", res.stdout)
    assert m, res.stdout
    info = client.get(m.group(1))
    assert Path(info.spec.ref.rpartition(":")[0]).is_absolute()
    assert info.spec.ref == f"{TASKS}:Counter"
    assert dict(info.spec.args) == {"step_ms": "1"}
    assert m.group(2) == info.spec.name == "Counter"
    assert [t.id for t in client.list()] == [info.id]


def test_json_outputs_parse_and_describe_the_task(agent, client, cli):
    res = cli("submit", f"{REL_TASKS}:Counter", "step_ms=1", "--name", "json-task", "--priority", "7",
                   "--mem", "1.5GiB", "--json", "--agent", agent.socket)
    assert res.returncode == 0, res.stderr
    [answer] = json.loads(res.stdout)  # a list of one: the same shape as for several agents
    assert answer["agent"] == agent.target and answer["error"] is None
    submitted = answer["task"]
    task_id = submitted["id"]
    assert submitted["state"].startswith("TASK_STATE_")
    assert submitted["spec"]["priority"] == 7 and submitted["spec"]["mem_limit_bytes"] == 3 * 2**29
    wait_for_task(client, task_id, [READY])

    listed = json.loads(cli("ls", "--json", "--agent", agent.socket).stdout)
    assert [(t["id"], t["spec"]["name"], t["state"]) for t in listed] == [(task_id, "json-task", "TASK_STATE_READY")]
    ready_only = json.loads(cli("ls", "--state", "ready", "--json", "--agent", agent.socket).stdout)
    assert [t["id"] for t in ready_only] == [task_id]
    paused_only = json.loads(cli("ls", "--state", "PAUSED", "--json", "--agent", agent.socket).stdout)
    assert paused_only == []

    shown = json.loads(cli("show", task_id, "--json", "--agent", agent.socket).stdout)
    assert shown["id"] == task_id and shown["spec"]["ref"] == f"{TASKS}:Counter" and shown["kind"]

    [stats] = json.loads(cli("stats", "--json", "--agent", agent.socket).stdout)["agents"]
    assert stats["gpu"]["efficiency"] == 0.0  # no bubbles yet: nothing to divide by
    assert [t["id"] for t in stats["tasks"]] == [task_id]
    assert stats["tasks"][0]["counters"]["efficiency"] == 0.0


def test_table_outputs_show_the_task(agent, client, cli):
    task = wait_for_task(client, client.submit(spec("Counter", step_ms=1)).id, [READY])
    for argv in (["ls"], ["show", task.id], ["stats"]):
        res = cli(*argv, "--agent", agent.socket)
        assert res.returncode == 0, f"{argv}: {res.stderr}"
        assert res.stderr == ""
        assert task.id in res.stdout and "Counter" in res.stdout, res.stdout
    shown = cli("show", task.id, "--agent", agent.socket).stdout
    assert f"{TASKS}:Counter" in shown and "step_ms=1" in shown and "READY" in shown


@pytest.fixture
def two_ranks(agent: AgentProcess) -> Iterator[tuple[BubbleReporter, BubbleReporter]]:
    """Rank 0 on the default road (the agent's ring: it is local) and rank 1 kept on gRPC, both connected."""
    ring = BubbleReporter(agent.target, rank=0, stage=0)
    grpc = BubbleReporter(agent.target, rank=1, stage=1, path="grpc")
    try:
        assert ring.wait_connected(10) and grpc.wait_connected(10), agent.log_tail()
        yield ring, grpc
    finally:
        ring.close()
        grpc.close()


def test_stats_shows_each_trainer_and_the_road_its_edges_take(agent, client, two_ranks, cli):
    assert [r.path for r in two_ranks] == ["shm", "grpc"]
    wait_for_trainers(client, 2)
    [stats] = json.loads(cli("stats", "--json", "--agent", agent.socket).stdout)["agents"]
    assert stats["gpu"]["trainers"] == 2
    streams = sorted(stats["gpu"]["trainer_streams"], key=lambda t: t["rank"])
    assert [(t["rank"], t["stage"], t["path"]) for t in streams] == [(0, 0, "shm"), (1, 1, "grpc")]
    for t in streams:
        assert t["peer"].startswith("unix:") and t["pid"] == os.getpid(), t  # the hello's pid names the trainer
        assert all(type(t[n]) is int for n in ("edges", "rejected", "dropped", "pid")), t  # numbers, not strings

    table = cli("stats", "--agent", agent.socket)
    assert table.returncode == 0 and table.stderr == "", table.stderr
    assert "┃ rank " in table.stdout, table.stdout  # the trainers table
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in table.stdout.splitlines()]
    pid = str(os.getpid())
    assert [r for r in rows if r[3:4] in (["shm"], ["grpc"])] == [  # rank, stage, pid, path, edges, ..., peer
        ["0", "0", pid, "shm", "0", "0", "0", "this host"], ["1", "1", pid, "grpc", "0", "0", "0", "this host"]
    ], table.stdout
    assert "unix:" not in table.stdout.split("trainers", 1)[1], table.stdout  # (the agent's own address may say it)
    # The agent's log names each trainer by rank and pid too, not by its unix socket's empty peer address.
    log_text = agent.log_path.read_text()
    assert f"trainer rank 0 (pid {pid}) connected" in log_text and f"trainer rank 1 (pid {pid}) connected" in log_text
    assert "(unix:)" not in log_text, log_text

    top = cli("top", "--once", "--agent", agent.socket)
    assert top.returncode == 0, top.stderr
    assert "2 (1 shm, 1 grpc)" in top.stdout, top.stdout


def test_stats_leaves_the_trainers_table_out_when_no_trainer_is_connected(agent, cli):
    res = cli("stats", "--agent", agent.socket)
    assert res.returncode == 0, res.stderr
    assert "0 trainer stream(s)" in res.stdout and "┃ rank " not in res.stdout, res.stdout  # no trainers table
    [stats] = json.loads(cli("stats", "--json", "--agent", agent.socket).stdout)["agents"]
    assert stats["gpu"]["trainer_streams"] == []


def test_an_agent_started_with_bubble_path_grpc_keeps_a_local_trainer_on_grpc(tmp_path, cli):
    with AgentProcess(state_dir=tmp_path / "state", extra_args=[*FAST, "--bubble-path", "grpc"]) as proc:
        reporter = BubbleReporter(proc.target)  # the default road: the agent decides
        try:
            assert reporter.wait_connected(10), proc.log_tail()
            assert reporter.path == "grpc"
            with proc.client() as client:
                wait_for_trainers(client, 1)
            [stats] = json.loads(cli("stats", "--json", "--agent", proc.socket).stdout)["agents"]
            assert [t["path"] for t in stats["gpu"]["trainer_streams"]] == ["grpc"]
            assert not list(proc.socket.parent.glob("ring-*")), "a ring for an agent that keeps edges on gRPC"
        finally:
            reporter.close()


def test_pause_resume_cancel_walk_a_task_through_its_states(agent, client, cli):
    task = wait_for_task(client, client.submit(spec("Counter", step_ms=1)).id, [READY])
    target = ["--agent", agent.socket]

    res = cli("pause", task.id, *target)
    assert res.returncode == 0 and res.stdout == f"task {task.id} (Counter): PAUSED\n", res
    assert wait_for_task(client, task.id, [PAUSED]).reason == "paused by user"

    res = cli("resume", task.id, *target)
    assert res.returncode == 0 and "task " + task.id in res.stdout, res
    wait_for_task(client, task.id, [STARTING, READY])
    resumed = wait_for_task(client, task.id, [READY])
    assert resumed.pid != task.pid  # a fresh worker, started from the checkpoint

    res = cli("cancel", task.id, *target)
    assert res.returncode == 0 and res.stdout == f"task {task.id} (Counter): CANCELLED\n", res
    assert wait_for_task(client, task.id, [CANCELLED]).reason == "cancelled by user"
    line = assert_usage_error(cli("cancel", task.id, *target))  # a terminal task cannot be cancelled again
    assert "already CANCELLED" in line


@pytest.mark.parametrize(
    ("args", "env", "words"),
    [
        pytest.param(["--margin-ms", "-1"], {}, ["--margin-ms", ">= 0"], id="negative-margin-flag"),
        pytest.param(["--tcp", "localhost"], {}, ["--tcp", "HOST:PORT"], id="tcp-without-port"),
        pytest.param(["--log-format", "xml"], {}, ["--log-format", "'xml'"], id="unknown-log-format"),
        pytest.param([], {"FREERIDE_MARGIN_MS": "abc"}, ["FREERIDE_MARGIN_MS", "'abc'"], id="margin-env-not-a-number"),
        pytest.param([], {"FREERIDE_MAX_RESTARTS": "-2"}, ["FREERIDE_MAX_RESTARTS", ">= 0"],
                     id="negative-max-restarts-env"),
        pytest.param(["--bubble-path", "ring"], {}, ["--bubble-path", "'ring'"], id="unknown-bubble-path"),
        pytest.param([], {"FREERIDE_BUBBLE_PATH": "ring"}, ["FREERIDE_BUBBLE_PATH", "auto or grpc", "'ring'"],
                     id="unknown-bubble-path-env"),
    ],
)
def test_agent_rejects_an_invalid_setting_with_one_line_and_touches_nothing(tmp_path, args, env, words):
    state = tmp_path / "state"
    res = run_freeride("agent", "--state-dir", state, "--socket", tmp_path / "a.sock", *args, env=clean_env(**env))
    line = assert_usage_error(res)
    for word in words:
        assert word in line
    assert not state.exists() and not (tmp_path / "a.sock").exists()


@pytest.mark.parametrize("argv", [["agent", "--state-dir", "state"], ["ls"]], ids=["agent", "ls"])
def test_a_non_numeric_gpu_env_is_a_usage_error(tmp_path, argv):
    res = run_freeride(*argv, cwd=tmp_path, env=clean_env(FREERIDE_GPU="abc"))
    assert "FREERIDE_GPU" in assert_usage_error(res)


@pytest.mark.parametrize("where", ["state-dir", "socket-dir"])
def test_agent_paths_that_are_files_are_a_usage_error(tmp_path, where):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    state, sock = (blocker, tmp_path / "a.sock") if where == "state-dir" else (tmp_path / "state", blocker / "a.sock")
    line = assert_usage_error(run_freeride("agent", "--state-dir", state, "--socket", sock))
    assert str(blocker) in line


def test_a_second_agent_on_the_same_state_dir_is_refused(agent, client, tmp_path):
    other = tmp_path / "other.sock"
    res = run_freeride("agent", "--state-dir", agent.state_dir, "--socket", other)
    line = assert_usage_error(res)
    assert "already using state dir" in line and str(agent.state_dir) in line
    assert not other.exists()
    assert client.health() == 1  # the first agent is untouched


def test_show_hides_a_password_in_the_task_arguments(agent, client, cli):
    """A pool URL carries its Redis password: `show` prints it masked (and the reference check got it on
    stdin, never on a command line other users can read)."""
    url = "redis://:s3cret@redis-host:6379/0/thumbs"
    task = wait_for_task(client, client.submit(spec("CrashOnce", marker=url)).id, [READY])
    shown = cli("show", task.id, "--agent", agent.socket)
    assert shown.returncode == 0, shown.stderr
    assert "s3cret" not in shown.stdout and "marker=redis://:***@redis-host:6379/0/thumbs" in shown.stdout


def test_stats_shows_harvested_gpu_hours_and_their_value_net_of_the_declared_slowdown(agent, client, cli):
    """GPU-hours per task, per GPU and in total; the value at a price; the net only where a slowdown is declared."""
    wait_for_task(client, client.submit(spec("Counter", step_ms=1)).id, [READY])
    with WindowCollector(client) as windows:
        drive_until_a_step_ran(agent, client)  # a trainer rank reports, then ends its stream
        windows.wait_for_all(client)  # every window accounted, the stream closed: the figures stand still
    g = client.stats().gpu
    assert g.harvested_s > 0 and g.training_s > 0

    out = json.loads(cli("stats", "--json", "--agent", agent.socket, "--gpu-hour-price", "3",
                              "--training-slowdown", "1%").stdout)
    worth = out["agents"][0]["gpu"]["worth"]
    lost_h = g.training_s / 3600 * 0.01 / 1.01
    harvested_h = g.harvested_s / 3600
    assert worth == {
        "harvested_gpu_hours": pytest.approx(harvested_h), "training_gpu_hours": pytest.approx(g.training_s / 3600),
        "gpu_hour_price": 3.0, "training_slowdown": 0.01, "slowdown_gpu_hours": pytest.approx(lost_h),
        "value": pytest.approx(harvested_h * 3), "net_value": pytest.approx((harvested_h - lost_h) * 3),
        "slowdown_measured": True,
    }
    assert out["total"]["worth"] == worth  # one agent: the total is its own
    counters = out["agents"][0]["tasks"][0]["counters"]
    assert counters["harvested_gpu_hours"] == pytest.approx(counters["harvested_s"] / 3600)
    assert counters["value"] == pytest.approx(counters["harvested_s"] / 3600 * 3)

    # No slowdown declared (the price from its environment twin): the net value is unknown, and said to be.
    table = cli("stats", "--agent", agent.socket, env=clean_env(FREERIDE_GPU_HOUR_PRICE="3"))
    assert table.returncode == 0 and table.stderr == "", table.stderr
    assert "harvest in GPU-hours" in table.stdout and "not measured" in table.stdout
    assert "slowdown not measured: net value unknown" in table.stdout
    worth = json.loads(cli("stats", "--json", "--agent", agent.socket,
                                env=clean_env(FREERIDE_GPU_HOUR_PRICE="3")).stdout)["total"]["worth"]
    assert worth["value"] == pytest.approx(g.harvested_s / 3600 * 3)
    assert worth["net_value"] is None and worth["slowdown_measured"] is False

    line = assert_usage_error(cli("stats", "--agent", agent.socket, "--training-slowdown", "7"))
    assert "--training-slowdown '7'" in line and "between 0 and 1" in line
    line = assert_usage_error(cli("stats", "--agent", agent.socket, env=clean_env(FREERIDE_GPU_HOUR_PRICE="x")))
    assert "FREERIDE_GPU_HOUR_PRICE 'x'" in line
