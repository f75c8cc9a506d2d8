"""Thumbnails: every image is written exactly once, byte-identical, whether or not the task was interrupted."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

import pytest
from PIL import Image
from support.sidetasks import checkpoint, progress, resumed, run, started

from sidetasks.images import PHOTOS, Thumbnails, photo_dir

ARGS = {"images": 30, "size": 40}


def outputs(out_dir: Path) -> dict[str, str]:
    """Every file in the output directory (hidden ones included) and a hash of its bytes."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out_dir.iterdir())}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("reference")
    run(started(Thumbnails(**ARGS, out_dir=str(out)), out))
    return outputs(out)


def test_an_uninterrupted_run_writes_one_watermarked_thumbnail_per_image(tmp_path: Path, reference: dict[str, str]):
    out = tmp_path / "out"
    task = started(Thumbnails(**ARGS, out_dir=str(out)), tmp_path, window_s=0.05)
    run(task)
    assert outputs(out) == reference
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) == 30 and pngs[0].name == "000000-astronaut.png" and pngs[11].name == "000011-astronaut.png"
    with Image.open(pngs[0]) as img:
        assert max(img.size) == 40 and img.mode == "RGB"
    p = progress(task)
    assert (p["images"], p["total"], p["done"]) == (30, 30, 1) and p["images_per_s"] > 0


def test_pause_and_resume_continue_where_the_checkpoint_left_off(tmp_path: Path, reference: dict[str, str]):
    out = tmp_path / "out"
    first = started(Thumbnails(**ARGS, out_dir=str(out)), tmp_path)
    run(first, steps=12)
    second = resumed(Thumbnails(**ARGS, out_dir=str(out)), checkpoint(first), tmp_path, window_s=0.05)
    assert progress(second)["images"] == 12
    run(second)
    assert outputs(out) == reference


def test_a_crash_after_publishing_but_before_checkpointing_loses_and_repeats_nothing(
    tmp_path: Path, reference: dict[str, str], monkeypatch: pytest.MonkeyPatch
):
    out = tmp_path / "out"
    first = started(Thumbnails(**ARGS, out_dir=str(out)), tmp_path)
    run(first, steps=10)
    saved = checkpoint(first)  # the last checkpoint: 10 images done
    run(first, steps=5)  # five more published after it, then the worker is killed...
    (out / ".000015-coffee.png.tmp").write_bytes(b"half an image")  # ...in the middle of writing the 16th
    del first

    second = resumed(Thumbnails(**ARGS, out_dir=str(out)), saved, tmp_path)
    published: list[str] = []
    real_publish = second._publish
    monkeypatch.setattr(second, "_publish", lambda path, data: (published.append(path.name), real_publish(path, data)))
    run(second)
    assert outputs(out) == reference  # no temporary file left, nothing missing, nothing different
    assert published == [f"{i:06d}-{PHOTOS[i % 11].rsplit('.', 1)[0]}.png" for i in range(15, 30)]  # 10-14 kept


def test_an_output_directory_made_with_other_arguments_is_refused(tmp_path: Path):
    run(started(Thumbnails(images=2, size=40, out_dir=str(tmp_path)), tmp_path))
    with pytest.raises(ValueError, match="other arguments"):
        started(Thumbnails(images=2, size=64, out_dir=str(tmp_path)), tmp_path)


def test_outputs_default_to_a_directory_beside_the_tasks_checkpoint(tmp_path: Path):
    task = started(Thumbnails(images=1, size=16), tmp_path)
    run(task)
    assert [p.name for p in (tmp_path / "task-1-thumbnails").glob("*.png")] == ["000000-astronaut.png"]


def test_the_photographs_are_read_from_the_installed_wheel_not_the_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    def no_network(*args: object) -> None:
        raise AssertionError("side task tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    assert all((photo_dir() / name).is_file() for name in PHOTOS)
    task = started(Thumbnails(images=11, size=16, out_dir=str(tmp_path / "out")), tmp_path)
    run(task)
    assert len(list((tmp_path / "out").glob("*.png"))) == 11
