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

ThumbnailPool: the same thumbnails (resize, watermark, PNG encoding shared with Thumbnails) of any
directory of images, as a work pool that many agents draw from: one item per file, listed with
`python -m sidetasks.images list DIR | freeride pool create URL --items -`.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont, ImageOps

from freeride import IterativeTask, PoolItem, PoolTask, StepBudget
from sidetasks.files import check_src_dir, cli_parser, print_items, publish, sweep, under

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


def read_rgb(path: Path, size: int = 0) -> Image.Image:
    """The image at `path`, upright (its EXIF orientation applied), as RGB; 16-bit grey scaled to 8 bits.

    With `size` (the longest side the caller will shrink it to), a JPEG is decoded at the smallest DCT
    scale (1/2, 1/4, 1/8) that keeps both sides at least 3 times the target, which halves the cost of
    a large one (a 24-megapixel JPEG: 50-60 ms instead of 110 ms on a 2-core VM); other formats are
    decoded in full. A file that is not an image, or is cut short, raises the decoder's error
    (PIL.UnidentifiedImageError, OSError).
    """
    with Image.open(path) as file:
        if size:
            scale = 3 * size / max(file.size)
            file.draft("RGB", (math.ceil(file.width * scale), math.ceil(file.height * scale)))
        ImageOps.exif_transpose(file, in_place=True)  # decodes; turns it when the EXIF says so
        file.load()
    img: Image.Image = file
    if img.mode.startswith("I;16"):
        img = Image.fromarray((np.asarray(img).astype(np.uint16) >> 8).astype(np.uint8), "L")
    return img if img.mode == "RGB" else img.convert("RGB")  # one copy of the pixels at a time


def fit(img: Image.Image, size: int) -> Image.Image:
    """`img` resized (Lanczos) so that its longest side is `size` px, aspect kept."""
    w, h = img.size
    scale = size / max(w, h)
    return img.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.LANCZOS,
                      reducing_gap=3.0)


def png_bytes(img: Image.Image) -> bytes:
    """Deterministic PNG: fixed compression level, no metadata."""
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=3)
    return buf.getvalue()


class Watermark:
    """Text drawn bottom right, white over a soft shadow, in a font sized for thumbnails of `size` px."""

    def __init__(self, size: int) -> None:
        self.font = ImageFont.load_default(size=max(8, size // 10))
        self.pad = max(2, size // 64)

    def apply(self, img: Image.Image, text: str) -> Image.Image:
        """An RGB copy of `img` with `text` on it."""
        overlay = Image.new("RGBA", img.size, (0, 0, 0, 0))
        draw = ImageDraw.Draw(overlay)
        left, top, right, bottom = draw.textbbox((0, 0), text, font=self.font)
        pad = self.pad
        xy = (max(pad, img.width - (right - left) - 2 * pad), img.height - (bottom - top) - 2 * pad)
        draw.text((xy[0] + 1, xy[1] + 1), text, font=self.font, fill=(0, 0, 0, 110))
        draw.text(xy, text, font=self.font, fill=(255, 255, 255, 170))
        return Image.alpha_composite(img.convert("RGBA"), overlay).convert("RGB")


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
        self.mark = Watermark(self.size)
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
        self.budget.start(self.context.remaining_s(), window=self.context.remaining_s)
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
            img = fit(img, size)
        for _ in range(turns):
            img = img.transpose(Image.Transpose.ROTATE_90)
        return img.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if mirror else img

    def render(self, i: int) -> bytes:
        """PNG bytes of thumbnail i: Lanczos-resized, watermarked bottom right; a pure function of i and the args."""
        img = self._transform(i, self.photos[i % len(self.photos)], self.size)
        return png_bytes(self.mark.apply(img, f"{self.watermark} #{i}"))

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


class ImageDirPool(PoolTask):
    """A pool over the images under `src_dir` (default: the bundled photographs): item id `a/b.jpg` is
    `src_dir/a/b.jpg`, decoded with its longest side near `decode_px`; its output, `encode()` of that
    image, is published atomically at `out_dir/a/b.jpg<suffix>`. A bad id, a missing or undecodable
    file fails the item with that message. Subclasses set `suffix` and define `encode` (and `warm_up`).
    """

    suffix = ""
    # Measured peak resident set of the worker: 70 MiB on the bundled photos; each image is decoded
    # once, at ~4 bytes a pixel (a 24-megapixel PNG: +90 MiB). 512 MiB holds ~100-megapixel images.
    mem_limit_bytes = 512 * 2**20

    def __init__(self, pool: str, out_dir: str, src_dir: str, decode_px: int, what: str) -> None:
        super().__init__(pool)
        if not out_dir:
            raise ValueError(f"pass out_dir=DIR: where the {what} go (shared by every agent on the pool)")
        self.src_dir = Path(src_dir) if src_dir else photo_dir()
        self.out_dir = Path(out_dir)
        self.decode_px = decode_px

    @classmethod
    def check_args(cls, **kwargs: Any) -> None:
        check_src_dir(kwargs)
        super().check_args(**kwargs)

    def setup(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.warm_up()
        sweep(self.out_dir)  # what a worker killed mid-write left (a live one's is kept)

    def teardown(self) -> None:
        super().teardown()
        sweep(self.out_dir)

    def warm_up(self) -> None:
        """Run the work once on a blank image (imports, resampler, encoder): a slow first item would set
        the task's estimate."""

    def encode(self, img: Image.Image) -> bytes:
        """The output's bytes for the decoded image."""
        raise NotImplementedError

    def output_path(self, item_id: str) -> Path:
        return under(self.out_dir, item_id, self.suffix)

    def process(self, item: PoolItem) -> None:
        out = self.output_path(item.id)
        publish(out, self.encode(read_rgb(under(self.src_dir, item.id), self.decode_px)))


class ThumbnailPool(ImageDirPool):
    """Thumbnails of the images a pool names: item id `a/b.jpg` is `src_dir/a/b.jpg`, its thumbnail
    `out_dir/a/b.jpg.png` (longest side `size` px, `watermark` bottom right unless empty).

    An item's output is a pure function of its file and the arguments (byte-identical on any host),
    published atomically and fsynced before the item is acknowledged; an item processed twice (a
    lease taken over) writes the same bytes again. An id with '..' or an absolute path, a missing
    file or one the decoder refuses fails the item with that message (after the pool's `max_tries`
    it is in the dead letters: `freeride pool status`).

    An item costs what decoding its file costs, and little more: 5-30 ms for the bundled photographs
    (0.3-2 megapixels) on a 2-core VM; a JPEG is decoded at a reduced scale (24 megapixels: ~60 ms),
    a PNG in full (~35 ms a megapixel). A step holds at least one item, so an image that takes longer
    than a bubble is only processed in longer bubbles.
    """

    suffix = ".png"

    def __init__(self, pool: str, out_dir: str, src_dir: str = "", size: int = 128, watermark: str = "") -> None:
        super().__init__(pool, out_dir, src_dir, size, "thumbnails")
        if size < 8:
            raise ValueError(f"need size >= 8, got {size}")
        self.size, self.watermark = size, watermark
        self.mark = Watermark(size) if watermark else None

    def warm_up(self) -> None:
        self.render(Image.new("RGB", (3 * self.size, 2 * self.size)))  # resampler, font, encoder

    def render(self, img: Image.Image) -> bytes:
        """PNG bytes of `img`'s thumbnail."""
        thumb = fit(img, self.size)
        return png_bytes(self.mark.apply(thumb, self.watermark) if self.mark else thumb)

    encode = render


def main(argv: list[str] | None = None) -> int:
    """`python -m sidetasks.images list [DIR]`: the item ids of a ThumbnailPool over DIR."""
    parser, _ = cli_parser("python -m sidetasks.images")
    args = parser.parse_args(argv)
    return print_items(args.dir, PHOTOS)


if __name__ == "__main__":
    raise SystemExit(main())
