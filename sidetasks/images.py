"""Thumbnails: resize and watermark a stream of real photographs, each written exactly once.

The photographs are the ones bundled inside the scikit-image wheel (`skimage/data/*.png|jpg`, read
from disk by path: nothing is downloaded). Image i of the stream is photograph i mod 11 under a
crop, a quarter turn and a mirror drawn from a generator seeded by (seed, i), so the stream is as
long as `images` and the same every run. Each output is encoded deterministically (PNG, fixed
compression, no metadata) and published atomically (temporary file, rename); the images are
fsynced when the task checkpoints, before the checkpoint that counts them is written; the
checkpoint holds only how many images are done. After a pause, a crash or a kill -9 the task
resumes at the checkpoint: an image published after the last checkpoint is found complete on disk
and kept, an unfinished temporary file is deleted and the image made again; so no image is lost
or written twice, and the outputs are byte-identical to an uninterrupted run.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from freeride import IterativeTask
from sidetasks.budget import StepBudget

#: Photographs (not drawings or test patterns) that ship in the scikit-image wheel itself.
PHOTOS = (
    "astronaut.png", "camera.png", "coffee.png", "chelsea.png", "rocket.jpg", "hubble_deep_field.jpg",
    "retina.jpg", "coins.png", "moon.png", "motorcycle_left.png", "ihc.png",
)
_MANIFEST = ".thumbnails.json"
_TMP_SUFFIX = ".tmp"


def photo_dir() -> Path:
    import skimage

    return Path(skimage.__file__).parent / "data"


def load_photos() -> list[Image.Image]:
    """The bundled photographs as RGB images (grey ones repeated to three channels)."""
    import skimage.io

    photos = []
    for name in PHOTOS:
        path = photo_dir() / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: this scikit-image wheel does not bundle {name}")
        img = np.asarray(skimage.io.imread(path))
        if img.ndim == 2:
            img = np.repeat(img[:, :, None], 3, axis=2)
        photos.append(Image.fromarray(np.ascontiguousarray(img[:, :, :3])))
    return photos


class Thumbnails(IterativeTask):
    """Writes `images` watermarked thumbnails (longest side `size` px) to `out_dir`; progress: images done."""

    # Measured peak resident set: ~110 MiB (the eleven photographs decoded, ~25 MiB, plus Python and Pillow).
    mem_limit_bytes = 256 * 2**20

    def __init__(self, images: int = 1000, size: int = 128, out_dir: str = "", seed: int = 0,
                 watermark: str = "freeride", device: str = "cpu", max_step_ms: float = 10.0) -> None:
        if images < 1 or size < 8 or max_step_ms <= 0:
            raise ValueError("need images >= 1, size >= 8 and max_step_ms > 0")
        # `device` is accepted like every bundled task's, but the work (resampling, drawing, PNG
        # encoding with Pillow) runs on the CPU whatever it says: that keeps the bytes identical.
        self.device_arg = device
        self.images, self.size, self.out_dir_arg, self.seed = images, size, out_dir, seed
        self.watermark = watermark
        self.budget = StepBudget(max_step_ms / 1e3)
        self.done = 0

    # -- lifecycle -------------------------------------------------------------------------------
    def setup(self) -> None:
        self.out_dir = Path(self.out_dir_arg) if self.out_dir_arg else self._default_out_dir()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._unsynced: list[Path] = []
        self._claim_out_dir()
        for stale in self.out_dir.glob(f".*{_TMP_SUFFIX}"):  # a write a crash cut short: made again
            stale.unlink()
        self.photos = load_photos()
        self.font = ImageFont.load_default(size=max(8, self.size // 10))
        self.done = 0
        self.render(0)  # warm-up (font rasteriser, codecs): a slow first step would set freeride's estimate

    def _default_out_dir(self) -> Path:
        ckpt = self.context.checkpoint_path
        if not ckpt:
            raise ValueError("no out_dir given and the task has no checkpoint path to put its outputs beside")
        path = Path(ckpt)
        return path.with_name(path.stem + "-thumbnails")

    def _claim_out_dir(self) -> None:
        """Refuse a directory holding another configuration's thumbnails: they would be kept as if ours."""
        params = {"images": self.images, "size": self.size, "seed": self.seed, "watermark": self.watermark,
                  "photos": list(PHOTOS)}
        manifest = self.out_dir / _MANIFEST
        if manifest.exists():
            if json.loads(manifest.read_text()) != params:
                raise ValueError(f"{self.out_dir} holds thumbnails made with other arguments; pass another out_dir")
            return
        self._publish(manifest, json.dumps(params, sort_keys=True).encode())

    def step(self) -> None:
        self.budget.start(self.context.remaining_s())
        while True:
            self._make(self.done)
            self.done += 1
            if self.is_done() or not self.budget.another():
                return

    def is_done(self) -> bool:
        return self.done >= self.images

    # -- the work --------------------------------------------------------------------------------
    def output_path(self, i: int) -> Path:
        return self.out_dir / f"{i:06d}-{PHOTOS[i % len(PHOTOS)].rsplit('.', 1)[0]}.png"

    def _make(self, i: int) -> None:
        path = self.output_path(i)
        if path.exists():  # published (atomically, so complete) after the last checkpoint, before a crash
            return
        self._publish(path, self.render(i))

    def variant(self, i: int) -> Image.Image:
        """Image i of the stream at full size: a seeded crop (60-100% of each side), quarter turn and mirror."""
        return self._transform(i, self.photos[i % len(self.photos)])

    def _transform(self, i: int, photo: Image.Image, size: int = 0) -> Image.Image:
        rng = np.random.default_rng([self.seed, i])
        w, h = photo.size
        cw, ch = (int(d * rng.uniform(0.6, 1.0)) for d in (w, h))
        top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        turns, mirror = int(rng.integers(0, 4)), bool(rng.random() < 0.5)
        img = photo.crop((left, top, left + cw, top + ch))
        if size:  # shrink first: turning a thumbnail is far cheaper than turning the full crop
            scale = size / max(cw, ch)
            img = img.resize((max(1, round(cw * scale)), max(1, round(ch * scale))), Image.Resampling.LANCZOS,
                             reducing_gap=3.0)
        for _ in range(turns):
            img = img.transpose(Image.Transpose.ROTATE_90)
        return img.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if mirror else img

    def render(self, i: int) -> bytes:
        """PNG bytes of thumbnail i: Lanczos-resized, watermarked bottom right; a pure function of i and the args."""
        img = self._transform(i, self.photos[i % len(self.photos)], self.size)
        overlay = Image.new("RGBA", img.size, (0, 0, 0, 0))
        draw = ImageDraw.Draw(overlay)
        text = f"{self.watermark} #{i}"
        left, top, right, bottom = draw.textbbox((0, 0), text, font=self.font)
        pad = max(2, self.size // 64)
        xy = (max(pad, img.width - (right - left) - 2 * pad), img.height - (bottom - top) - 2 * pad)
        draw.text((xy[0] + 1, xy[1] + 1), text, font=self.font, fill=(0, 0, 0, 110))
        draw.text(xy, text, font=self.font, fill=(255, 255, 255, 170))
        out = Image.alpha_composite(img.convert("RGBA"), overlay).convert("RGB")
        buf = io.BytesIO()
        out.save(buf, format="PNG", compress_level=3)
        return buf.getvalue()

    def _publish(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(f".{path.name}{_TMP_SUFFIX}")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # atomic: the name shows a complete image or nothing
        self._unsynced.append(path)

    def _sync(self) -> None:
        """Flush the images published since the last checkpoint to disk, so no checkpoint outlives its images.

        Called from state_dict(), i.e. when the worker checkpoints between windows: the fsyncs cost
        idle time, not bubble time (one fsync per image made steps slow and spiky).
        """
        for path in self._unsynced:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        if self._unsynced:
            fd = os.open(self.out_dir, os.O_RDONLY)
            try:
                os.fsync(fd)  # the renames too
            finally:
                os.close(fd)
        self._unsynced = []

    # -- progress and checkpoints ----------------------------------------------------------------
    def progress(self) -> Mapping[str, float]:
        unit = self.budget.unit_s
        return {
            "images": float(self.done),
            "total": float(self.images),
            "done": self.done / self.images,
            "images_per_s": 1.0 / unit if unit > 0 else 0.0,
        }

    def state_dict(self) -> Mapping[str, Any]:
        self._sync()
        return {"done": self.done}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.done = int(state["done"])
