"""A local Hugging Face model (`model=DIR`) in Generate and Evaluate, on transformers 5.x and 4.57.

Tiny models built from a config (GPT-2 and Llama: 2 layers, width 32, 128 ids) and saved to a temp dir, no hub.
Generate's completions, cut into short bubbles with checkpoint round trips, equal transformers' own greedy
`generate()`, stops at the end-of-sequence token included; prompts as token ids need no tokenizer, text without
one is refused at submit naming the directory; Evaluate scores the model's own state dict with the loss
transformers computes. The dev environment has transformers 5; the last test runs this file again in a
subprocess on transformers 4.57, installed once into the venv (`<venv>/freeride-hf4`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support.sidetasks import checkpoint, progress, resumed, run, started

from freeride import PermanentError
from sidetasks.evaluate import Evaluate
from sidetasks.generate import Generate
from sidetasks.hf import check_directory

transformers = pytest.importorskip("transformers", reason="transformers is in the dev extra: pip install -e '.[dev]'")

EXPECTED = os.environ.get("FREERIDE_TEST_TRANSFORMERS", "")  # set by the 4.x run: the version it must import
HF4_SPEC = "transformers>=4.57,<5"
MAX_NEW = 8


@pytest.fixture(autouse=True, scope="module")
def _the_transformers_asked_for() -> None:
    assert transformers.__version__.startswith(EXPECTED), f"imported transformers {transformers.__version__}"


def tiny_model(kind: str) -> Any:
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=64,
                                         bos_token_id=0, eos_token_id=0)
    else:
        config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                          bos_token_id=0, eos_token_id=0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


PROMPTS = [[(7 * i + 3 * j + 1) % 128 for j in range(1 + i % 5)] for i in range(9)]  # 1 to 5 ids


def greedy(model: Any, tokens: list[int]) -> list[int]:
    """transformers' own greedy completion: what follows the prompt, the end-of-sequence token included."""
    ids = torch.tensor([tokens])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW,
                             pad_token_id=0)
    return [int(t) for t in out[0, len(tokens):]]


def expected(model: Any, tokens: list[int]) -> tuple[list[int], str]:
    """`greedy` as a Generate record holds it: the end-of-sequence token is not written, the finish says it."""
    out = greedy(model, tokens)
    eos = model.generation_config.eos_token_id
    return (out[:-1], "stop") if out and out[-1] == eos else (out, "length")


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A tiny model saved without a tokenizer; its end-of-sequence token one that some prompts reach, so that
    rows stop at different units (and the batch refills)."""
    model = tiny_model(request.param)
    model.generation_config.eos_token_id = None
    runs = [greedy(model, p) for p in PROMPTS]
    eos = runs[1][3]  # the fourth token of one completion: it ends there, others sooner or never
    model.config.eos_token_id = model.generation_config.eos_token_id = eos
    directory = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(directory)
    return directory, model


def records(path: Path) -> dict[str, dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    by_id = {r["id"]: r for r in lines}
    assert len(by_id) == len(lines), "an id was written twice"
    return by_id


def write_token_prompts(path: Path) -> Path:
    path.write_text("".join(json.dumps({"id": f"q{i}", "tokens": p}) + "\n" for i, p in enumerate(PROMPTS)))
    return path


def generate(tmp_path: Path, directory: Path, out: str, prompts: Path, **args: Any) -> Generate:
    task = Generate(prompts=str(prompts), out=str(tmp_path / out), model=str(directory), max_new_tokens=MAX_NEW,
                    max_batch=3, **args)
    task.mem_limit_bytes = 16 * 2**30  # the width is max_batch, whatever this process's RSS
    return task


def test_generate_cut_into_bubbles_equals_transformers_greedy_generate_without_a_tokenizer(
    tmp_path: Path, saved: tuple[Path, Any]
) -> None:
    directory, model = saved
    prompts = write_token_prompts(tmp_path / "prompts.jsonl")
    Generate.check_args(prompts=str(prompts), model=str(directory), max_new_tokens=MAX_NEW)  # ids: no tokenizer

    whole = started(generate(tmp_path, directory, "whole.jsonl", prompts, max_step_ms=60_000), tmp_path, 1000.0)
    assert whole.model.eos_token_id == model.generation_config.eos_token_id
    run(whole)
    cut = started(generate(tmp_path, directory, "cut.jsonl", prompts), tmp_path)  # one unit per step
    steps = run(cut, steps=3)
    assert progress(cut)["kv_cache_mib"] > 0
    while not cut.is_done():  # a new worker from a checkpoint every few units, bubbles of varied length
        cut = resumed(generate(tmp_path, directory, "cut.jsonl", prompts), checkpoint(cut), tmp_path,
                      window_s=[0.001, 0.0][steps % 2])
        steps += run(cut, steps=3)
    assert steps > 10 and progress(cut)["batch"] == 3

    want = {f"q{i}": expected(model, p) for i, p in enumerate(PROMPTS)}
    assert {f for _, f in want.values()} == {"stop", "length"}  # some rows stopped early: the batch refilled
    for name in ("whole.jsonl", "cut.jsonl"):
        got = records(tmp_path / name)
        assert {k: (r["tokens"], r["finish"]) for k, r in got.items()} == want, name
        assert all(r["completion"] is None for r in got.values())  # no tokenizer: no text


def save_tokenizer(directory: Path) -> Any:
    """A character-level tokenizer over 96 printable ASCII characters (ids 32-127), built offline."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {chr(i): i for i in range(32, 128)} | {"<unk>": 1}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    backend.decoder = tokenizers.decoders.Fuse()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    tokenizer.save_pretrained(directory)
    return transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)


def test_text_prompts_need_a_tokenizer_in_the_directory_and_are_refused_at_submit_without_one(
    tmp_path: Path, saved: tuple[Path, Any]
) -> None:
    directory, model = saved
    prompts = tmp_path / "text-prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "def f(x):"}) + "\n"
                       + json.dumps({"id": "b", "tokens": [5, 6]}) + "\n")
    with pytest.raises(ValueError, match=f"model={directory} has no tokenizer") as exc:
        Generate.check_args(prompts=str(prompts), model=str(directory), max_new_tokens=MAX_NEW)
    assert "tokens" in str(exc.value) and "\n" not in str(exc.value)
    # and at setup, if it got there: for good (a restart would read the same files)
    with pytest.raises(PermanentError, match=f"model={directory} has no tokenizer"):
        started(generate(tmp_path, directory, "no.jsonl", prompts), tmp_path)

    with_tokenizer = tmp_path / "with-tokenizer"
    model.save_pretrained(with_tokenizer)
    tokenizer = save_tokenizer(with_tokenizer)
    Generate.check_args(prompts=str(prompts), model=str(with_tokenizer), max_new_tokens=MAX_NEW)
    task = started(generate(tmp_path, with_tokenizer, "text.jsonl", prompts, max_step_ms=60_000), tmp_path, 1000.0)
    run(task)
    got = records(tmp_path / "text.jsonl")
    ids = tokenizer.encode("def f(x):")
    assert ids == [ord(c) for c in "def f(x):"]
    assert (got["a"]["tokens"], got["a"]["finish"]) == expected(model, ids)
    assert got["a"]["completion"] == tokenizer.decode(got["a"]["tokens"])
    assert (got["b"]["tokens"], got["b"]["finish"]) == expected(model, [5, 6])


def test_evaluate_scores_the_models_own_state_dict_with_the_loss_transformers_computes(
    tmp_path: Path, saved: tuple[Path, Any]
) -> None:
    directory, model = saved
    ckpts, out, data = tmp_path / "ckpts", tmp_path / "evals.jsonl", tmp_path / "heldout.npy"
    ckpts.mkdir()
    ids = np.random.default_rng(0).integers(0, 128, size=10 * 17)
    np.save(data, ids)
    torch.manual_seed(1)
    trained = type(model)(model.config).eval()  # other weights than the directory's
    torch.save(trained.state_dict(), ckpts / "step-1.pt")  # what a training run of the HF model saves
    args = {"checkpoints": str(ckpts), "data": str(data), "out": str(out), "model": str(directory), "seq_len": 16,
            "batch": 4}
    Evaluate.check_args(**args)
    task = started(Evaluate(**args), tmp_path, window_s=0.002)
    for _ in range(200):
        if out.exists() and out.read_text():
            break
        task.step()
        assert task.reader.wait(30)  # the checkpoint is read off the steps (sidetasks/checkpoints.py)
    (line,) = [json.loads(x) for x in out.read_text().splitlines()]
    rows = torch.from_numpy(ids).view(10, 17)
    with torch.no_grad():
        direct = float(trained(input_ids=rows, labels=rows).loss)  # mean next-token cross-entropy
    assert (line["checkpoint"], line["tokens"], line["items"]) == ("step-1.pt", 160, 10)
    assert line["loss"] == pytest.approx(direct, rel=1e-5)


def test_without_transformers_the_submit_says_the_tasks_python_needs_it(
    tmp_path: Path, saved: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, _ = saved
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "transformers" else object())
    with pytest.raises(ValueError, match="not installed in the Python that runs this task") as exc:
        check_directory(str(directory))
    # the check runs in the task's Python (the agent's, or --python's): that one is named, with both ways out
    assert sys.executable in str(exc.value) and "pip install" in str(exc.value) and "--python" in str(exc.value)


def test_a_model_whose_cache_keeps_a_sliding_window_is_refused_at_setup_in_one_line(tmp_path: Path) -> None:
    config = transformers.MistralConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, sliding_window=4)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "mistral")
    prompts = write_token_prompts(tmp_path / "prompts.jsonl")
    with pytest.raises(ValueError, match="DynamicSlidingWindowLayer, not a plain full-attention one") as exc:
        started(generate(tmp_path, tmp_path / "mistral", "out.jsonl", prompts), tmp_path)
    assert f"model={tmp_path / 'mistral'}" in str(exc.value) and "\n" not in str(exc.value)


# -- the same tests on transformers 4.x ---------------------------------------------------------------------------
def _hf4() -> Path:
    """transformers 4.57 with its dependencies, installed once under the venv (a temp dir outside one)."""
    base = Path(sys.prefix) if sys.prefix != sys.base_prefix else Path(os.environ.get("TMPDIR", "/tmp"))
    target = base / "freeride-hf4"
    stamp = target / ".freeride-spec"
    if stamp.is_file() and stamp.read_text() == HF4_SPEC:
        return target
    partial = base / f"freeride-hf4.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    # --no-compile: byte-compiling all of transformers took 3/4 of the install; what is imported compiles on use
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           "--no-compile", "--target", str(partial), HF4_SPEC], capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        lines = [line for line in done.stderr.splitlines() if line.strip() and "is ignored" not in line]
        reason = f"pip could not install {HF4_SPEC}: {lines[-1] if lines else done.returncode}"
        if os.environ.get("CI"):
            pytest.fail(reason + " (CI must reach PyPI)")
        pytest.skip(reason)
    (partial / ".freeride-spec").write_text(HF4_SPEC)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


@pytest.mark.slow
@pytest.mark.background  # the tests above, in-process and judged by equality, and a pip install
@pytest.mark.timeout(600)
def test_the_same_on_transformers_4(tmp_path: Path) -> None:
    if EXPECTED:
        pytest.skip("this is the 4.x run")
    target = _hf4()
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(root)]),
           "FREERIDE_TEST_TRANSFORMERS": "4.57."}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--basetemp", str(tmp_path / "run"), __file__, "-k", "not transformers_4"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]
