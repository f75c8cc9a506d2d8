"""Files for pool tasks over a directory: an item id is a path under it, each output is published durably.

- `under(root, item_id, suffix)`: the path an item names, refusing ids that would leave `root`.
- `publish(path, data)`: atomic and durable before it returns. Several workers may process the same
  item at once (a lease that ran out is taken over while its first holder still works), so each
  writer has its own temporary name; the bytes are identical, and whichever rename lands last wins.
- `sweep(root)`: deletes the temporary files of writers that died mid-publish (a kill -9): a writer
  holds a lock on its own until its rename, and the kernel drops it with the process.
- `list_images(root)` and the `list` command: the items of a directory for `freeride pool create URL --items -`.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import secrets
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

#: The files `list_images` lists (case-insensitive); Pillow decodes all of them.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".tif", ".tiff", ".bmp")
TMP_SUFFIX = ".tmp"


def under(root: Path, item_id: str, suffix: str = "") -> Path:
    """`root / (item_id + suffix)`; ValueError for an id that is empty, absolute or has a '..' part."""
    parts = PurePosixPath(item_id).parts
    if not parts or item_id.startswith("/") or ".." in parts or "\0" in item_id:
        raise ValueError(f"item id {item_id!r} is not a path relative to {root}: ids must be relative paths "
                         "without '..' (as `list` prints them)")
    return root.joinpath(*parts[:-1], parts[-1] + suffix)


def publish(path: Path, data: bytes) -> None:
    """Make `path` hold `data`, complete or not at all, on disk before returning.

    Writes a temporary file of this writer's own beside it, locked until it is renamed, fsyncs it,
    renames it over `path` and fsyncs the directory (and the parent of every directory made for it),
    so neither a crash nor a power cut can leave a partial or vanished output behind an acknowledged
    item; a kill leaves only the temporary file, which `sweep` deletes.
    """
    made = _make_dirs(path.parent)
    for attempt in range(3):
        fd, tmp = _create_locked(path)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
                os.replace(tmp, path)  # the lock held until the rename: a live writer's file is never swept
            break
        except FileNotFoundError:
            # A sweep that opened the file before this writer locked it took it for a dead writer's (a window
            # of microseconds): write it again under a fresh name. Twice more at most: past that the folder is
            # going away under us, and that error is the one to see.
            if attempt == 2 or tmp.exists() or not path.parent.is_dir():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
    for directory in (path.parent, *(d.parent for d in made)):
        _fsync_dir(directory)


#: publish's temporary names: `.<name>.<12 hex digits>.tmp`, and nothing else is swept.
_TMP_NAME = re.compile(r"\..+\.[0-9a-f]{12}" + re.escape(TMP_SUFFIX))


def _create_locked(path: Path) -> tuple[int, Path]:
    """A new temporary file beside `path`, created and locked (flock, exclusive) by this writer."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}{TMP_SUFFIX}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # mode: 0o666 less the umask
            break
        except FileExistsError:  # another writer drew the same 48 random bits: draw again
            continue
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # its own new file: nobody else holds it but a sweep, for microseconds
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return fd, tmp


def sweep(root: Path) -> list[Path]:
    """Delete the temporary files `publish` left under `root` when their writer died before its rename (their
    lock went with the process; a live writer's is held, and its file kept). Only publish's names are touched.
    Returns the files deleted."""
    swept = []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            if not _TMP_NAME.fullmatch(name):
                continue
            tmp = Path(folder, name)
            try:
                fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:  # renamed by its writer meanwhile, or not a file to open
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # its writer is alive
                with contextlib.suppress(FileNotFoundError):  # by name: renamed meanwhile, the output stays
                    os.unlink(tmp)
                    swept.append(tmp)
            finally:
                os.close(fd)
    return swept


def _make_dirs(directory: Path) -> list[Path]:
    """Create `directory` and its missing parents; returns those this call created, deepest first."""
    missing = []
    for d in (directory, *directory.parents):
        if d.is_dir():
            break
        missing.append(d)
    made = []
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another worker made it first: theirs to sync
            d.mkdir()
            made.append(d)
    return made[::-1]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_images(root: Path) -> Iterator[str]:
    """Every image file under `root` (suffix in IMAGE_SUFFIXES) as a relative POSIX path, hidden files and
    directories skipped; streamed in a fixed order: a directory's files by name, then its subdirectories by name."""
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a directory")
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        base = PurePosixPath(Path(dirpath).relative_to(root).as_posix())
        for name in sorted(filenames):
            if not name.startswith(".") and name.lower().endswith(IMAGE_SUFFIXES):
                yield str(base / name)


def item_line(item_id: str) -> str:
    """The id as a line of `freeride pool create --items`: bare, or a JSON object where a bare line would be read
    otherwise (a leading '#' or '{', surrounding blanks, a line break)."""
    if item_id != item_id.strip() or item_id.startswith(("#", "{")) or "\n" in item_id or "\r" in item_id:
        return json.dumps({"id": item_id})
    return item_id


def check_src_dir(kwargs: Mapping[str, Any]) -> None:
    """For check_args at submit: a `src_dir` given must be a directory (on the submitting host)."""
    src = kwargs.get("src_dir")
    if src and not Path(str(src)).is_dir():
        raise ValueError(f"src_dir {src} is not a directory")


def cli_parser(prog: str) -> tuple[argparse.ArgumentParser, Any]:
    """A parser with the `list [DIR]` command; returns it and its subparsers, for a module to add its own commands."""
    parser = argparse.ArgumentParser(prog=prog)
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="print the image files under DIR, one item id (a relative path) a line, "
                                     "for `freeride pool create URL --items -`")
    ls.add_argument("dir", nargs="?", help="the directory to pass as the task's src_dir (default: the "
                                           "photographs bundled in scikit-image)")
    return parser, sub


def print_items(directory: str | None, default_ids: Iterable[str]) -> int:
    """The `list` command: the items of `directory` (None: `default_ids`) on stdout; the exit status."""
    try:
        for item_id in list_images(Path(directory)) if directory else default_ids:
            sys.stdout.write(item_line(item_id) + "\n")
    except OSError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    return 0
