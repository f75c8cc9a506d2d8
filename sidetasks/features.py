"""ImageFeaturesPool: a descriptor of every image in a corpus, for near-duplicate search, as a work pool.

An item's id is an image path under `src_dir` (as `python -m sidetasks.features list DIR` prints
them); its output `out_dir/<id>.npy` is one float32 vector of unit length (a blank image's is zero):

- shape: a histogram of oriented gradients (Dalal and Triggs 2005; scikit-image's `hog`: 9
  orientations, 8-px cells, 2x2-cell blocks, L2-Hys) of the image squeezed to `side` x `side` grey;
- colour: a joint HSV histogram (8 hues x 4 saturations x 4 values) of the same squeezed image,
  square-rooted (so that a dot product of two is their Bhattacharyya coefficient);

each centred and scaled to unit length, then both halves weighted equally. The dot product of two
descriptors is their cosine similarity. On the photographs bundled with scikit-image (at the default
side 64), a copy shrunk to 60%, cropped by 3% and re-encoded as JPEG (quality 70) scores 0.76 to
0.92 against its original, while two different photographs score at most 0.47; hence the default
threshold 0.7 of `python -m sidetasks.features near OUT_DIR`, which prints the pairs above it.
Gradients are not mirror-invariant: a mirrored copy scores 0.5 to 0.8 (the more symmetric the
picture, the higher).

Like ThumbnailPool, each output is a pure function of its file and `side`, published atomically and
fsynced before the item is acknowledged.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
from PIL import Image
from skimage.feature import hog

from sidetasks.files import cli_parser, print_items
from sidetasks.images import PHOTOS, ImageDirPool

_HUES, _SATURATIONS, _VALUES = 8, 4, 4
DEFAULT_MIN_SIMILARITY = 0.7


def _centred_unit(v: np.ndarray) -> np.ndarray:
    v = v - v.mean()
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


def describe(img: Image.Image, side: int = 64) -> np.ndarray:
    """The descriptor of an RGB image (see the module's docstring): float32, 9 * 4 * ((side/8) - 1)^2 + 128 values."""
    small = img.resize((side, side), Image.Resampling.LANCZOS, reducing_gap=3.0)
    grey = np.asarray(small.convert("L"), dtype=np.float32) / 255.0
    shape = hog(grey, orientations=9, pixels_per_cell=(8, 8), cells_per_block=(2, 2), block_norm="L2-Hys",
                feature_vector=True)
    hsv = np.asarray(small.convert("HSV")).astype(np.intp)
    bins = ((hsv[..., 0] * _HUES) >> 8) * (_SATURATIONS * _VALUES) + ((hsv[..., 1] * _SATURATIONS) >> 8) * _VALUES \
        + ((hsv[..., 2] * _VALUES) >> 8)
    colour = np.sqrt(np.bincount(bins.ravel(), minlength=_HUES * _SATURATIONS * _VALUES) / bins.size)
    half = math.sqrt(0.5)
    return np.concatenate([_centred_unit(shape) * half, _centred_unit(colour) * half]).astype(np.float32)


def npy_bytes(vector: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, vector, allow_pickle=False)
    return buf.getvalue()


class ImageFeaturesPool(ImageDirPool):
    """HOG and colour descriptors of the images a pool names: item id `a/b.jpg` is `src_dir/a/b.jpg`, its
    descriptor `out_dir/a/b.jpg.npy`. Bad ids, missing or undecodable files fail the item with that message.

    An item costs 4-15 ms for the bundled photographs on a 2-core VM, decoding the file most of it (see
    ThumbnailPool for larger images); the descriptor itself, at side 64, about 2 ms."""

    suffix = ".npy"

    def __init__(self, pool: str, out_dir: str, src_dir: str = "", side: int = 64) -> None:
        super().__init__(pool, out_dir, src_dir, side, "descriptors")
        if side < 16 or side % 8:
            raise ValueError(f"need side >= 16 and a multiple of 8 (the HOG cell), got {side}")
        self.side = side

    def warm_up(self) -> None:
        describe(Image.new("RGB", (2 * self.side, self.side)), self.side)  # imports, resampler

    def encode(self, img: Image.Image) -> bytes:
        return npy_bytes(describe(img, self.side))


def load_features(out_dir: Path) -> tuple[list[str], np.ndarray]:
    """The item ids and descriptors (one row each) under `out_dir`, sorted by id."""
    paths = sorted(p for p in out_dir.rglob("*.npy")  # hidden files (a writer's temporary ones) left out
                   if not any(part.startswith(".") for part in p.relative_to(out_dir).parts))
    ids = [p.relative_to(out_dir).as_posix()[: -len(".npy")] for p in paths]
    if not paths:
        return ids, np.zeros((0, 0), np.float32)
    rows = [np.load(p, allow_pickle=False) for p in paths]
    if len({r.shape for r in rows}) > 1:
        raise ValueError(f"{out_dir} mixes descriptors of different sizes (made with different `side`s)")
    return ids, np.stack(rows)


def near_duplicates(out_dir: Path, min_similarity: float = DEFAULT_MIN_SIMILARITY,
                    block: int = 1024) -> list[tuple[str, str, float]]:
    """Pairs of items whose descriptors' cosine similarity is at least `min_similarity`, most similar first.

    Compares every pair, `block` rows at a time (memory: block x items floats)."""
    ids, m = load_features(out_dir)
    pairs = []
    for start in range(0, len(ids), block):
        sims = m[start:start + block] @ m.T
        for i, j in zip(*np.nonzero(sims >= min_similarity), strict=True):
            if start + i < j:
                pairs.append((ids[start + i], ids[j], float(sims[i, j])))
    return sorted(pairs, key=lambda p: (-p[2], p[0], p[1]))


def main(argv: list[str] | None = None) -> int:
    """`python -m sidetasks.features list [DIR]` (the items to create a pool with) or `near OUT_DIR`."""
    parser, sub = cli_parser("python -m sidetasks.features")
    near = sub.add_parser("near", help="print the pairs of near-duplicate images: similarity, id, id")
    near.add_argument("out_dir", help="the task's out_dir")
    near.add_argument("--min-similarity", type=float, default=DEFAULT_MIN_SIMILARITY,
                      help=f"cosine similarity from which a pair is printed (default {DEFAULT_MIN_SIMILARITY})")
    args = parser.parse_args(argv)
    if args.command == "list":
        return print_items(args.dir, PHOTOS)
    for a, b, sim in near_duplicates(Path(args.out_dir), args.min_similarity):
        print(f"{sim:.3f}\t{a}\t{b}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
