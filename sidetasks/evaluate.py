"""Evaluation in the bubbles: every new checkpoint of a training run, scored on held-out data, one line each.

Evaluate watches `checkpoints` (a directory) and, for each checkpoint that appears there, loads it into
the model (`model=` as in `sidetasks.models`) and computes the loss over `data` in bubble-sized chunks
(a unit is one batch; a step runs as many as fit, `freeride.StepBudget`), then appends one JSON line to
`out`: `{"checkpoint", "mtime_ns", "loss", "perplexity" | "accuracy", "items", "tokens"}`.

Watching without busy-polling: the directory is listed once per step while no evaluation is under way
(and when one ends), i.e. at most once per unit of work the agent grants; a step that finds nothing new
returns at once. A checkpoint is a file `*.pt`, `*.pth` or `*.ckpt` (not hidden, not `*.tmp`) holding a
state dict or a dict with a "model" entry; it is known by name and modification time, so one rewritten
in place is evaluated again. One that does not load (still being written without a rename) is tried
again once it changes. The lines already in `out` are never evaluated twice; the checkpoint holds the
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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from freeride import IterativeTask, StepBudget
from sidetasks.jsonl import Lines
from sidetasks.models import check_model, lm_loss, load_model

log = logging.getLogger(__name__)
_SUFFIXES = (".pt", ".pth", ".ckpt")
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
        self.listings = 0
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
        self.unreadable: set[str] = set()
        with torch.no_grad():
            self._score(0)  # warm-up: the first real unit is then as fast as the rest

    # -- watching ------------------------------------------------------------------------------------------------
    def _next_checkpoint(self) -> tuple[Path, int] | None:
        """The oldest checkpoint not evaluated yet (one listing of the directory)."""
        self.listings += 1
        found = []
        for f in self.dir.iterdir():
            if f.suffix in _SUFFIXES and not f.name.startswith("."):
                try:
                    st = f.stat()
                except FileNotFoundError:  # renamed or removed since the listing
                    continue
                key = f"{f.name}@{st.st_mtime_ns}"
                if key not in self.evaluated and f"{key}@{st.st_size}" not in self.unreadable:
                    found.append((st.st_mtime_ns, f.name, f, st.st_size))
        for mtime_ns, _, f, size in sorted(found):
            if self._load(f):
                return f, mtime_ns
            self.unreadable.add(f"{f.name}@{mtime_ns}@{size}")
        return None

    def _load(self, path: Path) -> bool:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            self.model.load_state_dict(state["model"] if isinstance(state, dict) and "model" in state else state)
        except Exception as exc:  # a file still being written, or another model's: said once, tried when it changes
            log.warning("checkpoint %s does not load (%s: %s); tried again when it changes", path,
                        type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
            return False
        self.model.eval()
        return True

    # -- the work ------------------------------------------------------------------------------------------------
    def step(self) -> None:
        start = time.perf_counter()
        try:
            if self.current is None:
                found = self._next_checkpoint()
                if found is None:
                    return  # nothing new: listed again at the next step
                self.current = {"name": found[0].name, "mtime_ns": found[1], "pos": 0, "loss": 0.0, "n": 0,
                                "correct": 0}
            self.budget.start(self.context.remaining_s(), window=self.context.remaining_s)
            with torch.no_grad():
                while True:
                    self._unit()
                    if self.current is None or not self.budget.another():
                        return
        finally:
            self.busy_s += time.perf_counter() - start

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
        p = {"checkpoints": float(len(self.evaluated)), "listings": float(self.listings),
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

    def teardown(self) -> None:
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
        if same and self._load(path):  # else it changed or went: found again (or not) by the next listing
            self.current = dict(cur)
