"""Files only the agent's user may read: the state directory holds task arguments (a pool's Redis URL with its
password), checkpoints and logs. Directories are 0700, files 0600, whatever the umask; an existing tree
with wider modes is tightened."""

from __future__ import annotations

import os
import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600
_OPEN_TO_OTHERS = 0o077


def private_dir(path: Path) -> Path:
    """`path` (and missing parents) as a directory only its owner may enter; an existing one keeps its mode.
    (`Path.mkdir(parents=True, mode=...)` gives the missing parents the umask's mode, not `mode`: each is made here.)"""
    missing = []
    at = path
    while not at.exists() and at != at.parent:
        missing.append(at)
        at = at.parent
    for directory in reversed(missing):
        directory.mkdir(mode=DIR_MODE, exist_ok=True)
    if not path.is_dir():
        path.mkdir(mode=DIR_MODE, exist_ok=True)  # (raises FileExistsError for a file in its place)
    return path


def create_private(path: Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_APPEND) -> int:
    """A descriptor of `path` opened with `flags`; a file it creates is born 0600 (close-on-exec)."""
    return os.open(path, flags | os.O_CLOEXEC, FILE_MODE)


def tighten(root: Path) -> list[tuple[Path, int]]:
    """Take group and other permissions off `root` and everything under it (symlinks are not followed);
    returns each path changed with its old mode. A path that vanished meanwhile is skipped."""
    changed: list[tuple[Path, int]] = []

    def fix(path: Path) -> None:
        try:
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode) or not stat.S_IMODE(mode) & _OPEN_TO_OTHERS:
                return
            os.chmod(path, stat.S_IMODE(mode) & ~_OPEN_TO_OTHERS)
        except FileNotFoundError:
            return
        changed.append((path, stat.S_IMODE(mode)))

    fix(root)
    for top, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            fix(Path(top) / name)
    return changed
