"""Worker containment in cgroup v2: every worker in a group of its own, killed as a whole.

A process can leave its process group (setsid) and clear its environment, but it cannot leave its
cgroup without write access to the cgroup tree. So each worker starts inside its own group (a shell
moves itself there, then execs the worker: nothing of the task runs outside it) and the agent kills
the whole group (`cgroup.kill`, or SIGKILL to every pid in `cgroup.procs` on kernels before 5.14) and
waits for the kernel's "populated 0" in `cgroup.events` (an EPOLLPRI wake-up on one epoll the loop
watches; no polling), then removes the group.

Where the groups live:
  - under systemd with `Delegate=yes` (the unit's cgroup is marked delegated): the agent moves itself
    into the leaf `agent/` of its own cgroup (cgroup v2's "no internal processes" rule) and puts the
    workers under `workers/`;
  - otherwise under `freeride-<hash of the state dir>/` in the agent's current cgroup, if it may
    create groups there and move processes into them (checked once at start by doing so);
  - else nowhere: `open_cgroups` says why and the launcher falls back to the process group and the
    environment mark (workers.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import select
import signal
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

# Moves the shell itself into the group whose cgroup.procs is $0, then becomes the worker.
_JOIN = 'echo 0 > "$0" && exec "$@"'
_DELEGATE_XATTRS = ("trusted.delegate", "user.delegate")  # set by systemd >= 251 on a Delegate=yes cgroup
_ROOT_PREFIX = "freeride-"  # + a hash of the state dir: one agent's tree of worker groups
_ROOT_HASH_DIGITS = 12
_ROOT_NAME = re.compile(re.escape(_ROOT_PREFIX) + f"[0-9a-f]{{{_ROOT_HASH_DIGITS}}}")  # what the sweep may take
_KILL_ROUNDS = 100  # SIGKILL rounds over cgroup.procs without cgroup.kill (a fork bomb racing the kill)


def v2_mount(mountinfo: Path = Path("/proc/self/mountinfo")) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid host)."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if " - " in line and fields[fields.index("-") + 1] == "cgroup2":
            return Path(fields[4])
    return None


def own_group(proc_cgroup: Path = Path("/proc/self/cgroup")) -> str | None:
    """This process's cgroup v2 path ("/system.slice/x.service"), from the "0::" line."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


def populated(events: Path) -> bool:
    try:
        return b"populated 1" in events.read_bytes()
    except FileNotFoundError:
        return False


class CgroupTree:
    """The directory holding one group per worker; everything here is called from the agent's loop."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.kill_file = (root / "cgroup.kill").exists()  # Linux >= 5.14; else SIGKILL pid by pid
        self.memory = "memory" in _read(root / "cgroup.subtree_control").split()  # each group has memory.current
        self._epoll: select.epoll | None = None
        self._waiting: dict[int, tuple[Path, asyncio.Future[None]]] = {}

    def describe(self) -> str:
        return f"cgroup v2 under {self.root}" + (" (memory accounted per worker)" if self.memory else "")

    def group(self, name: str) -> Path:
        """A new, empty group (a predecessor's leftover of the same name is emptied and replaced)."""
        path = self.root / name
        if path.exists():
            self.kill(path)
            _remove(path)
        try:
            path.mkdir()
        except FileNotFoundError:  # the root, empty, was swept by another agent starting (remove_stale_roots)
            path.mkdir(parents=True)
        return path

    @staticmethod
    def argv(group: Path, argv: list[str]) -> list[str]:
        """`argv` started inside `group`: the process is in it before its first instruction."""
        return ["/bin/sh", "-c", _JOIN, str(group / "cgroup.procs"), *argv]

    def kill(self, group: Path) -> None:
        """SIGKILL every process in the group and its sub-groups (a task may make its own)."""
        if self.kill_file:
            with contextlib.suppress(FileNotFoundError):
                (group / "cgroup.kill").write_text("1")
            return
        for _ in range(_KILL_ROUNDS):
            pids = self.members(group)
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    async def emptied(self, group: Path) -> None:
        """Until no process is left in the group: the kernel's notification on cgroup.events, no polling."""
        events = group / "cgroup.events"
        loop = asyncio.get_running_loop()
        if self._epoll is None:
            self._epoll = select.epoll()
            loop.add_reader(self._epoll.fileno(), self._woken)
        fd = os.open(events, os.O_RDONLY | os.O_CLOEXEC)
        done: asyncio.Future[None] = loop.create_future()
        self._waiting[fd] = (events, done)
        try:
            self._epoll.register(fd, select.EPOLLPRI)
            if not populated(events):  # emptied before the registration
                return
            await done
        finally:
            del self._waiting[fd]
            with contextlib.suppress(OSError):
                self._epoll.unregister(fd)
            os.close(fd)

    def _woken(self) -> None:
        assert self._epoll is not None
        for fd, _ in self._epoll.poll(0):
            _, done = self._waiting[fd]
            os.lseek(fd, 0, os.SEEK_SET)
            now = os.read(fd, 4096)  # (reading re-arms the notification)
            if b"populated 1" not in now and not done.done():
                done.set_result(None)

    @staticmethod
    def remove(group: Path) -> bool:
        """Remove an empty group (and its empty sub-groups); False if a process is still in it."""
        return _remove(group)

    def leftovers(self) -> list[Path]:
        """The groups here: at an agent's start, its killed predecessor's (this tree is its state directory's)."""
        return sorted(p for p in self.root.iterdir() if p.is_dir()) if self.root.is_dir() else []

    @staticmethod
    def members(group: Path) -> list[int]:
        """The pids in the group and its sub-groups now."""
        return [int(p) for d, _, _ in os.walk(group) for p in _read(Path(d) / "cgroup.procs").split()]

    def remove_empty(self) -> tuple[int, int]:
        """Remove the empty groups here (a killed agent's leftovers): (removed, still populated)."""
        removed = busy = 0
        for group in [p for p in self.root.iterdir() if p.is_dir()] if self.root.is_dir() else []:
            if _remove(group):
                removed += 1
            else:
                busy += 1
        return removed, busy

    def close(self, remove_root: bool) -> None:
        if self._epoll is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                asyncio.get_running_loop().remove_reader(self._epoll.fileno())
            self._epoll.close()
            self._epoll = None
        if remove_root:
            with contextlib.suppress(OSError):
                self.root.rmdir()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _remove(group: Path) -> bool:
    try:
        for d, _, _ in sorted(os.walk(group), key=lambda w: -len(w[0])):  # the deepest first
            os.rmdir(d)
    except FileNotFoundError:
        return True
    except OSError:  # EBUSY: still populated
        return False
    return True


def _remove_empty_roots(base: Path, keep: Path) -> None:
    """Empty trees of agents that were killed (their state dirs may never be used again); a live agent
    whose tree is empty just now makes it again at its next worker. Only what is named exactly as an agent
    names its tree (the prefix and 12 hex digits): a group of anyone else's that merely starts with the prefix is
    not ours, even empty (the suite's `freeride-test-…`, made just before a process moved into it, was swept by
    an agent starting beside it, and that move failed)."""
    for root in base.glob(f"{_ROOT_PREFIX}*"):
        if root == keep or not _ROOT_NAME.fullmatch(root.name) or not root.is_dir():
            continue
        for group in root.iterdir():
            if group.is_dir() and not _alive(group.name.rpartition("-")[2]):
                _remove(group)  # (a live agent's group may be empty for a moment before its worker moves in)
        with contextlib.suppress(OSError):  # not empty: an agent or its leftovers are still there
            root.rmdir()


def _alive(pid: str) -> bool:
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delegated(group: Path) -> bool:
    for name in _DELEGATE_XATTRS:
        with contextlib.suppress(OSError):
            if os.getxattr(group, name) == b"1":
                return True
    return False


def open_cgroups(
    state_dir: Path,
    mountinfo: Path = Path("/proc/self/mountinfo"),
    proc_cgroup: Path = Path("/proc/self/cgroup"),
) -> tuple[CgroupTree | None, str]:
    """The workers' cgroup tree, or None and why not (the caller logs which containment it uses)."""
    mount, own = v2_mount(mountinfo), own_group(proc_cgroup)
    if mount is None:
        return None, "no cgroup v2 hierarchy is mounted"
    if own is None:
        return None, "this process is in no cgroup v2 group (a cgroup v1 host)"
    base = mount / own.lstrip("/")
    try:
        if base.name == "agent" and _delegated(base.parent):  # moved there by a predecessor in this unit
            base = base.parent
        if _delegated(base):  # systemd Delegate=yes: the agent to a leaf of its own, the workers beside it
            (base / "agent").mkdir(exist_ok=True)
            (base / "agent" / "cgroup.procs").write_text(str(os.getpid()))
            root = base / "workers"
        else:
            key = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:_ROOT_HASH_DIGITS]
            root = base / f"{_ROOT_PREFIX}{key}"
            _remove_empty_roots(base, keep=root)
        root.mkdir(exist_ok=True)
        _probe(CgroupTree(root))
        _account_memory(base, root)
    except OSError as exc:
        return None, f"cannot create worker groups under {base} ({exc.strerror or exc})"
    tree = CgroupTree(root)
    removed, busy = tree.remove_empty()
    if removed or busy:
        log.info("cgroups: removed %d empty worker group(s) a previous agent left in %s%s", removed, root,
                 f"; {busy} still hold processes (killed before any task restarts)" if busy else "")
    return tree, tree.describe()


def _account_memory(base: Path, root: Path) -> bool:
    """Turn on the memory controller for the worker groups where the host lets us (it is delegated, or on
    already): each then has a memory.current, what CPU mode's memory caps read. Not possible where the
    agent shares `base` with other processes below the root (cgroup v2's "no internal processes"), or
    where memory is bound to a cgroup v1 hierarchy: the caps then read PSS (freeride.gpu.probe)."""
    for group in (base, root):
        if "memory" in _read(group / "cgroup.subtree_control").split():
            continue
        if "memory" not in _read(group / "cgroup.controllers").split():
            return False
        try:
            (group / "cgroup.subtree_control").write_text("+memory")
        except OSError:
            return False
    return True


def _probe(tree: CgroupTree) -> None:
    """Start `true` the way workers start: the only sure test that processes may be moved into a group."""
    group = tree.group(f"probe-{os.getpid()}")
    try:
        done = subprocess.run(tree.argv(group, ["true"]), capture_output=True, text=True, timeout=10, check=False)
        if done.returncode != 0:
            raise OSError(0, (done.stderr.strip().splitlines() or ["moving a process into it failed"])[-1])
    finally:
        _remove(group)
