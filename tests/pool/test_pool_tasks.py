"""The shipped pool tasks: ThumbnailPool and ImageFeaturesPool.

process() in-process against independent computations; the items' path rules and decoder errors;
the listing command; a pool drained in-process whose bad items end in the dead letters; and one run
per task in a real agent's worker, fed by a synthetic trainer's bubbles, against a real redis-server.
"""

from __future__ import annotations

import io
import math
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps, UnidentifiedImageError
from skimage.feature import hog
from support.agents import BackgroundTrainer
from support.redis_server import RedisServer

from freeride import PoolItem, PoolTask, TaskContext
from freeride.pool import Pool, parse_lines, parse_pool_url
from freeride.tooling.harness import AgentProcess, wait_for_task
from freeride.v1 import tasks_pb2
from sidetasks.features import ImageFeaturesPool, near_duplicates
from sidetasks.images import PHOTOS, ThumbnailPool, main, photo_dir

S = tasks_pb2
NO_POOL = "unix:///nonexistent/redis.sock/p"  # process() never touches the pool: a URL that parses is enough


def files(root: Path) -> dict[str, bytes]:
    """Every file under root, hidden ones (a writer's temporary files) included, by relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# -- independent computations ---------------------------------------------------------------------------------------
def expected_thumbnail(path: Path, size: int) -> bytes:
    """What a thumbnail should be, from Pillow directly: the JPEG decoded at the DCT scale that keeps 3x the
    target, EXIF orientation applied, Lanczos to `size` on the longest side, PNG at compression level 3."""
    with Image.open(path) as img:
        w, h = img.size
        img.draft("RGB", (math.ceil(3 * size * w / max(w, h)), math.ceil(3 * size * h / max(w, h))))
        img = ImageOps.exif_transpose(img).convert("RGB")
    w, h = img.size
    out = img.resize((max(1, round(w * size / max(w, h))), max(1, round(h * size / max(w, h)))),
                     Image.Resampling.LANCZOS, reducing_gap=3.0)
    buf = io.BytesIO()
    out.save(buf, format="PNG", compress_level=3)
    return buf.getvalue()


def expected_features(path: Path, side: int) -> bytes:
    """The descriptor from scikit-image and numpy directly (the colour histogram by np.histogramdd)."""
    with Image.open(path) as img:
        w, h = img.size
        img.draft("RGB", (math.ceil(3 * side * w / max(w, h)), math.ceil(3 * side * h / max(w, h))))
        img = ImageOps.exif_transpose(img).convert("RGB")
    small = img.resize((side, side), Image.Resampling.LANCZOS, reducing_gap=3.0)
    shape = hog(np.asarray(small.convert("L"), dtype=np.float32) / 255.0, orientations=9, pixels_per_cell=(8, 8),
                cells_per_block=(2, 2), block_norm="L2-Hys")
    hsv = np.asarray(small.convert("HSV")).reshape(-1, 3)
    counts, _ = np.histogramdd(hsv, bins=(8, 4, 4), range=((0, 256), (0, 256), (0, 256)))
    colour = np.sqrt(counts.ravel() / len(hsv))
    parts = [(v - v.mean()) / np.linalg.norm(v - v.mean()) * math.sqrt(0.5) for v in (shape, colour)]
    buf = io.BytesIO()
    np.save(buf, np.concatenate(parts).astype(np.float32))
    return buf.getvalue()


# -- process() in-process -------------------------------------------------------------------------------------------
def test_thumbnails_are_byte_identical_to_pillow_directly_and_close_to_a_full_decode(tmp_path: Path) -> None:
    task = ThumbnailPool(NO_POOL, out_dir=str(tmp_path))
    task.setup()
    for name in PHOTOS:
        task.process(PoolItem(name))
    assert files(tmp_path) == {f"{n}.png": expected_thumbnail(photo_dir() / n, 128) for n in PHOTOS}
    for name in ("retina.jpg", "hubble_deep_field.jpg"):  # JPEGs decoded at a DCT scale: still the same picture
        with Image.open(photo_dir() / name) as full, Image.open(tmp_path / f"{name}.png") as thumb:
            assert max(thumb.size) == 128 and thumb.mode == "RGB"
            reference = np.asarray(full.convert("RGB").resize(thumb.size, Image.Resampling.LANCZOS), np.float32)
            assert np.abs(np.asarray(thumb, np.float32) - reference).mean() < 3.0  # of 255


def test_a_watermark_changes_only_the_bottom_right_corner_the_same_way_every_time(tmp_path: Path) -> None:
    plain = ThumbnailPool(NO_POOL, out_dir=str(tmp_path / "plain"), size=96)
    marked = [ThumbnailPool(NO_POOL, out_dir=str(tmp_path / f"marked{i}"), size=96, watermark="freeride")
              for i in range(2)]
    for task in (plain, *marked):
        task.process(PoolItem("coffee.png"))
    assert files(tmp_path / "marked0") == files(tmp_path / "marked1")
    with Image.open(tmp_path / "plain/coffee.png.png") as a, Image.open(tmp_path / "marked0/coffee.png.png") as b:
        diff = np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16)).sum(axis=2)
    rows, cols = np.nonzero(diff)
    assert len(rows) > 50 and rows.min() > diff.shape[0] // 2 and cols.min() > diff.shape[1] // 4


def test_processing_an_item_again_writes_the_same_bytes_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    (src / "2024/june").mkdir(parents=True)
    shutil.copy(photo_dir() / "rocket.jpg", src / "2024/june/rocket.jpg")
    task = ThumbnailPool(NO_POOL, out_dir=str(out), src_dir=str(src), size=64)
    task.process(PoolItem("2024/june/rocket.jpg"))
    first = files(out)
    task.process(PoolItem("2024/june/rocket.jpg"))
    assert files(out) == first and list(first) == ["2024/june/rocket.jpg.png"]  # subdirectories kept


@pytest.mark.parametrize("item_id", ["../escape.png", "a/../../escape.png", "/etc/hostname", ""])
def test_an_id_leaving_src_dir_is_refused(tmp_path: Path, item_id: str) -> None:
    for task in (ThumbnailPool(NO_POOL, out_dir=str(tmp_path / "out")),
                 ImageFeaturesPool(NO_POOL, out_dir=str(tmp_path / "out"))):
        with pytest.raises(ValueError, match=r"ids must be relative paths without '\.\.'"):
            task.process(PoolItem(item_id))
    assert not (tmp_path / "out").exists() or files(tmp_path / "out") == {}



def test_a_src_dir_that_is_not_a_directory_is_refused_at_submit(tmp_path: Path) -> None:
    for cls in (ThumbnailPool, ImageFeaturesPool):
        with pytest.raises(ValueError, match="is not a directory"):
            cls.check_args(pool=NO_POOL, out_dir=str(tmp_path), src_dir=str(tmp_path / "absent"))
        with pytest.raises(ValueError, match="out_dir"):
            cls(NO_POOL, out_dir="")

def test_a_broken_or_missing_image_raises_the_decoders_error(tmp_path: Path) -> None:
    (tmp_path / "noise.jpg").write_bytes(b"these bytes are not an image")
    (tmp_path / "cut.png").write_bytes((photo_dir() / "astronaut.png").read_bytes()[:20_000])
    for task in (ThumbnailPool(NO_POOL, out_dir=str(tmp_path / "out"), src_dir=str(tmp_path)),
                 ImageFeaturesPool(NO_POOL, out_dir=str(tmp_path / "out"), src_dir=str(tmp_path))):
        with pytest.raises(UnidentifiedImageError, match="cannot identify image file"):
            task.process(PoolItem("noise.jpg"))
        with pytest.raises(OSError, match=r"truncated|broken"):
            task.process(PoolItem("cut.png"))
        with pytest.raises(FileNotFoundError):
            task.process(PoolItem("absent.png"))
    assert not (tmp_path / "out").exists() or files(tmp_path / "out") == {}


def test_exif_orientation_and_16_bit_grey_are_read_as_a_viewer_shows_them(tmp_path: Path) -> None:
    with Image.open(photo_dir() / "rocket.jpg") as img:  # 640 x 427, landscape
        exif = img.getexif()
        exif[0x0112] = 6  # "rotate 90 degrees clockwise to view"
        img.save(tmp_path / "portrait.jpg", exif=exif)
    Image.fromarray(np.full((40, 60), 40_000, np.uint16)).save(tmp_path / "grey16.png")
    task = ThumbnailPool(NO_POOL, out_dir=str(tmp_path / "out"), src_dir=str(tmp_path), size=64)
    task.process(PoolItem("portrait.jpg"))
    task.process(PoolItem("grey16.png"))
    with Image.open(tmp_path / "out/portrait.jpg.png") as portrait, Image.open(tmp_path / "out/grey16.png.png") as g:
        assert portrait.size == (43, 64)
        assert g.size == (64, 43) and g.getpixel((10, 10)) == (40_000 >> 8,) * 3


def test_features_are_byte_identical_to_scikit_image_directly_and_find_a_near_duplicate(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    for name in PHOTOS:
        shutil.copy(photo_dir() / name, src / name)
    with Image.open(src / "coffee.png") as img:  # a copy as the web would have it: cropped, shrunk, recompressed
        w, h = img.size
        img.crop((w // 30, h // 30, w, h)).resize((w * 6 // 10, h * 6 // 10)).save(src / "coffee-web.jpg", quality=70)
    task = ImageFeaturesPool(NO_POOL, out_dir=str(out), src_dir=str(src))
    task.setup()
    ids = [*PHOTOS, "coffee-web.jpg"]
    for item_id in ids:
        task.process(PoolItem(item_id))
    task.process(PoolItem("coffee.png"))  # again: the same bytes
    assert files(out) == {f"{i}.npy": expected_features(src / i, 64) for i in ids}
    vector = np.load(out / "astronaut.png.npy")
    assert vector.dtype == np.float32 and vector.shape == (9 * 4 * 7 * 7 + 128,)
    assert float(vector @ vector) == pytest.approx(1.0, abs=1e-5)
    pairs = near_duplicates(out)
    assert [(a, b) for a, b, _ in pairs] == [("coffee-web.jpg", "coffee.png")] and pairs[0][2] > 0.75


def test_list_prints_the_image_files_under_a_directory_as_pool_items(tmp_path: Path) -> None:
    for rel in ["b.png", "a/z.JPG", "a/y.jpeg", "#1.png", "notes.txt", ".hidden.png", ".cache/x.png", "c.webp"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    listed = subprocess.run([sys.executable, "-m", "sidetasks.images", "list", str(tmp_path)], capture_output=True,
                            text=True, check=True).stdout
    assert listed.splitlines() == ['{"id": "#1.png"}', "b.png", "c.webp", "a/y.jpeg", "a/z.JPG"]
    assert [item.id for item in parse_lines(listed.splitlines())] == ["#1.png", "b.png", "c.webp", "a/y.jpeg",
                                                                     "a/z.JPG"]
    missing = subprocess.run([sys.executable, "-m", "sidetasks.features", "list", str(tmp_path / "absent")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "is not a directory" in missing.stderr


def test_list_without_a_directory_prints_the_bundled_photographs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    assert capsys.readouterr().out.splitlines() == list(PHOTOS)


# -- against a real redis-server --------------------------------------------------------------------------------------
def drain(task: PoolTask, limit: int = 1000) -> None:
    """Run the task's steps in-process, as its worker would outside any window, until it is done."""
    task.context = TaskContext(task_id="1", checkpoint_path="")
    task.setup()
    try:
        for _ in range(limit):
            if task.is_done():
                return
            task.step()
        raise AssertionError(f"not done after {limit} steps")
    finally:
        task.teardown()


def test_bad_items_end_in_the_dead_letters_with_their_error_and_the_rest_are_done(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    (tmp_path / "src").mkdir()
    shutil.copy(photo_dir() / "moon.png", tmp_path / "src/moon.png")
    (tmp_path / "src/broken.jpg").write_bytes(b"\xff\xd8\xff not really a JPEG")
    url = redis_server.url("thumbs")
    with Pool(parse_pool_url(url)) as pool:
        pool.create(parse_lines(["moon.png", "broken.jpg", "../secrets.png"]), max_tries=2)
        drain(ThumbnailPool(url, out_dir=str(tmp_path / "out"), src_dir=str(tmp_path / "src"), size=32))
        status = pool.status()
    assert (status.total, status.done, status.failed, status.pending) == (3, 1, 2, 0)
    errors = {d.item.id: d.error for d in status.dead}
    assert errors["../secrets.png"].startswith("ValueError: item id '../secrets.png' is not a path relative to")
    assert errors["broken.jpg"].startswith("UnidentifiedImageError: cannot identify image file")
    assert {d.tries for d in status.dead} == {2}
    assert list(files(tmp_path / "out")) == ["moon.png.png"]


@pytest.fixture
def photos_pool(redis_server: RedisServer) -> Iterator[str]:
    """A pool of the bundled photographs, its items as `python -m sidetasks.images list` prints them."""
    listed = subprocess.run([sys.executable, "-m", "sidetasks.images", "list"], capture_output=True, text=True,
                            check=True).stdout
    url = redis_server.url("photos")
    with Pool(parse_pool_url(url)) as pool:
        assert pool.create(parse_lines(listed.splitlines(), "stdin")) == len(PHOTOS)
    yield url


@pytest.mark.parametrize(("cls", "args", "suffix"), [
    (ThumbnailPool, {"size": 96, "watermark": "freeride"}, ".png"),
    (ImageFeaturesPool, {}, ".npy"),
], ids=["thumbnails", "features"])
def test_a_pool_task_in_a_real_agent_processes_every_item_once(
    agent: AgentProcess, photos_pool: str, tmp_path: Path, cls: type[PoolTask], args: dict[str, object], suffix: str
) -> None:
    out = tmp_path / "out"
    with agent.client() as client:
        ref = f"{cls.__module__}:{cls.__name__}"
        spec_args = {"pool": photos_pool, "out_dir": str(out), **{k: str(v) for k, v in args.items()}}
        task = client.submit(S.TaskSpec(ref=ref, args=spec_args))
        # Bubbles far above an item (5-20 ms, 50 ms under load): a step stretched past every bubble would raise
        # the worker's step estimate above them, and the task would wait for a longer one.
        with BackgroundTrainer(agent, [150.0]):
            done = wait_for_task(client, task.id, [S.TASK_STATE_DONE], timeout_s=90)
    assert done.progress["items"] == len(PHOTOS) and done.progress["failed"] == 0
    assert sorted(files(out)) == sorted(f"{name}{suffix}" for name in PHOTOS)  # each once, no temporary file left
    reference = tmp_path / "reference"
    in_process = cls(photos_pool, out_dir=str(reference), **args)  # type: ignore[call-arg]
    for name in PHOTOS:
        in_process.process(PoolItem(name))
    assert files(out) == files(reference)
    with Pool(parse_pool_url(photos_pool)) as pool:
        status = pool.status()
    assert (status.done, status.total, status.failed, status.pending) == (len(PHOTOS), len(PHOTOS), 0, 0)
    [consumer] = status.consumers
    assert consumer.done == len(PHOTOS) and consumer.task == task.id and consumer.busy_s > 0
    print(f"{ref}: peak memory {done.counters.peak_memory_bytes / 2**20:.0f} MiB, "
          f"{consumer.busy_s / len(PHOTOS) * 1e3:.1f} ms per item in process()")
