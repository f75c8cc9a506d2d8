"""Who may do what on a host shared by several users: the socket's mode, the state directory's, and what
another user is told when the socket keeps them out. Real `freeride agent` processes, real sockets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAST

from freeride.tooling.harness import AgentProcess


def _freeride(*args: str, user: int | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "freeride", *args], capture_output=True, text=True, timeout=60,
                          user=user, group=user, extra_groups=[] if user is not None else None)


def test_a_world_open_socket_mode_stops_the_agent_with_one_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    done = _freeride("agent", "--state-dir", str(state), "--socket", str(tmp_path / "a.sock"),
                     "--fake-gpu", "--socket-mode", "0666")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--socket-mode 0666 lets every local user" in lines[0], lines
    assert "--allow-world-socket" in lines[0] and not (tmp_path / "a.sock").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the warning is for an agent running as root")
def test_an_agent_running_as_root_warns_once_that_its_group_may_run_code_as_root(tmp_path: Path) -> None:
    with AgentProcess(state_dir=tmp_path / "state", extra_args=[*FAST, "--fake-gpu"]) as agent:
        warnings = [line for line in agent.log_tail(100).splitlines() if "runs as root" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0] and "open to group" in warnings[0], warnings
