"""The checkpoints `sidetasks.evaluate` scores: found and read off the step, copied into the model in pieces.

Reading a checkpoint (the disk, then unpickling) takes as long as the file is large: 154 MB overran a
bubble by 273 ms, and a real model's gigabytes would overrun by seconds. So `Reader` lists the directory
and reads the next checkpoint into CPU memory in a thread of its own, while the task's steps return at
once; the step then copies it into the model `pieces()` at a time, each a unit of its step budget, as
bounded as an evaluation batch. A file is checked against the model's names and shapes in the thread
too, so one that does not fit is skipped (and tried again when it changes) before any piece is copied.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)
SUFFIXES = (".pt", ".pth", ".ckpt")
PIECE_BYTES = 4 << 20  # one copy unit: about a millisecond from host memory, on the CPU or to a GPU


@dataclass(frozen=True)
class Loaded:
    name: str
    mtime_ns: int
    state: dict[str, torch.Tensor]  # on the CPU, names and shapes those of the model


class Reader:
    """Finds and reads the oldest checkpoint in `directory` not evaluated yet, one read at a time, off the step."""

    def __init__(self, directory: Path, shapes: Mapping[str, torch.Size],
                 names: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
        """`names`: the model's own renaming of a checkpoint's state to its `state_dict()` names (a Hugging Face
        model wrapped by sidetasks.hf reads the wrapped model's own names too)."""
        self.directory = directory
        self._shapes = dict(shapes)
        self._names = names
        self.listings = 0
        self._unreadable: set[str] = set()  # name@mtime@size of files that did not load: tried when they change
        self._done = threading.Event()  # set while no read is under way
        self._done.set()
        self._thread: threading.Thread | None = None
        self._result: Loaded | None = None
        self._error: BaseException | None = None

    def poll(self, evaluated: frozenset[str]) -> Loaded | None:
        """The checkpoint read, once a read has ended with one; else None, and a new read (one listing) begins
        when none is under way. An error of the read (the directory gone) is raised here."""
        if self._thread is not None and not self._done.is_set():
            return None
        found, error = self._result, self._error
        self._result = self._error = None
        if error is not None:
            self._thread = None
            raise error
        if found is None:
            self._start(evaluated)
        else:
            self._thread = None
        return found

    def wait(self, timeout_s: float) -> bool:
        """Block until the read under way ends (tests, and a resume outside any window); True if it did."""
        return self._done.wait(timeout_s)

    def _start(self, evaluated: frozenset[str]) -> None:
        self._done.clear()
        # A daemon thread: a pause or cancel must not wait at exit for a multi-GB read it no longer needs.
        self._thread = threading.Thread(target=self._run, args=(evaluated,), name="evaluate-reader", daemon=True)
        self._thread.start()

    def _run(self, evaluated: frozenset[str]) -> None:
        try:
            self._result = self._next(evaluated)
        except BaseException as exc:  # handed to the step, which raises it as the task's own
            self._error = exc
        finally:
            self._done.set()

    def _next(self, evaluated: frozenset[str]) -> Loaded | None:
        self.listings += 1
        found = []
        for f in self.directory.iterdir():
            if f.suffix in SUFFIXES and not f.name.startswith("."):
                try:
                    st = f.stat()
                except FileNotFoundError:  # renamed or removed since the listing
                    continue
                key = f"{f.name}@{st.st_mtime_ns}"
                if key not in evaluated and f"{key}@{st.st_size}" not in self._unreadable:
                    found.append((st.st_mtime_ns, f.name, f, st.st_size))
        for mtime_ns, name, f, size in sorted(found):
            state = self.read(f)
            if state is not None:
                return Loaded(name, mtime_ns, state)
            self._unreadable.add(f"{name}@{mtime_ns}@{size}")
        return None

    def read(self, path: Path) -> dict[str, torch.Tensor] | None:
        """The model's state in `path`, on the CPU; None (said once) when it does not load or does not fit."""
        try:
            obj: Any = torch.load(path, map_location="cpu", weights_only=True)
            state = obj["model"] if isinstance(obj, dict) and "model" in obj else obj
            if self._names is not None and isinstance(state, dict):
                state = self._names(state)
            problem = self._misfit(state)
            if problem:
                raise ValueError(problem)
        except Exception as exc:  # a file still being written, or another model's: said once, tried when it changes
            log.warning("checkpoint %s does not load (%s: %s); tried again when it changes", path,
                        type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
            return None
        return dict(state)

    def _misfit(self, state: object) -> str:
        if not isinstance(state, Mapping):
            return f"it holds a {type(state).__name__}, not a state dict"
        missing, unexpected = sorted(set(self._shapes) - set(state)), sorted(set(state) - set(self._shapes))
        if missing or unexpected:
            return f"its names are not the model's (missing {missing[:3]}, unexpected {unexpected[:3]})"
        for name, shape in self._shapes.items():
            value = state[name]
            if not isinstance(value, torch.Tensor) or value.shape != shape:
                got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                return f"{name} is {got}, the model's is {tuple(shape)}"
        return ""


def pieces(target: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor],
           piece_bytes: int = PIECE_BYTES) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(destination, source) pairs of at most about `piece_bytes` that together copy `state` into `target` (the
    model's own `state_dict()`, whose tensors share the parameters' storage). A large contiguous tensor is cut
    into slices of its flat view; a non-contiguous one is copied whole."""
    for name, dest in target.items():
        src = state[name]
        step = max(1, piece_bytes // max(1, dest.element_size()))
        if not dest.is_contiguous() or dest.numel() <= step:
            yield dest, src
            continue
        flat_dest, flat_src = dest.view(-1), src.reshape(-1)
        for at in range(0, dest.numel(), step):
            yield flat_dest[at: at + step], flat_src[at: at + step]
