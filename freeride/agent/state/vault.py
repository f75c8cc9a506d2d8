"""Task arguments that hold a password (a pool's `redis://:PASSWORD@…`), kept out of the state database.

The database row of such a task stores the argument masked (`***`, as every answer shows it); the value
itself goes to `secrets/task-N.json` beside the database, 0600 in a 0700 directory, removed with the task.
The agent reads it back when it loads its tasks, so a restarted worker still gets the whole URL; a file
that cannot be read fails its task alone (`SecretFileError`, the reason naming the file), never the start.

What this protects against: a copy of the database leaving the host or the agent's user (a bug report, a
backup, `sqlite3 freeride.db .dump` pasted into a ticket, a support bundle) carries no password. What it
does not: anyone who can read the agent's state directory (its user, root) reads the secrets file, as
the worker must; freeride keeps no key anywhere that user could not read too.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from freeride.core.private import create_private, private_dir
from freeride.core.secrets import mask


class SecretFileError(Exception):
    """A task's secrets file exists but does not hold its arguments (a torn write, a disk error, an edit)."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why


def split(args: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the arguments as the database stores them, with each password masked; the arguments that held one)."""
    secret = {key: value for key, value in args.items() if mask(value) != value}
    return {key: mask(value) for key, value in args.items()}, secret


class SecretFiles:
    """One small JSON file per task that has secret arguments, in an owner-only directory."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _path(self, task_id: str) -> Path:
        return self.folder / f"task-{int(task_id)}.json"

    def write(self, task_id: str, secret: dict[str, str]) -> None:
        """Store `secret` for the task, whole or not at all (temporary file, fsync, rename); OSError if it
        cannot. An empty `secret` removes the task's file."""
        if not secret:
            self.remove([task_id])
            return
        private_dir(self.folder)
        path = self._path(task_id)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = create_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(secret, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise

    def read(self, task_id: str) -> dict[str, str] | None:
        """The task's secret arguments; None when it has no file; SecretFileError when it cannot be read."""
        path = self._path(task_id)
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
            raise SecretFileError(path, str(exc)) from exc
        if not isinstance(data, dict):
            raise SecretFileError(path, f"it holds a JSON {type(data).__name__}, not an object")
        return {str(key): str(value) for key, value in data.items()}

    def unreadable_reason(self, task_id: str, exc: SecretFileError) -> str:
        """The reason a task whose secrets file cannot be read is FAILED with: which file, what to do."""
        return (f"its secret arguments cannot be read from {exc.path} ({exc.why}), so it cannot run: submit it "
                f"again with its arguments; `freeride rm {task_id}` removes this one and that file")

    def remove(self, task_ids: list[str]) -> None:
        for task_id in task_ids:
            with contextlib.suppress(FileNotFoundError):
                self._path(task_id).unlink()
