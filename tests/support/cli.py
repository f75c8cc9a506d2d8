"""The `freeride` command in a subprocess, as a user runs it: one `run_freeride` for every test that needs the
process (the entry point, the `agent` command's refusals, a CLI beside an agent it may outlive); `InProcess` for the
rest, the same answer without a new interpreter per call."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import REPO

# The suite's own settings (tests/conftest.py) a cleaned environment keeps: without them an agent started from it
# runs its workers at true low priority, which starved a worker's start past 60 s at twice the cores' load.
SUITE_SETTINGS = ("FREERIDE_WORKER_AUTOGROUP", "FREERIDE_CHECK_TIMEOUT_S")


def clean_env(columns: str | None = "250", **extra: str) -> dict[str, str]:
    """The caller's environment without FREERIDE_* settings (but the suite's own), and `columns` wide (None: the
    caller's COLUMNS dropped), so that tables do not wrap."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FREERIDE_") or k in SUITE_SETTINGS}
    env.pop("COLUMNS", None)
    if columns is not None:
        env["COLUMNS"] = columns
    env.update(extra)
    return env


def run_freeride(*args: object, cwd: Path = REPO, env: dict[str, str] | None = None, stdin: str | None = None,
                 timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`python -m freeride ARGS` (with `clean_env()` unless `env` is given); its exit code and output."""
    return subprocess.run(
        [sys.executable, "-m", "freeride", *map(str, args)], cwd=cwd, env=env or clean_env(), capture_output=True,
        text=True, timeout=timeout, input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
    )


def assert_usage_error(res: subprocess.CompletedProcess[str]) -> str:
    """Exit code 2 and exactly one line on stderr, from freeride, without a traceback; returns the line."""
    lines = res.stderr.splitlines()
    assert res.returncode == 2, f"exit code {res.returncode}, stderr:\n{res.stderr}"
    assert "Traceback" not in res.stderr, res.stderr
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{res.stderr}"
    assert lines[0].startswith("freeride"), lines[0]
    return lines[0]


class InProcess:
    """`freeride ARGS` in this process: the same answer as the subprocess (exit code, stdout, stderr), without a
    new interpreter per call (about half a second each on a loaded 2-core runner, 0.3 CPU-s). The environment
    (`clean_env()` unless given), the working directory and stdin are the call's, and put back after it."""

    def __call__(self, *args: object, cwd: Path = REPO, env: dict[str, str] | None = None,
                 stdin: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        from freeride.main import main

        argv = [str(a) for a in args]
        # text streams over bytes, as a process's are (`logs` writes the log's own bytes to sys.stdout.buffer)
        raw = [io.BytesIO(), io.BytesIO()]
        out, err = (io.TextIOWrapper(b, encoding="utf-8", write_through=True) for b in raw)
        with pytest.MonkeyPatch.context() as m, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            given = env or clean_env()
            for key in [k for k in os.environ if k not in given]:
                m.delenv(key)
            for key, value in given.items():
                m.setenv(key, value)
            m.chdir(cwd)
            m.setattr(sys, "stdin", io.StringIO(stdin or ""))  # (a subprocess's is /dev/null unless given)
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return subprocess.CompletedProcess(["freeride", *argv], code or 0, *(b.getvalue().decode(errors="replace")
                                                                             for b in raw))
