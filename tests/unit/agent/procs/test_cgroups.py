"""freeride.agent.procs.cgroups against the host's real cgroup v2 tree (skipped where it is not writable),
and its parsing against made-up /proc files."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from freeride.agent.procs.cgroups import CgroupTree, open_cgroups, own_group, v2_mount

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


def test_the_v2_mount_and_own_group_are_read_from_proc(tmp_path: Path) -> None:
    (tmp_path / "mountinfo").write_text(HYBRID)
    (tmp_path / "cgroup").write_text("4:memory:/x\n0::/system.slice/freeride-agent@0.service\n")
    assert v2_mount(tmp_path / "mountinfo") == Path("/sys/fs/cgroup/unified")
    assert own_group(tmp_path / "cgroup") == "/system.slice/freeride-agent@0.service"
    (tmp_path / "v1").write_text("4:memory:/x\n")
    assert own_group(tmp_path / "v1") is None
    tree, why = open_cgroups(tmp_path, mountinfo=tmp_path / "v1")
    assert tree is None and "no cgroup v2" in why


@pytest.fixture
def base() -> Iterator[Path]:
    """A fresh group directly under this process's own cgroup, if this host lets us make one."""
    mount, own = v2_mount(), own_group()
    if mount is None or own is None:
        pytest.skip("no cgroup v2 hierarchy here")
    path = mount / own.lstrip("/") / f"freeride-test-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as exc:
        pytest.skip(f"cgroups not writable here: {exc}")
    yield path
    for d, _, _ in sorted(os.walk(path), key=lambda w: -len(w[0])):
        CgroupTree(Path(d)).kill(Path(d))
        os.rmdir(d)


def _start(tree: CgroupTree, group: Path) -> subprocess.Popen[bytes]:
    """A shell in `group` that starts an escapee (its own session, no environment) and a sub-group's process;
    "ready" once that process is in the sub-group (it says so itself, after its move)."""
    script = ("setsid env -i sleep 1000 & mkdir \"$G/sub\" && sh -c 'echo 0 > \"$G/sub/cgroup.procs\" && "
              "echo ready && exec sleep 1000' & exec sleep 1000")
    return subprocess.Popen(tree.argv(group, ["sh", "-c", script]), env={**os.environ, "G": str(group)},
                            stdout=subprocess.PIPE)


@pytest.mark.parametrize("kill_file", [True, False])
def test_a_group_is_killed_whole_and_removed(base: Path, kill_file: bool) -> None:
    async def main() -> None:
        tree = CgroupTree(base)
        tree.kill_file = kill_file  # False: the pid-by-pid kill of kernels before 5.14
        group = tree.group("task-1-1-1")
        proc = _start(tree, group)
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        # What makes this a test of the sub-groups' kill: a process is in the sub-group, the escapee in the group.
        assert (group / "sub" / "cgroup.procs").read_text().split() and (group / "cgroup.procs").read_text().split()
        tree.kill(group)
        await asyncio.wait_for(tree.emptied(group), 10)
        assert tree.remove(group) and not group.exists()
        assert proc.wait(10) == -9
        tree.close(remove_root=False)

    asyncio.run(main())


def test_a_delegated_cgroup_gets_an_agent_leaf_and_a_workers_tree(base: Path, tmp_path: Path) -> None:
    """systemd's Delegate=yes marks the unit's cgroup; an agent in it moves itself into agent/."""
    os.setxattr(base, "trusted.delegate", b"1")
    mount = v2_mount()
    assert mount is not None
    (tmp_path / "cgroup").write_text(f"0::/{base.relative_to(mount)}\n")
    code = ("import json, sys; from pathlib import Path; from freeride.agent.procs.cgroups import open_cgroups; "
            "t, why = open_cgroups(Path(sys.argv[1]), proc_cgroup=Path(sys.argv[2])); "
            "print(json.dumps([str(t.root) if t else None, why, open('/proc/self/cgroup').read()]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "state"), str(tmp_path / "cgroup")],
                         capture_output=True, text=True, check=True)
    root, why, own = json.loads(out.stdout)
    assert root == str(base / "workers"), why
    assert own.strip().endswith(f"/{base.name}/agent")  # the agent left the unit's cgroup for its leaf


def test_an_agent_sweeps_only_trees_named_as_an_agent_names_its_own(base: Path, tmp_path: Path) -> None:
    """A starting agent removes the empty trees of agents that died beside it, and nothing else whose name merely
    starts the same, even empty: this file's own `freeride-test-…` group was swept by an agent started in
    another test, between its creation and a process's move into it."""
    mount = v2_mount()
    assert mount is not None
    dead = base / "freeride-0123456789ab"  # a killed agent's tree: its task group's agent pid is gone
    (dead / "task-1-1-999999999").mkdir(parents=True)
    other = base / "freeride-test-notmine"
    (other / "agent").mkdir(parents=True)  # empty, as a group is until its first process moves in
    (tmp_path / "cgroup").write_text(f"0::/{base.relative_to(mount)}\n")
    code = ("import sys; from pathlib import Path; from freeride.agent.procs.cgroups import open_cgroups; "
            "t, why = open_cgroups(Path(sys.argv[1]), proc_cgroup=Path(sys.argv[2])); print(t and t.root, why)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "state"), str(tmp_path / "cgroup")],
                         capture_output=True, text=True, check=True)
    assert out.stdout.startswith(str(base / "freeride-")), out.stdout  # its own tree, beside the others
    assert not dead.exists()
    assert (other / "agent").is_dir()
