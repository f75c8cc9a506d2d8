"""The agent's front door: what it finds at its socket path, and a submit whose task hangs at import.

Real `freeride agent` and `freeride submit` subprocesses, waits on the health RPC and on process exits.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from freeride.client import AgentClient


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FREERIDE_")}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="frdoor-", dir="/tmp") as d:  # unix socket paths must stay short
        yield Path(d)


def _agent(sock: Path, state: Path, *extra: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "freeride", "agent", "--fake-gpu", "--state-dir", str(state), "--socket", str(sock),
         *extra],
        env=_env(), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )


def _one_line(res: subprocess.CompletedProcess[str]) -> str:
    lines = res.stderr.splitlines()
    assert res.returncode == 2, f"exit code {res.returncode}, stderr:\n{res.stderr}"
    assert "Traceback" not in res.stderr, res.stderr
    assert len(lines) == 1, res.stderr
    return lines[0]


# -- bug 1: what is at the socket path ------------------------------------------------------------
def _regular(p: Path) -> None:
    p.write_text("precious data\n")


def _directory(p: Path) -> None:
    p.mkdir()
    (p / "inside").write_text("precious data\n")


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _link_to_file(p: Path) -> None:
    target = p.with_name("target.txt")
    target.write_text("precious data\n")
    p.symlink_to(target)


def _dangling_link(p: Path) -> None:
    p.symlink_to(p.with_name("nowhere"))


@pytest.mark.parametrize(("make", "words"), [
    (_regular, "a regular file"), (_directory, "a directory"), (_fifo, "a fifo"),
    (_link_to_file, "a symlink to a regular file"), (_dangling_link, "a symlink to nothing"),
])
def test_the_agent_refuses_a_socket_path_that_holds_something_else_and_leaves_it_untouched(
    short_dir: Path, make, words: str
) -> None:
    sock = short_dir / "x.sock"
    make(sock)
    before = {p: (p.lstat().st_mode, p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
              for p in short_dir.rglob("*")}

    res = _agent(sock, short_dir / "state")

    line = _one_line(res)
    assert str(sock) in line and words in line and "--socket" in line, line
    after = {p: (p.lstat().st_mode, p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
             for p in short_dir.rglob("*") if not p.is_relative_to(short_dir / "state")}
    assert after == before


def test_a_stale_socket_is_taken_over(short_dir: Path) -> None:
    sock = short_dir / "x.sock"
    with socket.socket(socket.AF_UNIX) as s:  # bound, never listening, then closed: a dead agent's socket
        s.bind(str(sock))
    agent = subprocess.Popen(
        [sys.executable, "-m", "freeride", "agent", "--fake-gpu", "--state-dir", str(short_dir / "state"),
         "--socket", str(sock)], env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )
    try:
        with AgentClient(f"unix:{sock}") as c:
            c.wait_ready(20)
    finally:
        agent.terminate()
        _, err = agent.communicate(timeout=30)
    assert agent.returncode == 0, err
    assert not sock.exists()
