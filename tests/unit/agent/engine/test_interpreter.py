"""A task's own interpreter (`submit --python`): the path checked and pinned, the interpreter asked for its
worker protocol before the reference check runs in it (freeride.agent.engine.interpreter, refcheck), each
worker comparing protocols at start (freeride.worker.protocol), and a start without the interpreter."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from freeride.agent.domain.model import TaskSpec
from freeride.agent.engine.interpreter import pinned_python
from freeride.agent.engine.refcheck import RefChecks
from freeride.agent.procs.workers import WorkerLauncher, WorkerStartError
from freeride.core.exits import NO_RESTART, REASON_MARK
from freeride.core.version import WORKER_PROTOCOL, __version__
from freeride.errors import InvalidSpecError, TaskRefError
from freeride.worker import process

NEEDS_ONLY_HERE = "import onlyhere\n\nfrom freeride import IterativeTask\n\n\nclass Task(IterativeTask):\n" \
                  "    def step(self) -> None:\n        pass\n"


def script(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def wrapper(path: Path, pythonpath: Path | None = None) -> Path:
    """A second 'interpreter': this one, reached through a script (and a module path only it has)."""
    extra = f'PYTHONPATH="{pythonpath}${{PYTHONPATH:+:$PYTHONPATH}}"; export PYTHONPATH\n' if pythonpath else ""
    return script(path, f'{extra}exec "{sys.executable}" "$@"')


def refused(spec: TaskSpec) -> str:
    async def main() -> str:
        with pytest.raises(InvalidSpecError) as err:
            await RefChecks(timeout_s=30).check(spec)
        return str(err.value)

    return asyncio.run(main())


def test_an_interpreter_with_another_worker_protocol_is_refused_naming_it_what_it_has_and_what_to_do(
        tmp_path: Path) -> None:
    answer = json.dumps({"worker_protocol": WORKER_PROTOCOL + 1, "freeride": "9.0.0"})
    fake = script(tmp_path / "python", f"echo '{answer}'")
    said = refused(TaskSpec(name="t", ref="freeride.tooling.tasks:NoopTask", python=str(fake)))
    assert said == (
        f"the task's interpreter {fake} has freeride 9.0.0 (worker protocol {WORKER_PROTOCOL + 1}), this agent runs "
        f"freeride {__version__} (worker protocol {WORKER_PROTOCOL}): install the agent's version there: "
        f"{fake} -m pip install freeride=={__version__}")


def test_an_interpreter_without_freeride_is_refused_with_the_install_command(tmp_path: Path) -> None:
    fake = script(tmp_path / "python",
                  "echo \"ModuleNotFoundError: No module named 'freeride'\" >&2; exit 1")
    said = refused(TaskSpec(name="t", ref="freeride.tooling.tasks:NoopTask", python=str(fake)))
    assert said.startswith(f"the task's interpreter {fake} cannot import freeride (ModuleNotFoundError: ")
    assert said.endswith(f"{fake} -m pip install freeride=={__version__}")


def test_an_interpreter_whose_freeride_predates_the_protocol_question_is_refused(tmp_path: Path) -> None:
    fake = script(tmp_path / "python", "echo 'freeride-worker: error: the following arguments are required: "
                                       "--agent' >&2; exit 2")
    said = refused(TaskSpec(name="t", ref="freeride.tooling.tasks:NoopTask", python=str(fake)))
    assert "has a freeride too old to state its worker protocol" in said
    assert said.endswith(f"pip install freeride=={__version__}")


def test_a_file_that_cannot_be_executed_as_a_program_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "python"
    text.write_text("not a program\n")  # executable, but neither a binary nor a #! script
    text.chmod(0o755)
    said = refused(TaskSpec(name="t", ref="freeride.tooling.tasks:NoopTask", python=str(text)))
    assert said.startswith(f"the task's interpreter {text} cannot be run (")


def _plain_file(d: Path) -> Path:
    (d / "plain").write_text("x")
    return d / "plain"


@pytest.mark.parametrize(("make", "says"), [
    (lambda d: d / "missing", "does not exist: give the path of an installed Python"),
    (lambda d: d, "is a directory: give the interpreter inside it"),
    (_plain_file, "is not executable by the agent's user: give a Python interpreter it can run"),
])
def test_a_missing_a_directory_or_a_non_executable_path_is_refused(
        tmp_path: Path, make: Callable[[Path], Path], says: str) -> None:
    path = make(tmp_path)
    with pytest.raises(InvalidSpecError) as err:
        pinned_python(str(path))
    assert str(err.value).startswith(f"the task's interpreter {path} {says}")


def test_a_relative_interpreter_path_is_refused() -> None:
    with pytest.raises(InvalidSpecError, match="'bin/python' is not an absolute path: give its full path"):
        pinned_python("bin/python")


def test_the_directory_is_pinned_and_a_venvs_python_symlink_kept(tmp_path: Path) -> None:
    """A venv's bin/python is a symlink to its base interpreter: resolving it would leave the venv."""
    env = tmp_path / "envs" / "hf-1"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to(sys.executable)
    (tmp_path / "hf").symlink_to(env)  # a 'current' link a later deploy may swap
    assert pinned_python(str(tmp_path / "hf" / "bin" / "python")) == str(env.resolve() / "bin" / "python")
    assert pinned_python("") == ""  # the agent's own


def test_the_reference_check_runs_in_the_tasks_interpreter(tmp_path: Path) -> None:
    """A dependency that only the task's environment has: the check finds it there, and not in the agent's."""
    only = tmp_path / "site"
    only.mkdir()
    (only / "onlyhere.py").write_text("")
    (tmp_path / "task.py").write_text(NEEDS_ONLY_HERE)
    python = wrapper(tmp_path / "python", pythonpath=only)
    ref = f"{tmp_path / 'task.py'}:Task"

    async def main() -> None:
        checks = RefChecks(timeout_s=30)
        assert (await checks.check(TaskSpec(name="t", ref=ref, python=str(python))))["ok"]
        with pytest.raises(TaskRefError, match="onlyhere"):
            await checks.check(TaskSpec(name="t", ref=ref))  # the agent's interpreter has no such module

    asyncio.run(main())


def test_the_worker_states_its_protocol_as_one_json_line() -> None:
    out = subprocess.run([sys.executable, "-m", "freeride.worker", "--protocol"], capture_output=True, text=True,
                         check=True, env={**os.environ, "COLUMNS": "20"}).stdout
    answer = json.loads(out)  # one line, however narrow the terminal
    assert (answer["worker_protocol"], answer["freeride"]) == (WORKER_PROTOCOL, __version__)


def test_a_worker_started_by_an_agent_of_another_protocol_exits_no_restart_saying_why(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = process.main(["--agent", "unix:/nowhere", "--task-id", "1", "--instance", "1", "--window-word-fd", "-1",
                         "--window-fd", "-1", "--agent-protocol", str(WORKER_PROTOCOL + 1), "--agent-version", "9.0.0"])
    assert code == NO_RESTART  # FAILED with the reason, no restart: every restart would meet the same freeride
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said == (
        f"{REASON_MARK}the task's interpreter {sys.executable} has freeride {__version__} (worker protocol "
        f"{WORKER_PROTOCOL}), but the agent runs freeride 9.0.0 (worker protocol {WORKER_PROTOCOL + 1}): install the "
        f"agent's version there ({sys.executable} -m pip install freeride==9.0.0), then submit the task again")


def test_a_worker_whose_interpreter_is_gone_does_not_start_and_says_so(tmp_path: Path) -> None:
    launcher = WorkerLauncher("unix:/nowhere", tmp_path / "logs", gpu=0)

    async def main() -> None:
        with pytest.raises(WorkerStartError, match=f"its interpreter {tmp_path}/gone/python is gone or no longer "
                                                   "executable .*submit the task again with --python"):
            await launcher.spawn("1", 1, lambda *_: None, python=str(tmp_path / "gone" / "python"))

    asyncio.run(main())
