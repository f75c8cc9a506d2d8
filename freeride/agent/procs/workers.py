"""Worker processes: spawn one per task, learn of its exit as an event, kill it with its children.

Containment: each worker runs in a cgroup v2 group of its own (freeride.agent.procs.cgroups) where the
agent may create one; the whole group is killed when the worker exits or is killed, so nothing a task
starts outlives it. Without cgroups, the worker's process group is killed, and what left it is found by
the WORKER_MARK in its environment and by the record of the worker's process tree (freeride.agent.procs.records),
which the memory watchdog's tick keeps up to date (`tracking`: read in its thread, applied on the loop).
After a `kill -9` of this agent, each worker kills what its record names once it has checkpointed
(freeride.worker.leftovers), and the next agent kills what provably was the workers' (`reclaim`): a task can
write records, so that agent trusts none (records.py).
Windows: each worker inherits its own window word and wake-up pipe (freeride.core.window) and nothing else
of the agent's: a task cannot reach another task's windows.
Output: the worker's stdout and stderr go through a pipe to the task's capped log (freeride.agent.procs.task_logs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from freeride.agent.domain.background import Background
from freeride.agent.procs.cgroups import CgroupTree
from freeride.agent.procs.records import WORKER_MARK, ProcRecords, Procs, mark, proven, state_key, tree, wait_exited
from freeride.agent.procs.task_logs import TaskLogs, log_path, rotated
from freeride.core.cpu import Placement
from freeride.core.exits import REASON_MARK
from freeride.core.private import create_private, private_dir
from freeride.core.proc_records import RECORD_ENV, kill
from freeride.core.version import WORKER_PROTOCOL, __version__
from freeride.core.window import WindowWriter

log = logging.getLogger(__name__)

_BEFORE_KILL_S = 10.0  # bound on terminate_client: the kill happens regardless
_EMPTIED_S = 10.0  # bound on the wait for a killed group to empty (a process stuck in the kernel)
__all__ = ["WORKER_MARK", "WorkerLauncher", "WorkerProcess", "WorkerStartError", "describe_exit", "last_log_line",
           "said_reason"]
# The agent's GPU index (`--gpu`), in every worker's environment: the worker's TaskContext.gpu.
GPU_ENV = "FREERIDE_GPU"
# The task's log file, in every worker's environment: once the agent (and its log writer) is gone, the
# worker writes its last words (its final checkpoint's output) there itself, not into a broken pipe.
LOG_FILE_ENV = "FREERIDE_LOG_FILE"


class WorkerStartError(Exception):
    """A worker cannot be started for a reason its message names (its task's interpreter is gone)."""


@dataclass
class WorkerProcess:
    task_id: str
    instance: int
    proc: asyncio.subprocess.Process
    log_path: Path
    window: WindowWriter
    mark: str = ""  # WORKER_MARK's value in its environment (and its descendants')
    background: Background = field(default_factory=lambda: Background("worker stop"))  # owns _stop_then_kill
    kill_reason: str = ""
    failure: str = ""
    retryable: bool = True
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    # Runs before the SIGKILL (MPS terminate_client: cancel the worker's queued GPU work first).
    before_kill: Callable[[int], Awaitable[None]] | None = None
    cgroups: CgroupTree | None = None
    group: Path | None = None  # its cgroup (None: contained by its process group and mark only)
    log_fd: int = -1  # the read end of its output pipe (the log writer's)
    name: str = ""  # its record's name in the state directory (and its cgroup's)
    known: Procs = field(default_factory=dict)  # every process seen in its tree (pid -> start time)
    _stopping: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self, reason: str) -> None:
        """SIGKILL the worker's whole process group (a task's own children die with it), after before_kill."""
        if not self.kill_reason:
            self.kill_reason = reason
        if self.before_kill is not None and not self.exited.is_set():
            if not self._stopping:
                self._stopping = True
                self.background.spawn(self._stop_then_kill(self.before_kill))
            return
        self.kill_all()

    async def _stop_then_kill(self, hook: Callable[[int], Awaitable[None]]) -> None:
        try:
            await asyncio.wait_for(hook(self.proc.pid), timeout=_BEFORE_KILL_S)
        except Exception as exc:  # a stuck or failing hook must not keep a worker alive
            log.warning("worker %d: stopping it cleanly failed (%s); killing it", self.proc.pid, exc)
        finally:  # cancelled too (the agent exiting): the kill happens regardless
            self.kill_all()

    def kill_all(self) -> None:
        """SIGKILL its cgroup (every descendant, wherever it went) and its process group."""
        if self.cgroups is not None and self.group is not None:
            self.cgroups.kill(self.group)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


class WorkerLauncher:
    def __init__(self, agent_target: str, log_dir: Path, gpu: int, env: dict[str, str] | None = None,
                 placement: Placement | None = None, logs: TaskLogs | None = None,
                 cgroups: CgroupTree | None = None) -> None:
        """`gpu`: the agent's GPU index, told to every worker (GPU_ENV); `env`: the base environment
        (None: the agent's own); `placement`: the CPU placement every worker applies to itself at start;
        `logs`: the capped task logs (None: each worker appends to its log file itself, uncapped);
        `cgroups`: where each worker gets a cgroup (None: process group and mark only)."""
        self._logs = logs
        self._cgroups = cgroups
        self._placement = placement
        self._placement_env = placement.to_env() if placement is not None else {}
        self._target = agent_target
        self._log_dir = log_dir
        self._gpu = gpu
        self._env = env
        self._stops = Background("worker stop")  # each worker's clean stop before its kill
        self._watches = Background("worker watch")
        self._watched: dict[asyncio.Task[None], WorkerProcess] = {}
        self._groups: dict[int, Path] = {}  # each live worker's cgroup, by its pid
        self._records = ProcRecords(log_dir.parent / "run" / "workers")
        self._key = state_key(log_dir.parent)  # in every worker's mark: which agent's leftovers are whose

    def group_of(self, pid: int) -> Path | None:
        """The cgroup of the live worker `pid` (None: it has none, or it is no worker of ours)."""
        return self._groups.get(pid)

    async def spawn(
        self, task_id: str, instance: int, on_exit: Callable[[WorkerProcess, int], None],
        env: dict[str, str] | None = None, python: str = "",
    ) -> WorkerProcess:
        """Start a worker; `env` (its GPU client settings) replaces the launcher's environment when given;
        `python`: the task's own interpreter ("": the agent's). WorkerStartError when that one is gone."""
        if python and not os.access(python, os.X_OK):
            raise WorkerStartError(
                f"its interpreter {python} is gone or no longer executable (it was checked at submit): restore that "
                "environment, or submit the task again with --python naming one that exists")
        private_dir(self._log_dir)
        path = log_path(self._log_dir, task_id)
        env = dict(env if env is not None else os.environ if self._env is None else self._env)
        env["PYTHONUNBUFFERED"] = "1"
        env[WORKER_MARK] = mark(os.getpid(), task_id, instance, self._key)
        env[GPU_ENV] = str(self._gpu)
        env[LOG_FILE_ENV] = str(path)
        env.update(self._placement_env)  # the worker applies it to itself before it starts anything
        window = WindowWriter()  # inherited by this worker alone: no other task can reach it
        word_fd, wake_fd = window.child_fds()
        argv = [python or sys.executable, "-m", "freeride.worker", "--agent", self._target, "--task-id", task_id,
                "--instance", str(instance), "--window-word-fd", str(word_fd), "--window-fd", str(wake_fd),
                "--agent-protocol", str(WORKER_PROTOCOL), "--agent-version", __version__]
        name = f"task-{task_id}-{instance}-{os.getpid()}"
        env[RECORD_ENV] = str(self._records.path(name))  # what it kills itself once it has lost this agent
        group = self._cgroups.group(name) if self._cgroups else None
        if group is not None and self._cgroups is not None:
            argv = self._cgroups.argv(group, argv)  # in its group before its first instruction
        read_fd, out = self._logs.pipe(task_id) if self._logs is not None else (-1, create_private(path))
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                pass_fds=(word_fd, wake_fd),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # its own process group: one killpg reaches its children
                env=env,
            )
        except BaseException:
            if group is not None:
                CgroupTree.remove(group)
            window.close_child_end()
            window.close()
            raise
        finally:
            os.close(out)  # (a pipe's read end goes at its end of file: the writer closes it)
        window.close_child_end()
        if self._placement is not None:
            self._placement.start_at(proc.pid)  # its interpreter's start-up too, not only what follows
        if group is not None:
            self._groups[proc.pid] = group
        worker = WorkerProcess(task_id, instance, proc, path, window, mark=env[WORKER_MARK],
                               background=self._stops, cgroups=self._cgroups, group=group, log_fd=read_fd,
                               name=name, known=tree(proc.pid))
        self._records.write(name, worker.known)  # (its first line: the worker, whose checkpoint a successor awaits)
        watch = self._watches.spawn(self._watch(worker, on_exit), on_error=lambda _: self._watch_failed(worker))
        self._watched[watch] = worker
        watch.add_done_callback(lambda t: self._watched.pop(t, None))
        return worker

    def tracking(self) -> TreeScan:
        """The memory watchdog's look at the trees of the live workers that have no cgroup (with one, the group
        holds every process already): read off the loop, applied on it."""
        return TreeScan([w for w in self._watched.values() if w.group is None and not w.exited.is_set()],
                        self._records)

    async def reclaim(self, grace_s: float) -> None:
        """Before any task starts: kill what the workers of a killed predecessor on this state directory left,
        once each old worker has exited, which it does after the checkpoint it takes when it loses its agent
        (up to `grace_s`, all together), killing what its record names on its way out (freeride.worker).

        A task can write records (records.py), so one is only a hint: what is killed here is what a task
        cannot pass off as a worker's, every process in the predecessor's cgroups, every process carrying a
        worker mark of this state directory, and the trees the proven old workers have now."""
        left = self._records.left()
        groups = self._cgroups.leftovers() if self._cgroups is not None else []
        if not left and not groups:
            return
        loop = asyncio.get_running_loop()
        workers, trees = await loop.run_in_executor(None, proven, left, self._key)
        late = await loop.run_in_executor(None, wait_exited, workers, grace_s)
        if late:
            log.warning("%d worker(s) of a previous agent did not exit within %.0f s; killing them: %s",
                        len(late), grace_s, ", ".join(map(str, late)))
        key = self._key
        killed = await loop.run_in_executor(None, _kill_left, [trees],
                                            lambda m: m is not None and m.rpartition(":")[2] == key)
        for group in groups:
            assert self._cgroups is not None
            members = self._cgroups.members(group)
            self._cgroups.kill(group)
            killed += [str(pid) for pid in members]
            await self._remove_group(group)
        for name in left:
            self._records.remove(name)
        if killed:
            log.warning("killed %d process(es) the workers of a previous agent left running: %s",
                        len(killed), ", ".join(killed))

    @staticmethod
    def _watch_failed(worker: WorkerProcess) -> None:
        """(Logged by its owner.) A worker whose exit can no longer be seen must not run on unwatched."""
        if not worker.exited.is_set():
            worker.kill("the agent lost track of it")

    async def settle(self) -> None:
        """Before the agent exits: wait until every exited worker's processes are gone (its stop, its group
        emptied or its scan for escaped processes); stop watching the workers that outlived the agent's
        grace period; remove the worker groups left empty (a predecessor's too)."""
        await self._stops.wait()
        exited = [t for t, w in self._watched.items() if w.exited.is_set()]
        if exited:
            await asyncio.wait(exited)
        await self._watches.cancel()
        if self._cgroups is not None:
            self._cgroups.remove_empty()
            self._cgroups.close(remove_root=True)

    async def _watch(self, worker: WorkerProcess, on_exit: Callable[[WorkerProcess, int], None]) -> None:
        code = await worker.proc.wait()
        self._groups.pop(worker.pid, None)
        # Kill whatever the task started and left behind: its cgroup (all of it), its process group.
        worker.kill_all()
        if worker.log_fd >= 0 and self._logs is not None:
            await self._logs.drain(worker.log_fd)  # its last words are in the log before anyone reads it
        worker.window.close()
        worker.exited.set()
        try:
            on_exit(worker, code)
        except Exception:  # the supervisor's bug must not also leave escaped processes running
            log.exception("task %s: handling its worker's exit failed", worker.task_id)
        if self._logs is not None:
            self._logs.poke(worker.task_id)  # its followers: the worker is gone
        if worker.group is not None and self._cgroups is not None:
            await self._remove_group(worker.group)
            self._records.remove(worker.name)
            return
        # Without a cgroup: what left the process group (setsid, a daemonising fork) but still carries the
        # worker's mark or was seen in its tree; a scan of /proc, once per worker exit, in a thread (never a
        # pause of the control path).
        escaped = await asyncio.get_running_loop().run_in_executor(
            None, _kill_left, [{p: t for p, t in worker.known.items() if p != worker.pid}], lambda m: m == worker.mark)
        self._records.remove(worker.name)
        if escaped:
            log.warning("task %s: killed %d process(es) it had started outside its process group: %s",
                        worker.task_id, len(escaped), ", ".join(escaped))

    async def _remove_group(self, group: Path) -> None:
        assert self._cgroups is not None
        try:
            await asyncio.wait_for(self._cgroups.emptied(group), timeout=_EMPTIED_S)
        except TimeoutError:
            log.warning("cgroup %s: processes still in it %.0f s after its kill; left (removed once empty, "
                        "when this agent exits or the next one starts)", group, _EMPTIED_S)
            return
        if not self._cgroups.remove(group):
            log.warning("cgroup %s: emptied but could not be removed", group)


class TreeScan:
    """One watchdog tick's scan of some workers' process trees: `read` in the watchdog's thread (one /proc scan
    per worker, nothing of the loop's state touched), then `apply` on the loop: write down the processes new
    in each tree. A worker reaped in between is skipped (its pid may name another process by now)."""

    def __init__(self, workers: list[WorkerProcess], records: ProcRecords) -> None:
        self._workers = [(w, w.pid) for w in workers]
        self._records = records
        self._found: list[tuple[WorkerProcess, Procs]] = []

    def read(self) -> None:
        self._found = [(worker, tree(pid)) for worker, pid in self._workers]

    def apply(self) -> None:
        for worker, now in self._found:
            if worker.proc.returncode is not None or worker.exited.is_set():
                continue
            if now.keys() - worker.known.keys():
                worker.known.update(now)
                self._records.write(worker.name, worker.known)


def _kill_left(recorded: list[Procs], marked: Callable[[str | None], bool]) -> list[str]:
    """SIGKILL the given processes still alive (start times matching), then every process whose worker mark
    `marked` accepts."""
    killed = [what for procs in recorded for what in kill(procs)]
    return killed + kill_marked(marked)


def kill_marked(marked: Callable[[str | None], bool]) -> list[str]:
    """SIGKILL every process whose WORKER_MARK (None: it has none) `marked` accepts; their descriptions."""
    killed = []
    for proc in psutil.process_iter():
        try:
            if marked(proc.environ().get(WORKER_MARK)) is not True:  # (only a plain yes kills)
                continue
            what = f"{proc.pid} ({proc.name()})"
            proc.kill()
            killed.append(what)
        except (psutil.Error, OSError):  # gone meanwhile, a zombie, or another user's
            continue
    return killed


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"worker killed by {name}"
    return f"worker exited with code {code}"


# gRPC's C core logs like glog ("I1121 12:06:54.952123   30788 fork_posix.cc:71] ..."): noise, never the cause.
_GRPC_CORE_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\]")


def _tail_lines(path: Path, limit: int) -> list[str]:
    """The whole non-empty lines in the last `limit` bytes of each part of a worker log, the rotated part
    first; gRPC's own log lines left out."""
    out: list[str] = []
    for part in (rotated(path), path):
        try:
            with open(part, "rb") as f:
                f.seek(0, os.SEEK_END)
                start = max(0, f.tell() - limit)
                f.seek(start)
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            continue
        if start and lines:
            lines = lines[1:]  # begun before the window: a piece of a line is no line
        out += [ln.strip() for ln in lines if ln.strip() and not _GRPC_CORE_LINE.match(ln)]
    return out


def last_log_line(path: Path, limit: int = 4096) -> str:
    """The last non-empty line of a worker log that the task wrote: usually the exception that killed it.
    The log's rotated part counts when the current one (just started) has no such line."""
    lines = _tail_lines(path, limit)
    return lines[-1] if lines else ""


def said_reason(path: Path, limit: int = 1 << 20) -> str:
    """What a worker that exited NO_RESTART wrote as its reason (freeride.core.exits): the last line of its
    log that begins with REASON_MARK, without the mark ("" if none); gRPC's threads may log on after it."""
    for line in reversed(_tail_lines(path, limit)):
        if line.startswith(REASON_MARK.strip()):
            return line.removeprefix(REASON_MARK.strip()).strip()
    return ""
