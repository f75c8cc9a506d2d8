"""Evaluation in the bubbles: every new checkpoint of a training run, scored on held-out data, one line each.

Evaluate watches `checkpoints` (a directory) and, for each checkpoint that appears there, loads it into
the model (`model=` as in `sidetasks.models`) and computes the loss over `data` in bubble-sized chunks
(a unit is one batch; a step runs as many as fit, `freeride.StepBudget`), then appends one JSON line to
`out`: `{"checkpoint", "mtime_ns", "loss", "perplexity" | "accuracy", "items", "tokens"}`.

Watching without busy-polling: the directory is listed at most once per step while no evaluation is under
way, in a thread of its own (`sidetasks.checkpoints.Reader`), which also reads the checkpoint it finds into
CPU memory: a step never waits for the disk or the unpickling (a whole checkpoint read inside one step
overran its bubble by the file's size), it returns at once until the read is done, then copies the
state into the model in pieces of a few MiB, each a unit of its step budget like a batch. The step time
the task declares (`min_step_s`) is learnt from those units alone. A checkpoint is a file `*.pt`, `*.pth`
or `*.ckpt` (not hidden, not `*.tmp`) holding a state dict or a dict with a "model" entry; it is known by
name and modification time, so one rewritten in place is evaluated again. One that does not load (still
being written without a rename), or whose names and shapes are not the model's, is tried again once it
changes. The lines already in `out` are never evaluated twice; the checkpoint holds the
evaluation under way (which file, how far, the sums), so a pause or crash repeats at most a few units.

Data:
- a directory of images, one subdirectory per class (sorted names are the labels): a classifier
  `forward(images [B, 3, S, S]) -> logits [B, classes]`, images resized to `image_size` (S), RGB in [0, 1];
- a torch file (`.pt`) holding {"x": inputs, "y": labels}: a classifier on those inputs;
- token ids: a `.npy` array or a `.pt` tensor (1-D: cut into rows of `seq_len + 1`; 2-D: one row each), or
  any other file, its bytes as ids (byte-level): a language model (the protocol of `sidetasks.models`),
  scored by next-token cross-entropy; perplexity = exp(loss).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from freeride import IterativeTask, StepBudget
from sidetasks.checkpoints import Loaded, Reader, pieces
from sidetasks.jsonl import Lines
from sidetasks.models import check_model, lm_loss, load_model

log = logging.getLogger(__name__)
_IMAGES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


def load_data(path: str, seq_len: int, image_size: int) -> tuple[str, torch.Tensor, torch.Tensor | None]:
    """("lm", rows, None) or ("classify", inputs, labels) from `path` (see the module's docstring)."""
    p = Path(path)
    if p.is_dir():
        from PIL import Image

        classes = sorted(d for d in p.iterdir() if d.is_dir() and not d.name.startswith("."))
        xs, ys = [], []
        for label, d in enumerate(classes):
            for f in sorted(f for f in d.rglob("*") if f.suffix.lower() in _IMAGES):
                with Image.open(f) as img:
                    small = img.convert("RGB").resize((image_size, image_size), Image.Resampling.BILINEAR)
                xs.append(torch.from_numpy(np.asarray(small, dtype=np.float32) / 255.0).permute(2, 0, 1))
                ys.append(label)
        if not xs:
            raise ValueError(f"data={path}: no images in class subdirectories")
        return "classify", torch.stack(xs), torch.tensor(ys, dtype=torch.long)
    if not p.is_file():
        raise ValueError(f"data={path}: no such file or directory")
    if p.suffix == ".pt":
        obj = torch.load(p, map_location="cpu", weights_only=True)
        if isinstance(obj, dict):
            if not {"x", "y"} <= set(obj):
                raise ValueError(f"data={path}: a dict needs 'x' (inputs) and 'y' (labels)")
            return "classify", obj["x"], obj["y"].long()
        ids = obj
    elif p.suffix == ".npy":
        ids = torch.from_numpy(np.load(p).astype(np.int64))
    else:
        ids = torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8)
    ids = ids.long()
    if ids.dim() == 1:
        rows = ids.numel() // (seq_len + 1)
        if rows == 0:
            raise ValueError(f"data={path}: {ids.numel()} ids, fewer than seq_len + 1 = {seq_len + 1}")
        ids = ids[: rows * (seq_len + 1)].view(rows, seq_len + 1)
    return "lm", ids, None


class Evaluate(IterativeTask):
    """Scores each new checkpoint in `checkpoints` on `data`; one JSON line per checkpoint in `out`."""

    mem_limit_bytes = 1024 * 2**20

    def __init__(self, checkpoints: str = "", data: str = "", out: str = "",
                 model: str = "sidetasks.models:byte_decoder", batch: int = 8, seq_len: int = 128,
                 image_size: int = 32, count: int = 0, device: str = "cpu", max_step_ms: float = 10.0,
                 threads: int = 1) -> None:
        if batch < 1 or seq_len < 1 or image_size < 1 or count < 0 or max_step_ms <= 0:
            raise ValueError("need batch, seq_len, image_size, max_step_ms > 0 and count >= 0")
        self.dir_arg, self.data_arg, self.out_arg, self.model_arg = checkpoints, data, out, model
        self.batch, self.seq_len, self.image_size, self.count = batch, seq_len, image_size, count
        self.device_arg, self.threads = device, threads
        self.budget = StepBudget(max_step_ms / 1e3)
        self.current: dict[str, Any] | None = None  # the evaluation under way
        self._copying: tuple[Loaded, Iterator[tuple[torch.Tensor, torch.Tensor]]] | None = None  # read, going in
        self._unit_s: deque[float] = deque(maxlen=64)  # recent units (batches, copy pieces): min_step_s
        self.busy_s = 0.0

    @classmethod
    def check_args(cls, **kwargs: Any) -> None:
        if not kwargs.get("checkpoints") or not Path(str(kwargs["checkpoints"])).is_dir():
            raise ValueError(f"checkpoints={kwargs.get('checkpoints', '')!r} is not a directory; pass the directory "
                             "the training run saves its checkpoints in")
        if not kwargs.get("data"):
            raise ValueError("pass data=PATH (token ids, a .pt tensor file, or a directory of images by class)")
        load_data(str(kwargs["data"]), int(kwargs.get("seq_len", 128)), int(kwargs.get("image_size", 32)))
        check_model(str(kwargs.get("model", "sidetasks.models:byte_decoder")))

    def setup(self) -> None:
        device = torch.device(self.context.device if self.device_arg == "auto" else self.device_arg)
        if device.type == "cpu" and self.threads > 0:
            torch.set_num_threads(self.threads)
        self.device = device
        self.budget.track(device)  # on a GPU: one unit's kernels in flight at most
        self.model = load_model(self.model_arg, "", device)
        self.kind, x, y = load_data(self.data_arg, self.seq_len, self.image_size)
        self.x, self.y = x.to(device), (y.to(device) if y is not None else None)
        self.dir = Path(self.dir_arg)
        out = Path(self.out_arg) if self.out_arg else Path(self.context.checkpoint_path).with_suffix(".evals.jsonl")
        self.lines = Lines(out)
        self.evaluated = {f"{r['checkpoint']}@{r['mtime_ns']}" for r in self.lines.existing}
        self.reader = Reader(self.dir, {k: v.shape for k, v in self.model.state_dict().items()},
                             getattr(self.model, "own_names", None))
        with torch.no_grad():
            self._score(0)  # warm-up: the first real unit is then as fast as the rest

    # -- the work ------------------------------------------------------------------------------------------------
    def step(self) -> None:
        start = time.perf_counter()
        try:
            if self.current is None and self._copying is None:
                found = self.reader.poll(frozenset(self.evaluated))
                if found is None:
                    return  # nothing new, or still being read: at once, holding the window no longer
                self._copying = (found, pieces(self.model.state_dict(), found.state))
            self.budget.start(self.context.remaining_s(), window=self.context.remaining_s)
            with torch.no_grad():
                while True:
                    began = time.perf_counter()
                    if self._copying is not None:
                        self._copy_piece()
                    else:
                        self._unit()
                    self._unit_s.append(time.perf_counter() - began)
                    if (self.current is None and self._copying is None) or not self.budget.another():
                        return
        finally:
            self.busy_s += time.perf_counter() - start

    def _copy_piece(self) -> None:
        assert self._copying is not None
        found, todo = self._copying
        piece = next(todo, None)
        if piece is not None:
            piece[0].copy_(piece[1])
            return
        self._copying = None  # all in: the evaluation begins with the next unit
        self.model.eval()
        self.current = {"name": found.name, "mtime_ns": found.mtime_ns, "pos": 0, "loss": 0.0, "n": 0, "correct": 0}

    def min_step_s(self) -> float | None:
        """One unit (a batch, or a piece of a checkpoint going in): the median of the recent ones, half again for
        the odd slow one. Steps that wait for a read or find nothing are no units: they never count."""
        if len(self._unit_s) < 5:
            return None
        return 1.5 * sorted(self._unit_s)[len(self._unit_s) // 2]

    def _unit(self) -> None:
        cur = self.current
        assert cur is not None
        loss, n, correct = self._score(cur["pos"])
        cur["loss"] += loss
        cur["n"] += n
        cur["correct"] += correct
        cur["pos"] += self.batch
        if cur["pos"] >= len(self.x):
            self._finish(cur)

    def _score(self, pos: int) -> tuple[float, int, int]:
        """Summed loss, its count (tokens or items) and right answers over the batch at `pos`."""
        x = self.x[pos: pos + self.batch]
        if self.kind == "lm":
            loss, n = lm_loss(self.model, x)
            return loss, n, 0
        assert self.y is not None
        y = self.y[pos: pos + self.batch]
        logits = self.model(x)
        return float(F.cross_entropy(logits.float(), y, reduction="sum")), len(y), int((logits.argmax(1) == y).sum())

    def _finish(self, cur: dict[str, Any]) -> None:
        mean = cur["loss"] / cur["n"]
        record: dict[str, Any] = {"checkpoint": cur["name"], "mtime_ns": cur["mtime_ns"], "loss": mean}
        if self.kind == "lm":
            record |= {"perplexity": math.exp(min(mean, 700.0)), "tokens": cur["n"], "items": len(self.x)}
        else:
            record |= {"accuracy": cur["correct"] / cur["n"], "items": cur["n"]}
        self.lines.append(record)
        self.evaluated.add(f"{cur['name']}@{cur['mtime_ns']}")
        self.last = record
        self.current = None

    def is_done(self) -> bool:
        return 0 < self.count <= len(self.evaluated)

    def progress(self) -> Mapping[str, float]:
        p = {"checkpoints": float(len(self.evaluated)), "listings": float(self.reader.listings),
             "busy_s": self.busy_s}
        if self.current is not None:
            p["current_done"] = min(1.0, self.current["pos"] / len(self.x))
        last = getattr(self, "last", None)
        if last is not None:
            p["loss"] = float(last["loss"])
            p["perplexity" if "perplexity" in last else "accuracy"] = float(last.get("perplexity",
                                                                                      last.get("accuracy", 0.0)))
        if self.count:
            p["done"] = min(1.0, len(self.evaluated) / self.count)
        return p

    def teardown(self) -> None:  # a read under way is left to its daemon thread: nothing waits for it
        lines = getattr(self, "lines", None)
        if lines is not None:
            lines.close()

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def state_dict(self) -> Mapping[str, Any]:
        self.lines.sync()
        return {"current": dict(self.current) if self.current is not None else None, "busy_s": self.busy_s}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.busy_s = float(state["busy_s"])
        cur = state["current"]
        if cur is None or f"{cur['name']}@{cur['mtime_ns']}" in self.evaluated:
            return
        path = self.dir / cur["name"]
        try:
            same = path.stat().st_mtime_ns == cur["mtime_ns"]
        except FileNotFoundError:
            same = False
        read = self.reader.read(path) if same else None  # outside any window: before the worker is ready
        if read is not None:  # else it changed or went: found again (or not) by the next listing
            self.model.load_state_dict(read)
            self.model.eval()
            self.current = dict(cur)
