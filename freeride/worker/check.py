"""`python -m freeride.worker.check REF [key=value ...]`: validate a task reference in a throwaway process.

The agent runs this before accepting a submission, so that user code is never imported into
the agent itself: it loads the class, converts the arguments, and runs the task's `check_args`.
Prints one JSON object on stdout.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

from freeride.core.cpu import apply_from_env
from freeride.errors import TaskRefError
from freeride.worker._loader import bind_args, kind_of, load_class


def check(ref: str, args: dict[str, str]) -> dict[str, object]:
    try:
        cls = load_class(ref)
        kwargs = bind_args(cls, args)
    except TaskRefError as exc:
        return {"ok": False, "error": str(exc)}
    try:
        cls.check_args(**kwargs)
    except Exception as exc:
        return {"ok": False, "error": _refusal(exc)}
    return {
        "ok": True,
        "kind": kind_of(cls),
        "mem_limit_bytes": int(getattr(cls, "mem_limit_bytes", 0) or 0),
        "priority": int(getattr(cls, "priority", 0) or 0),
        "name": cls.__name__,
    }


def _refusal(exc: Exception) -> str:
    """The one line `freeride submit` prints for an exception from the task's check_args."""
    text = " ".join(str(exc).split())
    if isinstance(exc, ValueError) and text:
        return text  # the task's own refusal, as it worded it
    return f"check_args raised {type(exc).__name__}: {text}" if text else f"check_args raised {type(exc).__name__}"


def _die_with(parent_pid: int) -> None:
    """End this check, and whatever the task's import starts in its process group, when the agent that
    started it dies: Linux sends this process SIGTERM then (PR_SET_PDEATHSIG), and SIGTERM kills the group."""
    if os.getpgrp() != os.getpid():  # not in a group of its own: killing "its" group would reach others
        return
    signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the agent's own kill at the check's time limit remains
        return
    if os.getppid() != parent_pid:  # the agent died before the request took effect
        os.killpg(0, signal.SIGKILL)


_PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    """`REF key=value ...`, or `REF -`: the arguments as one JSON object on stdin (the agent's way: a
    command line is visible to every user of the host, and arguments may hold a password). The agent
    passes `--parent PID` first: its pid, so that the check dies with it."""
    if argv[:1] == ["--parent"]:
        _die_with(int(argv[1]))
        argv = argv[2:]
    # The workers' placement (nice, CPUs, SCHED_IDLE): a burst of submits must not take training's CPU.
    problem = apply_from_env(os.environ)
    if problem:
        print(f"cannot run the check at the CPU placement the agent chose: {problem}", file=sys.stderr)
        return 2
    ref, *pairs = argv
    args = json.loads(sys.stdin.read()) if pairs == ["-"] else dict(p.split("=", 1) for p in pairs)
    print(json.dumps(check(ref, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
