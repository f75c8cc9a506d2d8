"""sidetasks.evaluate: one line per new checkpoint, with the loss a direct computation gives, none twice."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from support.sidetasks import checkpoint, progress, resumed, started

from sidetasks.evaluate import Evaluate
from sidetasks.models import byte_decoder, lm_loss

CLASSIFIER = '''
import torch
from torch import nn


def classifier() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4, 2))
'''


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def save(model: torch.nn.Module, path: Path) -> None:
    tmp = path.with_name("." + path.name + ".tmp")
    torch.save(model.state_dict(), tmp)
    tmp.rename(path)


def run(task: Evaluate, steps: int | None = None) -> int:
    """Run `steps` steps, or until done, each followed by the end of the checkpoint read it may have begun (a
    step never waits for one: the worker grants the next window meanwhile); returns the steps run."""
    n = 0
    while not task.is_done() and (steps is None or n < steps):
        task.step()
        assert task.reader.wait(60), "a checkpoint read did not end"
        n += 1
    return n


def steps_until(task: Evaluate, out: Path, count: int, limit: int = 2000) -> int:
    for n in range(limit):
        if len(lines(out)) >= count:
            return n
        run(task, steps=1)
    raise AssertionError(f"no line {count} after {limit} steps")


def test_each_new_checkpoint_gets_one_line_with_the_loss_computed_directly(tmp_path: Path) -> None:
    ckpts, out = tmp_path / "ckpts", tmp_path / "evals.jsonl"
    ckpts.mkdir()
    data = tmp_path / "heldout.txt"
    data.write_bytes(Path(json.__file__).read_bytes()[:5000])  # bytes as ids: 38 rows of 129
    args = {"checkpoints": str(ckpts), "data": str(data), "out": str(out), "seq_len": 128, "batch": 4}
    task = started(Evaluate(**args), tmp_path, window_s=0.005)
    run(task, steps=3)
    assert lines(out) == [] and progress(task)["listings"] == 3  # nothing yet: one listing per step, nothing else

    model = byte_decoder()
    save(model, ckpts / "step-100.pt")
    steps_until(task, out, 1)
    with torch.no_grad():
        model.embed.weight.mul_(1.5)  # "training": other weights, another loss
    save(model, ckpts / "step-200.pt")
    (ckpts / "notes.txt").write_text("not a checkpoint")
    (ckpts / "partial.pt").write_bytes(b"half a checkpoint")  # does not load: skipped until it changes
    steps = steps_until(task, out, 2)
    run(task, steps=3)
    assert len(lines(out)) == 2 and steps > 2  # in chunks, over several steps; no line for the others

    ids = torch.frombuffer(bytearray(data.read_bytes()), dtype=torch.uint8).long()[: 38 * 129].view(38, 129)
    expected = []
    for name in ("step-100.pt", "step-200.pt"):
        m = byte_decoder()
        m.load_state_dict(torch.load(ckpts / name))
        with torch.no_grad():
            loss, n = lm_loss(m.eval(), ids)
        expected.append((name, loss / n, n))
    got = [(r["checkpoint"], r["loss"], r["tokens"]) for r in lines(out)]
    assert [g[0] for g in got] == [e[0] for e in expected] and [g[2] for g in got] == [38 * 128] * 2
    for (_, loss, _), (_, want, _) in zip(got, expected, strict=True):
        assert loss == pytest.approx(want, rel=1e-5)
    assert got[0][1] != pytest.approx(got[1][1], rel=1e-3)
    assert lines(out)[1]["perplexity"] == pytest.approx(math.exp(expected[1][1]), rel=1e-5)

    # A new worker (a restart) evaluates nothing again; a checkpoint rewritten in place is evaluated again.
    again = resumed(Evaluate(**args), checkpoint(task), tmp_path, window_s=0.005)
    run(again, steps=5)
    assert len(lines(out)) == 2
    save(model, ckpts / "step-100.pt")
    steps_until(again, out, 3)
    assert lines(out)[2]["checkpoint"] == "step-100.pt"


def test_a_crash_mid_evaluation_resumes_from_the_checkpoint_and_writes_one_line(tmp_path: Path) -> None:
    ckpts, out = tmp_path / "ckpts", tmp_path / "evals.jsonl"
    ckpts.mkdir()
    np.save(tmp_path / "ids.npy", np.frombuffer(Path(json.__file__).read_bytes()[:3000], dtype=np.uint8))
    args = {"checkpoints": str(ckpts), "data": str(tmp_path / "ids.npy"), "out": str(out), "seq_len": 64,
            "batch": 2, "count": 1}
    save(byte_decoder(), ckpts / "a.pt")
    whole = started(Evaluate(**{**args, "out": str(tmp_path / "whole.jsonl")}), tmp_path)
    run(whole)
    first = started(Evaluate(**args), tmp_path)
    for _ in range(200):  # the read, then the copy into the model (a piece a step), then the first batch
        if progress(first).get("current_done", 0) > 0:
            break
        run(first, steps=1)
    run(first, steps=4)  # five batches in all
    saved = checkpoint(first)
    assert 0 < progress(first)["current_done"] < 1
    second = resumed(Evaluate(**args), saved, tmp_path)
    assert run(second) < 25 - 5 + 1  # the rest only
    assert lines(out) == lines(tmp_path / "whole.jsonl") and len(lines(out)) == 1
    assert progress(second)["done"] == 1.0


def test_a_classifier_is_scored_on_a_directory_of_images_by_class(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for label, colour in (("blue", 2), ("red", 0)):
        (tmp_path / "images" / label).mkdir(parents=True)
        for i in range(5):
            pixels = rng.integers(0, 60, (20, 20, 3), dtype=np.uint8)
            pixels[:, :, colour] = 250
            Image.fromarray(pixels).save(tmp_path / "images" / label / f"{i}.png")
    (tmp_path / "factory.py").write_text(CLASSIFIER)
    (tmp_path / "ckpts").mkdir()
    ns: dict = {}
    exec(CLASSIFIER, ns)
    model = ns["classifier"]()
    save(model, tmp_path / "ckpts" / "c.pt")
    task = started(Evaluate(checkpoints=str(tmp_path / "ckpts"), data=str(tmp_path / "images"), batch=3,
                            image_size=8, model=f"{tmp_path / 'factory.py'}:classifier", count=1), tmp_path)
    run(task)
    [line] = lines(tmp_path / "task-1.evals.jsonl")
    x = torch.stack([torch.from_numpy(np.asarray(Image.open(p).convert("RGB").resize((8, 8), Image.Resampling.BILINEAR),
                                                 dtype=np.float32) / 255.0).permute(2, 0, 1)
                     for label in ("blue", "red") for p in sorted((tmp_path / "images" / label).glob("*.png"))])
    y = torch.tensor([0] * 5 + [1] * 5)
    with torch.no_grad():
        logits = model.eval()(x)
    assert line["items"] == 10
    assert line["accuracy"] == pytest.approx(float((logits.argmax(1) == y).float().mean()))
    assert line["loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(logits, y)), rel=1e-5)


def test_bad_arguments_are_refused_at_submit_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "tiny.bin").write_bytes(b"abc")
    for kwargs, message in [
        ({"data": "x"}, "is not a directory"),
        ({"checkpoints": str(tmp_path)}, "pass data="),
        ({"checkpoints": str(tmp_path), "data": str(tmp_path / "absent")}, "no such file"),
        ({"checkpoints": str(tmp_path), "data": str(tmp_path / "tiny.bin")}, "fewer than seq_len"),
    ]:
        with pytest.raises(ValueError, match=message) as exc:
            Evaluate.check_args(**kwargs)
        assert "\n" not in str(exc.value)


def test_a_step_never_reads_a_checkpoint_and_the_step_time_is_learnt_from_units_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 154 MB checkpoint loaded inside one step overran its bubble by 273 ms, then the task waited with `its
    steps (p95 217.7 ms) do not fit any bubble` and wrote no line (round 3, item 6). Here the read blocks until the
    test lets it go: every step meanwhile returns at once, and the declared step time never counts the read."""
    ckpts, out = tmp_path / "ckpts", tmp_path / "evals.jsonl"
    ckpts.mkdir()
    data = tmp_path / "heldout.txt"
    data.write_bytes(Path(json.__file__).read_bytes()[:3000])
    task = started(Evaluate(checkpoints=str(ckpts), data=str(data), out=str(out), seq_len=64, batch=4, count=1),
                   tmp_path, window_s=0.005)
    save(byte_decoder(), ckpts / "big.pt")
    let_go, real_load = threading.Event(), torch.load

    def slow_load(*args: object, **kwargs: object) -> object:
        let_go.wait()  # the disk and the unpickling of a file of gigabytes
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", slow_load)
    try:
        for _ in range(3):
            stepping = threading.Thread(target=task.step, daemon=True)
            stepping.start()
            stepping.join(30)
            assert not stepping.is_alive(), "a step waited for the checkpoint being read"
        assert lines(out) == [] and task.min_step_s() is None  # no unit yet: the read is no unit
    finally:
        let_go.set()
    steps_until(task, out, 1)
    declared = task.min_step_s()
    assert declared is not None and declared < 1.0  # batches and pieces of the copy (ms), not the read
    assert lines(out)[0]["checkpoint"] == "big.pt"


def test_a_checkpoint_that_does_not_fit_the_model_is_skipped_until_it_changes(tmp_path: Path) -> None:
    ckpts, out = tmp_path / "ckpts", tmp_path / "evals.jsonl"
    ckpts.mkdir()
    data = tmp_path / "heldout.txt"
    data.write_bytes(Path(json.__file__).read_bytes()[:3000])
    task = started(Evaluate(checkpoints=str(ckpts), data=str(data), out=str(out), seq_len=64, batch=4), tmp_path)
    torch.save({"model": {"embed.weight": torch.zeros(3, 3)}}, ckpts / "other.pt")
    run(task, steps=3)
    assert lines(out) == [] and task.current is None
    save(byte_decoder(), ckpts / "other.pt")  # rewritten: it changed, and fits
    steps_until(task, out, 1)
