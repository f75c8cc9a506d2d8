"""Who may call the agent, and what it accepts.

The unix socket gets the configured mode and group; TCP needs a bearer token on every call and
refuses (UNAUTHENTICATED, logged with the peer) anything else; oversized messages and absurd
values are refused with a clear status while the agent keeps serving.
"""

from __future__ import annotations

import grp
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support.agents import FAST, free_port, spec
from support.cli import clean_env

from freeride.client import AgentClient
from freeride.errors import AgentCallError, InvalidSpecError
from freeride.tooling.harness import AgentProcess
from freeride.trainer.reporter import BubbleReporter
from freeride.v1 import tasks_pb2, trainer_pb2, trainer_pb2_grpc

TOKEN = "s3cret-token-for-tests"
GROUP = grp.getgrgid(os.getgid()).gr_name  # the current user's primary group: always assignable


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AgentProcess, str]]:
    """One agent for the module: socket 0600 with the user's group, TCP with a token."""
    root = tmp_path_factory.mktemp("secured")
    token_file = root / "token"
    token_file.write_text(TOKEN + "\n")
    tcp = f"127.0.0.1:{free_port()}"
    proc = AgentProcess(state_dir=root / "state", extra_args=[
        *FAST, "--tcp", tcp, "--token-file", str(token_file), "--socket-mode", "0600", "--socket-group", GROUP,
    ]).start()
    try:
        with AgentClient(tcp, token=TOKEN) as c:
            c.wait_ready(10)
        yield proc, tcp
    finally:
        assert proc.stop() == 0, proc.log_tail()


def _code(call: object) -> grpc.StatusCode:
    """The status code of the refusal `call` raises: an AgentCallError (no domain error), the code its own."""
    with pytest.raises(AgentCallError) as err:
        call()  # type: ignore[operator]
    return err.value.code


def _raw_code(call: object) -> grpc.StatusCode:
    """The status code of a raw gRPC call's refusal (a stub of the API, no freeride.Client)."""
    with pytest.raises(grpc.RpcError) as err:
        call()  # type: ignore[operator]
    return err.value.code()  # type: ignore[no-any-return]


def test_the_socket_gets_the_configured_mode_and_group(secured):
    agent, _ = secured
    st = agent.socket.stat()
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_gid == grp.getgrnam(GROUP).gr_gid


def test_tcp_calls_need_the_token_and_refusals_are_logged_with_the_peer(secured):
    agent, tcp = secured
    with AgentClient(tcp) as anonymous:
        assert _code(anonymous.stats) == grpc.StatusCode.UNAUTHENTICATED
        assert _code(lambda: anonymous.submit(spec("Counter"))) == grpc.StatusCode.UNAUTHENTICATED
        assert anonymous.health() == 1  # health stays open for probes; it says nothing but SERVING
    with AgentClient(tcp, token="not-the-token") as wrong:
        assert _code(wrong.stats) == grpc.StatusCode.UNAUTHENTICATED
        assert _code(lambda: next(iter(wrong.watch()))) == grpc.StatusCode.UNAUTHENTICATED
    with grpc.insecure_channel(tcp) as channel:  # a trainer stream without the token is refused too
        stub = trainer_pb2_grpc.BubbleServiceStub(channel)
        assert _raw_code(lambda: list(stub.ReportBubbles(iter([trainer_pb2.BubbleBatch()]), timeout=10))) == (
            grpc.StatusCode.UNAUTHENTICATED
        )
    with AgentClient(tcp, token=TOKEN) as good:
        assert good.stats().gpu.gpu == 0
    with agent.client() as local:  # the unix socket needs no token: its permissions are the control
        assert local.stats().gpu.gpu == 0
    refusals = [line for line in agent.log_tail(200).splitlines()
                if "refused" in line and "doctor:" not in line]  # (a full-ish disk's warning says "refused" too)
    assert len(refusals) == 5 and all("ipv4:127.0.0.1:" in line for line in refusals), refusals
    assert any("no token" in line for line in refusals) and any("wrong token" in line for line in refusals)


def test_a_trainer_with_the_token_reports_over_tcp(secured):
    _agent, tcp = secured
    reporter = BubbleReporter(tcp, token=TOKEN)
    try:
        assert reporter.wait_connected(10)
    finally:
        reporter.close()


def test_an_oversized_message_is_refused_and_the_agent_keeps_serving(secured):
    agent, _ = secured
    huge = tasks_pb2.TaskSpec(ref=spec("Counter").ref, args={"blob": "x" * (5 * 2**20)})
    with agent.client() as c:
        assert _code(lambda: c.submit(huge)) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert c.health() == 1 and c.list() == []


@pytest.mark.parametrize(("change", "words"), [
    ({"mem_limit_bytes": 2**49}, "more than the device has"),
    ({"args": {"data": "x" * 70_000}}, "at most 65536"),
    ({"args": {f"a{i}": "1" for i in range(300)}}, "at most 256"),
    ({"priority": -1}, "priority must be between 0 and 100"),
    ({"checkpoint_interval_s": -5.0}, "checkpoint interval"),
    ({"ref": "x" * 5000 + ":T"}, "longer than 4096"),
])
def test_absurd_task_values_are_refused_with_a_clear_message(secured, change, words):
    agent, _ = secured
    s = spec("Counter")
    for key, val in change.items():
        if key == "args":
            s.args.update(val)
        else:
            setattr(s, key, val)
    with agent.client() as c, pytest.raises(InvalidSpecError) as err:  # (INVALID_ARGUMENT on the wire)
        c.submit(s)
    assert words in str(err.value)


def test_absurd_bubble_edges_are_counted_logged_once_and_the_stream_goes_on(secured):
    agent, _ = secured
    start, end = trainer_pb2.BUBBLE_EDGE_START, trainer_pb2.BUBBLE_EDGE_END
    with agent.client() as c:
        before = c.stats().gpu
        now = time.monotonic_ns()
        bad = [
            trainer_pb2.BubbleEvent(edge=start, slot=5, time_ns=now + 5 * 10**9),  # from the future
            trainer_pb2.BubbleEvent(edge=start, slot=5, time_ns=now - 120 * 10**9),  # two minutes old
            trainer_pb2.BubbleEvent(edge=start, slot=5, time_ns=now, expected_duration_ns=-1),
            trainer_pb2.BubbleEvent(edge=start, slot=5, time_ns=now, free_memory_bytes=-(2**40)),
            trainer_pb2.BubbleEvent(edge=start, slot=5, time_ns=now, kind=99),  # a kind nobody defined
        ]
        good = [trainer_pb2.BubbleEvent(edge=start, slot=6, time_ns=now),
                trainer_pb2.BubbleEvent(edge=end, slot=6, time_ns=now + 1_000_000)]
        with grpc.insecure_channel(agent.target) as channel:
            stub = trainer_pb2_grpc.BubbleServiceStub(channel)
            list(stub.ReportBubbles(iter([trainer_pb2.BubbleBatch(events=bad + good)]), timeout=10))
        after = c.stats().gpu
    assert after.rejected_events - before.rejected_events == len(bad)
    assert after.bubbles - before.bubbles == 1  # the good bubble behind them on the same stream counts
    warnings = [line for line in agent.log_tail(200).splitlines() if "bubble edge rejected" in line]
    assert len(warnings) == 1 and "in the future" in warnings[0]


def _start_fails(tmp_path: Path, *args: str) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "freeride", "agent", "--state-dir", str(tmp_path / "s"),
         "--socket", str(tmp_path / "a.sock"), *args],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        env=clean_env(),
    )
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2, res.stderr
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


def test_tcp_without_a_token_file_does_not_start(tmp_path):
    assert "--tcp needs --token-file" in _start_fails(tmp_path, "--tcp", "127.0.0.1:1")


def test_an_empty_token_file_does_not_start(tmp_path):
    (tmp_path / "empty").write_text("\n")
    line = _start_fails(tmp_path, "--tcp", "127.0.0.1:1", "--token-file", str(tmp_path / "empty"))
    assert "is empty" in line


def test_an_unknown_socket_group_does_not_start(tmp_path):
    assert "is not a group on this host" in _start_fails(tmp_path, "--socket-group", "no-such-group-freeride")
