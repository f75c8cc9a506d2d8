"""Subprocesses for the checks: run one with a timeout and keep what it said, end a process group, and find
every process a check left behind by the environment mark it inherited."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

import freeride

_TAIL_LINES = 40
_TAIL_CHARS = 4000


def tail(text: str, lines: int = _TAIL_LINES, chars: int = _TAIL_CHARS) -> str:
    """The last `lines` lines of `text`, at most `chars` characters: the evidence a report keeps."""
    out = "\n".join(text.rstrip().splitlines()[-lines:])
    return out[-chars:]


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def package_root() -> str:
    """The directory that holds the freeride package (a checkout run without installing it, too)."""
    return str(Path(freeride.__file__).resolve().parent.parent)


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment, with freeride importable from any working directory and output unbuffered."""
    env = dict(os.environ)
    root = package_root()
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([root, *(p for p in parts if p != root)])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def freeride_argv(*args: str) -> list[str]:
    """`freeride ARGS` as this interpreter runs it (the console script may not be installed)."""
    return [sys.executable, "-m", "freeride", *args]


def run(argv: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None,
        stdin_text: str | None = None) -> dict[str, Any]:
    """Run a command to its end or `timeout_s` (its process group is then killed); what it did, as JSON data."""
    t0 = time.monotonic()
    record: dict[str, Any] = {"argv": list(argv)}
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(env) if env is not None else child_env(), start_new_session=True)
    except OSError as exc:
        return {**record, "rc": None, "error": f"{type(exc).__name__}: {exc}", "stdout": "", "stderr": "",
                "duration_ms": 0.0, "timed_out": False}
    try:
        out, err = proc.communicate(stdin_text, timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        out, err = proc.communicate()
        timed_out = True
    return {**record, "rc": proc.returncode, "stdout": out, "stderr": err,
            "duration_ms": round((time.monotonic() - t0) * 1e3, 1), "timed_out": timed_out}


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def sweep(mark_env: str, mark: str, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """SIGKILL every process whose environment carries `mark_env=mark` (what a check started, however far
    it strayed from its process group: agents, workers, MPS daemons); the ones found."""
    found = []
    me = os.getpid()
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            if p.environ().get(mark_env) == mark and p.status() != psutil.STATUS_ZOMBIE:
                found.append((p, " ".join(p.cmdline())[:200]))
        except psutil.Error:
            continue
    for p, _ in found:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs([p for p, _ in found], timeout=timeout_s)
    return [{"pid": p.pid, "cmdline": cmd} for p, cmd in found]
