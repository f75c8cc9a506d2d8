"""sidetasks.generate: completions are the same however the run is cut, none is lost or written twice.

In-process (the harness drives the task as its worker would): greedy and sampled output of a run cut
into short bubbles and checkpoint round trips equals an uninterrupted run's; a crash after completions
were written, and a line cut short, lose and repeat nothing; the batch is sized to the memory cap; bad
arguments are refused at submit in one line. Through a real agent: the worker killed with SIGKILL
mid-run, the task ends with every prompt completed exactly once.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from support.agents import BackgroundTrainer
from support.sidetasks import checkpoint, progress, resumed, run, started, wait_for_checkpointed, write_prompts

from freeride import PermanentError, TaskContext
from freeride.client import AgentClient
from freeride.tooling.harness import AgentProcess, wait_for_task
from freeride.v1 import tasks_pb2
from sidetasks.decoding import Decoder, Prompt, Sampling
from sidetasks.generate import Generate
from sidetasks.models import byte_decoder
from sidetasks.prompts import read_prompts

S = tasks_pb2
UNDECLARED = f"{Path(__file__).parents[1] / 'tasks' / 'undeclared_model.py'}:byte_decoder"  # no limits at submit
def completions(path: Path) -> dict[str, dict[str, Any]]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    by_id = {r["id"]: r for r in records}
    assert len(by_id) == len(records), "an id was written twice"
    return by_id


def task(tmp_path: Path, out: str, **args: Any) -> Generate:
    return Generate(prompts=str(tmp_path / "prompts.jsonl"), out=str(tmp_path / out), **{
        "max_new_tokens": 12, "max_batch": 4, **args})


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    return write_prompts(tmp_path / "prompts.jsonl", 14)


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "top_p": 0.9, "seed": 3}], ids=["greedy", "sampled"])
def test_output_is_identical_whether_the_run_is_cut_into_bubbles_or_runs_in_one_go(
    tmp_path: Path, prompts: Path, sampling: dict[str, Any]
) -> None:
    whole = started(task(tmp_path, "whole.jsonl", max_step_ms=60_000, **sampling), tmp_path, window_s=1000.0)
    assert run(whole) < 5  # a few long steps
    reference = completions(tmp_path / "whole.jsonl")
    assert len(reference) == 14 and all(len(r["tokens"]) == 12 and r["finish"] == "length" for r in reference.values())

    cut = started(task(tmp_path, "cut.jsonl", **sampling), tmp_path)  # outside a window: one unit per step
    steps = run(cut, steps=7)
    while not cut.is_done():  # a checkpoint round trip (a new worker) every few steps, bubbles of varied length
        cut = resumed(task(tmp_path, "cut.jsonl", **sampling), checkpoint(cut), tmp_path,
                      window_s=[0.001, 0.004, 0.0][steps % 3])
        steps += run(cut, steps=5)
    assert steps > 30
    assert completions(tmp_path / "cut.jsonl") == reference
    p = progress(cut)
    assert (p["prompts_done"], p["prompts"], p["done"], p["in_flight"], p["batch"]) == (14, 14, 1.0, 0, 4)


def test_the_decoder_batches_continuously_and_matches_one_prompt_at_a_time(prompts: Path) -> None:
    """Rows join as others leave (never more than the width); each completion equals the prompt decoded alone."""
    model = byte_decoder().eval()
    items = [Prompt(i, list(a["prompt"].encode())) for i, a in read_prompts(str(prompts))]
    sampling = Sampling(max_new_tokens=6)
    batched = Decoder(model, items, sampling, 4, torch.device("cpu"))
    widths, out = [], {}
    while not batched.done():
        out.update({c.id: c.tokens for c in batched.unit()})
        widths.append(len(batched.rows))
    assert max(widths) == 4 and widths.count(4) > 5  # full most of the time: rows refilled as soon as one leaves
    alone = {}
    for p in items:
        single = Decoder(model, [p], sampling, 1, torch.device("cpu"))
        while not single.done():
            alone.update({c.id: c.tokens for c in single.unit()})
    # Padding changes the shapes of the batched matmuls, so logits may differ in the last bits: compare the first
    # tokens, which a greedy argmax picks from logits computed on nearly the same numbers.
    assert out.keys() == alone.keys() and sum(out[k] == alone[k] for k in out) >= len(out) - 1


def test_a_crash_after_completions_were_written_loses_and_repeats_none(tmp_path: Path, prompts: Path) -> None:
    reference = started(task(tmp_path, "reference.jsonl"), tmp_path)
    run(reference)
    first = started(task(tmp_path, "out.jsonl"), tmp_path)
    run(first, steps=12)
    saved = checkpoint(first)
    written = progress(first)["prompts_done"]
    run(first, steps=25)  # more completions written after the checkpoint, then the worker is killed ...
    after = progress(first)["prompts_done"]
    assert 0 < written < after < 14
    with (tmp_path / "out.jsonl").open("a") as f:  # ... in the middle of writing a line
        f.write('{"id": "q13", "comp')
    before_crash = (tmp_path / "out.jsonl").read_text().rsplit("\n", 1)[0] + "\n"
    del first

    second = resumed(task(tmp_path, "out.jsonl"), saved, tmp_path, window_s=0.003)
    assert progress(second)["prompts_done"] == after  # counted from the output: the torn line is not one
    run(second)
    text = (tmp_path / "out.jsonl").read_text()
    assert text.startswith(before_crash)  # what was written before the crash is kept as it was
    done = completions(tmp_path / "out.jsonl")  # each id once
    assert sorted(done) == sorted(completions(tmp_path / "reference.jsonl"))


def test_the_batch_is_sized_to_the_memory_cap(tmp_path: Path, prompts: Path) -> None:
    """The width is what 80 % of the cap leaves over what the process holds, in sequences (1 at least, the prompts
    at most), judged against what the task measured itself: the process's RSS moves between two setups in one
    process (each loads a model), by a few MiB."""

    def sized(cap: int) -> Mapping[str, float]:
        # max_new_tokens: ~8 MiB a sequence, well over the RSS's noise
        t = task(tmp_path, f"out-{cap}.jsonl", max_batch=64, max_new_tokens=960)
        t.context = TaskContext(task_id="1", checkpoint_path=str(tmp_path / "task-1.ckpt"), mem_limit_bytes=cap)
        t.setup()
        p = progress(t)
        t.teardown()
        used, per_seq = p["mem_used_mib"] * 2**20, p["mem_per_seq_mib"] * 2**20
        assert used > 0 and per_seq > 0
        assert p["batch"] == max(1, min(14, (0.8 * cap - used) // per_seq)), (cap, p)
        return p

    ample = sized(100 * 2**30)
    assert ample["batch"] == 14  # no more rows than prompts
    assert sized(2**20)["batch"] == 1  # nothing left over the process itself: one row at a time
    per_seq = ample["mem_per_seq_mib"] * 2**20
    used = ample["mem_used_mib"] * 2**20
    assert 1 < sized(int((used + 10.5 * per_seq) / 0.8))["batch"] < 14  # the cap bites: about 10 rows' worth


def test_bad_arguments_are_refused_at_submit_in_one_line(tmp_path: Path, prompts: Path) -> None:
    cases = [
        ({}, "pass prompts=FILE"),
        ({"prompts": str(tmp_path / "absent.jsonl")}, "No such file"),
        ({"prompts": str(prompts), "model": "sidetasks.models:nothing"}, "has no nothing"),
        ({"prompts": str(prompts), "model": str(tmp_path)}, "no config.json"),
        ({"prompts": str(prompts), "weights": str(tmp_path / "w.pt")}, "no such file"),
        ({"prompts": str(prompts), "top_p": 0.0}, "0 < top_p <= 1"),
    ]
    (tmp_path / "dup.jsonl").write_text('{"id": 1, "prompt": "a"}\n\n{"id": "1", "prompt": "b"}\n')
    cases.append(({"prompts": str(tmp_path / "dup.jsonl")}, "line 3: id '1' again"))
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message) as exc:
            Generate.check_args(**kwargs)
        assert "\n" not in str(exc.value)
    Generate.check_args(prompts=str(prompts), max_new_tokens=4)


def test_prompts_the_model_cannot_take_are_refused_at_submit_naming_the_file(tmp_path: Path) -> None:
    """A 1 MiB prompt, an empty one and token ids out of range were accepted, then failed the worker three times;
    a prompts file that is not UTF-8 gave a bare codec error naming no file (round 3, item 7)."""
    cases = {
        "long": (json.dumps({"id": "big", "prompt": "x" * (1 << 20)}), "prompt 'big': 1048576 tokens"),
        "empty": (json.dumps({"id": "e", "prompt": ""}), "line 1: prompt 'e' is empty"),
        "no tokens": (json.dumps({"id": "e", "tokens": []}), "line 1: prompt 'e' is empty"),
        "range": (json.dumps({"id": "r", "tokens": [1, 256]}),
                  "prompt 'r': token 256 is outside the model's ids 0..255"),
        "negative": (json.dumps({"id": "n", "tokens": [-3]}), "line 1: prompt 'n': tokens must be ids >= 0"),
        "not ids": (json.dumps({"id": "s", "tokens": ["a"]}), "line 1: prompt 's': tokens must be ids >= 0"),
        "not text": (json.dumps({"id": "t", "prompt": 5}), "line 1: prompt 't': \"prompt\" must be text"),
    }
    for name, (line, message) in cases.items():
        path = tmp_path / f"{name.replace(' ', '-')}.jsonl"
        path.write_text(line + "\n")
        with pytest.raises(ValueError, match=message) as exc:
            Generate.check_args(prompts=str(path))
        assert str(path) in str(exc.value) and "\n" not in str(exc.value), exc.value
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt line 1: not UTF-8") as exc:
        Generate.check_args(prompts=str(latin))
    assert "UTF-8" in str(exc.value)


def test_a_prompt_found_too_long_only_at_setup_fails_at_once_without_a_restart(tmp_path: Path) -> None:
    """What only the loaded model can tell (its positions, its vocabulary) is a PermanentError in setup()."""
    prompts = tmp_path / "prompts.jsonl"
    model = UNDECLARED
    for line, message in [({"id": "big", "prompt": "x" * 2000}, "prompt 'big': 2000 tokens"),
                          ({"id": "r", "tokens": [300]}, "prompt 'r': token 300 is outside the model's ids 0..255")]:
        prompts.write_text(json.dumps(line) + "\n")
        Generate.check_args(prompts=str(prompts), model=model)  # the factory declares nothing: accepted
        with pytest.raises(PermanentError, match=message):
            started(Generate(prompts=str(prompts), out=str(tmp_path / "out.jsonl"), model=model), tmp_path)


# -- through a real agent -------------------------------------------------------------------------------------------
def test_generate_killed_by_sigkill_resumes_and_completes_every_prompt_once(
    agent: AgentProcess, client: AgentClient, tmp_path: Path
) -> None:
    write_prompts(tmp_path / "prompts.jsonl", 60)
    out = tmp_path / "out.jsonl"
    args = {"prompts": tmp_path / "prompts.jsonl", "out": out, "max_new_tokens": 16, "max_batch": 4}
    info = client.submit(S.TaskSpec(ref="sidetasks.generate:Generate", args={k: str(v) for k, v in args.items()}))
    wait_for_task(client, info.id, [S.TASK_STATE_READY])
    # Short bubbles: a few prompts a window, so that the kill lands between a checkpoint and the last prompt even
    # on a fast, quiet machine (150 ms windows let it finish all 60 within two).
    with BackgroundTrainer(agent, [20.0, 20.0]):
        running = wait_for_checkpointed(client, info.id, "prompts_done", 10, 90.0)
        os.kill(running.pid, signal.SIGKILL)  # wherever it is: mid-unit, mid-write or between steps
        written = out.read_text()
        done = wait_for_task(client, info.id, [S.TASK_STATE_DONE], timeout_s=90)
    assert running.progress["prompts_done"] < 60 and done.restarts == 1
    assert out.read_text().startswith(written[: written.rfind("\n") + 1])  # nothing written before the kill changed
    assert sorted(completions(out)) == sorted(f"q{i}" for i in range(60))  # every prompt, each once
    assert done.progress["prompts_done"] == 60 and done.progress["batch"] == 4 and done.progress["tokens_per_s"] > 0


def test_a_prompt_the_loaded_model_cannot_take_fails_the_task_with_no_restart(
    agent: AgentProcess, client: AgentClient, tmp_path: Path
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "r", "tokens": [300]}) + "\n")
    args = {"prompts": str(prompts), "out": str(tmp_path / "out.jsonl"), "model": UNDECLARED}
    info = client.submit(S.TaskSpec(ref="sidetasks.generate:Generate", args=args))
    failed = wait_for_task(client, info.id, [S.TASK_STATE_FAILED], timeout_s=90)
    assert failed.restarts == 0, failed.reason
    assert failed.reason == f"setup(): prompts={prompts}: prompt 'r': token 300 is outside the model's ids 0..255"


def eos_decoder() -> torch.nn.Module:
    """The byte decoder, declaring an end-of-sequence token the way a Hugging Face model does (`eos_token_id`):
    the one in $EOS_FOR_TEST (this file is loaded again by the task's loader: a module global would not reach it)."""
    model = byte_decoder()
    model.eos_token_id = int(os.environ["EOS_FOR_TEST"])  # type: ignore[assignment]
    return model


def test_a_model_declaring_an_end_of_sequence_token_stops_there_unless_told_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "q", "prompt": "def"}) + "\n")
    plain = started(Generate(prompts=str(prompts), out=str(tmp_path / "plain.jsonl"), max_new_tokens=6,
                             max_step_ms=60_000), tmp_path, window_s=1000.0)
    run(plain)
    first = completions(tmp_path / "plain.jsonl")["q"]
    assert (len(first["tokens"]), first["finish"]) == (6, "length")  # the byte decoder declares none
    eos = first["tokens"][0]  # the model's end-of-sequence token below: its first greedy token
    monkeypatch.setenv("EOS_FOR_TEST", str(eos))
    model = f"{__file__}:eos_decoder"
    stops = started(Generate(prompts=str(prompts), out=str(tmp_path / "eos.jsonl"), model=model, max_new_tokens=6,
                             max_step_ms=60_000), tmp_path, window_s=1000.0)
    assert stops.sampling.stop_token == eos  # -1 became the model's own token
    run(stops)
    stopped = completions(tmp_path / "eos.jsonl")["q"]
    assert (stopped["tokens"], stopped["finish"]) == ([], "stop")  # it ended at its first token (not written out)
    goes_on = started(Generate(prompts=str(prompts), out=str(tmp_path / "none.jsonl"), model=model, max_new_tokens=6,
                               stop_token=-2, max_step_ms=60_000), tmp_path, window_s=1000.0)
    run(goes_on)
    assert completions(tmp_path / "none.jsonl")["q"]["tokens"] == first["tokens"]
    with pytest.raises(ValueError, match="stop_token"):
        Generate(prompts=str(prompts), stop_token=-3)
