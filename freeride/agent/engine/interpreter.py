"""A task's own Python interpreter (`freeride submit --python PATH`): checked and pinned at submit, then asked
whether the freeride installed there speaks this agent's worker protocol (freeride.core.version).

The task's dependencies (transformers, its own torch) then live in that environment, not the agent's; the
reference check (refcheck.py) and every worker (freeride.agent.procs.workers) run in it. What it must hold
is freeride at the agent's worker protocol: `PATH -m freeride.worker --protocol` prints it (PROBE), and
`probe_problem` reads that answer. Each worker checks the protocol again when it starts (freeride.worker.protocol):
the environment may change after the submit.
"""

from __future__ import annotations

import json
import os
import stat

from freeride.core.version import WORKER_PROTOCOL, __version__
from freeride.errors import InvalidSpecError

MAX_PYTHON_CHARS = 4096
PROBE = ("-m", "freeride.worker", "--protocol")  # after the interpreter's path


def pinned_python(path: str) -> str:
    """`path` ("" : the agent's own interpreter, returned as is) checked, with its directory resolved (symlinks
    too) as it stands at submit, so that swapping a symlinked directory later does not swap the task's
    environment; its last part is kept as given: a venv's bin/python is a symlink to the base interpreter, and
    only by the venv's own path does Python find the venv. InvalidSpecError says what is wrong with it."""
    if not path:
        return ""
    if len(path) > MAX_PYTHON_CHARS or "\0" in path:
        raise InvalidSpecError(f"the task's interpreter path is longer than {MAX_PYTHON_CHARS} characters or holds "
                               "a NUL: give the path of its python, e.g. /opt/hf/bin/python")
    if not os.path.isabs(path):
        raise InvalidSpecError(f"the task's interpreter {path!r} is not an absolute path: give its full path, "
                               "e.g. /opt/hf/bin/python (freeride submit --python makes a relative one absolute)")
    head, tail = os.path.split(os.path.normpath(path))
    pinned = os.path.join(os.path.realpath(head), tail)
    problem = _not_runnable(pinned)
    if problem:
        raise InvalidSpecError(f"the task's interpreter {path} {problem}")
    return pinned


def _not_runnable(path: str) -> str:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "does not exist: give the path of an installed Python, e.g. a virtual environment's bin/python"
    except OSError as exc:
        return f"cannot be read by the agent ({exc.strerror}): give a Python the agent's user can run"
    if stat.S_ISDIR(st.st_mode):
        return "is a directory: give the interpreter inside it, e.g. its bin/python"
    if not stat.S_ISREG(st.st_mode):
        return "is not a file: give the path of a Python interpreter"
    if not os.access(path, os.X_OK):
        return "is not executable by the agent's user: give a Python interpreter it can run (or chmod +x it)"
    return ""


def _install(python: str) -> str:
    return f"install the agent's version there: {python} -m pip install freeride=={__version__}"


def probe_problem(python: str, code: int, out: bytes, err: bytes) -> str:
    """Why the interpreter's answer to PROBE (its exit code and output) rules it out ("" when its freeride speaks
    this agent's worker protocol)."""
    said = err.decode(errors="replace").strip().splitlines()
    last = said[-1].strip() if said else f"exit code {code}, nothing on stderr"
    if code != 0:
        if "No module named 'freeride" in last or "No module named freeride" in last:
            return f"the task's interpreter {python} cannot import freeride ({last}): {_install(python)}"
        if "unrecognized arguments" in last or "arguments are required" in last:
            return (f"the task's interpreter {python} has a freeride too old to state its worker protocol (this agent "
                    f"runs freeride {__version__}, worker protocol {WORKER_PROTOCOL}): {_install(python)}")
        return (f"the task's interpreter {python} failed at `-m freeride.worker --protocol` ({last}): it must be a "
                f"Python that can import freeride; {_install(python)}")
    try:
        answer = json.loads(out.decode(errors="replace").strip().splitlines()[-1])
        protocol, version = int(answer["worker_protocol"]), str(answer.get("freeride", "?"))
    except (IndexError, ValueError, TypeError, KeyError):
        return (f"the task's interpreter {python} gave no worker protocol at `-m freeride.worker --protocol`: "
                f"{_install(python)}")
    if protocol != WORKER_PROTOCOL:
        return (f"the task's interpreter {python} has freeride {version} (worker protocol {protocol}), this agent "
                f"runs freeride {__version__} (worker protocol {WORKER_PROTOCOL}): {_install(python)}")
    return ""


def probe_out_of_time(python: str, timeout_s: float) -> str:
    return (f"the task's interpreter {python} did not answer `-m freeride.worker --protocol` within {timeout_s:g} s "
            "(the check's time limit): check that it starts (run that command), or submit again when the machine "
            "is less busy")


def cannot_run(python: str, exc: OSError) -> str:
    """Why exec of the interpreter failed (a script without a #! line, a binary for another machine, ...)."""
    return (f"the task's interpreter {python} cannot be run ({exc.strerror or exc}): give the path of a Python "
            "interpreter, e.g. a virtual environment's bin/python")
