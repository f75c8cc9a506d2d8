"""The reference check at submit: import the task in a throwaway process, never in the agent.

A task with its own interpreter (TaskSpec.python) is checked in that interpreter, after the interpreter itself
is asked for its worker protocol (freeride.agent.engine.interpreter), in the same slot and under the same limit.

`RefChecks` owns every check process the agent runs. At most `parallel` run at once (each is a
Python process importing the user's module: 200 concurrent submits must not mean 200 of them);
the others wait their turn inside their Submit call. Each check runs in its own process group
and is bounded by `timeout_s`; whether it ends, times out or its caller goes away, its whole
group is killed. `close()` (agent shutdown) kills the groups of the checks still running, and a
check kills itself when the agent dies (freeride.worker.check asks the kernel for that).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
from collections.abc import Mapping
from typing import Any

from freeride.agent.config import MAX_CHECK_TIMEOUT_S
from freeride.agent.domain.model import TaskSpec
from freeride.agent.engine import interpreter
from freeride.core.cpu import Placement
from freeride.errors import InvalidSpecError, InvalidStateError, TaskRefError

PARALLEL_CHECKS = max(1, min(4, os.cpu_count() or 1))  # the host's cores, at most 4: a check is one CPU-bound process
# How long a submit waits for a free slot: a burst of 200 submits on a busy 2-core host took ~20-80 s to check
# (a check costs ~50 ms of CPU); the client's Submit deadline (freeride.client.SUBMIT_TIMEOUT_S, 150 s) exceeds
# this plus twice the longest --check-timeout-s (40 s: a task's own interpreter is probed, then checked).
QUEUE_WAIT_S = 60.0
_PIPES_AFTER_EXIT_S = 2.0  # a process that left the check's group (setsid) may hold its pipes open


def pinned_ref(ref: str) -> str:
    """A file reference (`path/file.py:Class`) with its path resolved (symlinks too) as it stands at submit, so
    that the check and every later worker start load the same file: swapping a symlinked directory afterwards
    does not swap the task's code. Any other reference comes back as given. The file's own content is not
    pinned: an edit to it takes effect at the task's next worker start (docs/sidetasks.md)."""
    path, sep, cls = ref.rpartition(":")
    if not (sep and path.endswith(".py")):
        return ref
    return f"{os.path.realpath(path)}:{cls}"


def with_checked(spec: TaskSpec, checked: Mapping[str, Any]) -> TaskSpec:
    """The spec, with what it leaves unset (its priority, memory cap, name) taken from what the check read off
    the task's class."""
    if spec.priority == 0 and checked.get("priority"):
        spec = dataclasses.replace(spec, priority=int(checked["priority"]))
    if spec.mem_limit_bytes == 0 and checked.get("mem_limit_bytes"):
        spec = dataclasses.replace(spec, mem_limit_bytes=int(checked["mem_limit_bytes"]))
    if not spec.name:
        spec = dataclasses.replace(spec, name=str(checked.get("name", "task")))
    return spec


@dataclasses.dataclass(frozen=True)
class _Ran:
    code: int
    out: bytes
    err: bytes
    timed_out: bool


class RefChecks:
    def __init__(self, timeout_s: float, parallel: int = PARALLEL_CHECKS, queue_wait_s: float = QUEUE_WAIT_S,
                 placement_env: Mapping[str, str] | None = None) -> None:
        """`placement_env`: the workers' CPU placement (Placement.to_env()), which each check applies to itself
        before it imports the task: checking a submit costs training no more than a worker does."""
        self.timeout_s = timeout_s
        self._env = {**os.environ, **placement_env} if placement_env else None
        self._placement = Placement.from_env(placement_env or {})
        self._queue_wait_s = queue_wait_s
        self._slots = asyncio.Semaphore(parallel)
        self._running: set[int] = set()  # process group ids of the checks running now
        self.queued = 0  # submits waiting for a free slot
        self._closed = False

    async def check(self, spec: TaskSpec) -> dict[str, Any]:
        """What `freeride.worker.check` says of the task (kind, name, declared priority and cap); TaskRefError
        if it cannot be imported, its arguments do not bind, its check_args refuses them (the error is the
        task's one line) or the check does not finish in time. User code never runs inside the agent."""
        self.queued += 1
        try:
            async with asyncio.timeout(self._queue_wait_s):
                await self._slots.acquire()
        except TimeoutError:
            raise InvalidStateError(
                f"the agent is busy checking other submissions ({self.queued} waiting); submit again shortly"
            ) from None
        finally:
            self.queued -= 1
        try:
            return await self._run(spec)
        finally:
            self._slots.release()

    async def _run(self, spec: TaskSpec) -> dict[str, Any]:
        python = spec.python or sys.executable  # the task's own interpreter: its import errors concern that one
        if spec.python:
            await self._probe(spec.python)
        ran = await self._exec(
            [python, "-m", "freeride.worker.check", "--parent", str(os.getpid()), spec.ref,
             "-"],  # the arguments on stdin, not on a command line every user of the host can read
            json.dumps(spec.args).encode())
        if ran.timed_out:
            module = spec.ref.rpartition(":")[0] or spec.ref
            raise TaskRefError(out_of_time(module, self.timeout_s))
        return _answer(spec, ran.out, ran.err)

    async def _probe(self, python: str) -> None:
        """InvalidSpecError unless the interpreter runs a freeride at this agent's worker protocol."""
        try:
            ran = await self._exec([python, *interpreter.PROBE], b"")
        except OSError as exc:  # a script without a #! line, a binary for another machine, ...
            raise InvalidSpecError(interpreter.cannot_run(python, exc)) from None
        if ran.timed_out:
            raise InvalidSpecError(interpreter.probe_out_of_time(python, self.timeout_s))
        problem = interpreter.probe_problem(python, ran.code, ran.out, ran.err)
        if problem:
            raise InvalidSpecError(problem)

    async def _exec(self, argv: list[str], stdin: bytes) -> _Ran:
        """Run one check process in a group of its own, for at most `timeout_s`; the group is killed after it."""
        if self._closed:
            raise InvalidStateError("the agent is shutting down; submit again once it is back")
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            process_group=0, env=self._env,
        )
        if self._placement is not None:
            self._placement.start_at(proc.pid)  # its interpreter's start-up too, not only what follows
        self._running.add(proc.pid)
        io = asyncio.ensure_future(proc.communicate(stdin))
        timed_out = False
        try:
            async with asyncio.timeout(self.timeout_s):
                await proc.wait()
        except TimeoutError:
            timed_out = True
        finally:  # also when the caller went away: the check and whatever it started go with it
            self._running.discard(proc.pid)
            _kill_group(proc.pid)
            try:
                out, err = await asyncio.wait_for(io, _PIPES_AFTER_EXIT_S)
            except TimeoutError:
                out, err = b"", b""
        if self._closed and proc.returncode != 0:  # killed by close(): its silence is no verdict on the task
            raise InvalidStateError("the agent is shutting down; submit again once it is back")
        return _Ran(proc.returncode if proc.returncode is not None else -1, out, err, timed_out)

    def close(self) -> None:
        """Kill every check still running (agent shutdown); later checks are refused."""
        self._closed = True
        for pgid in list(self._running):
            _kill_group(pgid)


def out_of_time(module: str, timeout_s: float) -> str:
    """Why a check that ran out of time was refused, and what to do when the task is not slow but the machine is
    (a loaded host; a large import such as torch's, several at once)."""
    said = (f"importing {module!r} did not finish in {timeout_s:g} s: keep slow work (sleeps, downloads, network "
            "calls) out of its import and its check_args; the check was stopped. If the machine is only busy, submit "
            "again")
    if timeout_s >= MAX_CHECK_TIMEOUT_S:
        return said + " when it is less so"
    return (f"{said}, or start the agent with a longer --check-timeout-s (now {timeout_s:g}, at most "
            f"{MAX_CHECK_TIMEOUT_S:g}; or FREERIDE_CHECK_TIMEOUT_S)")


def _answer(spec: TaskSpec, out: bytes, err: bytes) -> dict[str, Any]:
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        detail = err.decode(errors="replace").strip().splitlines()
        raise TaskRefError(f"checking {spec.ref!r} failed: {detail[-1] if detail else 'no output'}") from None
    if not result.get("ok"):
        raise TaskRefError(str(result.get("error")))
    return result


def _kill_group(pgid: int) -> None:
    """SIGKILL the check's process group. Its leader may be reaped already, but the group's id is not reused
    while any member of it lives, so this reaches exactly what the check started (or nothing)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
