"""freeride.core.private: what the agent creates in its state directory is its owner's alone, whatever the umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from freeride.core.private import create_private, private_dir, tighten


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_private_directory_and_every_parent_it_creates_are_owner_only(tmp_path: Path) -> None:
    """`Path.mkdir(parents=True, mode=0o700)` gives missing parents the umask's mode (0755 here): `state/run`
    of `state/run/workers` was left open to others that way."""
    old = os.umask(0o022)
    try:
        made = private_dir(tmp_path / "state" / "run" / "workers")
        f = create_private(made / "record")
        os.close(f)
    finally:
        os.umask(old)
    assert [mode(p) for p in (tmp_path / "state", tmp_path / "state" / "run", made)] == [0o700] * 3
    assert mode(made / "record") == 0o600


def test_an_existing_directory_keeps_its_mode_and_a_file_in_the_way_is_an_error(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o750)
    os.chmod(shared, 0o750)
    assert private_dir(shared / "inner").parent == shared and mode(shared) == 0o750
    assert mode(shared / "inner") == 0o700
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError):
        private_dir(tmp_path / "file")


def test_tighten_takes_group_and_other_bits_off_everything_and_follows_no_symlink(tmp_path: Path) -> None:
    """A state directory made wide (by hand, by an older freeride) is tightened at start: every path below it."""
    root = tmp_path / "state"
    (root / "logs").mkdir(parents=True)
    (root / "logs" / "task-1.log").write_text("x")
    (root / "secrets").mkdir()
    (root / "secrets" / "task-1.json").write_text("{}")
    outside = tmp_path / "outside"
    outside.write_text("not ours")
    (root / "link").symlink_to(outside)
    for path in (root, root / "logs", root / "secrets"):
        os.chmod(path, 0o755)
    for path in (root / "logs" / "task-1.log", root / "secrets" / "task-1.json", outside):
        os.chmod(path, 0o664)
    changed = dict(tighten(root))
    assert {p: mode(p) for p in (root, root / "logs", root / "secrets")} == dict.fromkeys(
        (root, root / "logs", root / "secrets"), 0o700)
    assert mode(root / "logs" / "task-1.log") == mode(root / "secrets" / "task-1.json") == 0o600
    assert mode(outside) == 0o664, "a symlink was followed out of the state directory"
    assert changed[root / "secrets" / "task-1.json"] == 0o664 and root / "link" not in changed
    assert tighten(root) == [], "a second pass changed what the first had tightened"
