"""The `freeride` command in a subprocess, as a user runs it: one `run_freeride` for every test that needs the
process (the entry point, the `agent` command's refusals, a CLI beside an agent it may outlive)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
