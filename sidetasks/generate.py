"""Batch generation in the bubbles: prompts in, completions out, with a KV cache and continuous batching.

Generate: the prompts of one file, on one GPU (or CPU). Each step runs as many units of the decoder
(`sidetasks.decoding`: a prefill of the prompts joining the batch, or one token for every row) as fit
the rest of the bubble (`freeride.StepBudget`). The batch width is sized once, at setup, from the
memory cap (weights and the process measured, then the KV cache and activations of one sequence
estimated) and `max_batch`; progress() says it. A completion is one line of the output JSONL
(`{"id", "completion", "tokens", "finish"}`), written the moment its sequence ends (`sidetasks.jsonl`);
an id found in the output is never generated again. The checkpoint holds the decoder: the prompts
admitted, the rows in flight with their tokens, sampling generators and KV cache. So a pause or cancel
loses nothing, and a crash or kill -9 loses only the units since the last checkpoint, never a finished
completion; a run cut into many bubbles, or paused and resumed, writes the same completions as one
that ran in one go.

GeneratePool: the same generation over a Redis pool whose items are the prompts (`freeride submit
--all`): one prompt per `process()` (a batch of one, no continuous batching across items), its
completion published as `out_dir/<id>.json` before the item is acknowledged. A completion is a pure
function of the prompt, the model and the sampling arguments, so an item processed twice (taken over
from a dead worker) writes the same bytes: exactly one completion per prompt.
`python -m sidetasks.generate collect OUT_DIR` prints them as one JSONL.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from freeride import IterativeTask, PermanentError, PoolItem, PoolTask, StepBudget
from sidetasks.decoding import Completion, Decoder, Prompt, Sampling, with_model_stop
from sidetasks.files import publish, sweep
from sidetasks.hf import has_tokenizer, no_tokenizer
from sidetasks.jsonl import Lines
from sidetasks.models import Limits, check_model, declared_limits, encoder, load_model
from sidetasks.prompts import fit_problem, known_tokens, prompt_tokens, read_prompts

DEFAULT_MODEL = "sidetasks.models:byte_decoder"


def completion_record(c: Completion, decode: Callable[[list[int]], str | None]) -> dict[str, Any]:
    return {"id": c.id, "completion": decode(c.tokens), "tokens": c.tokens, "finish": c.finish}


def _check_common(kwargs: Mapping[str, Any]) -> None:
    check_model(str(kwargs.get("model", DEFAULT_MODEL)), str(kwargs.get("weights", "")))
    Sampling(int(kwargs.get("max_new_tokens", 64)), float(kwargs.get("temperature", 0.0)),
             float(kwargs.get("top_p", 1.0))).check()


def _resolve_device(arg: str, assigned: str, threads: int) -> torch.device:
    """The device to run on; on the CPU, `threads` torch threads (the trainer's cores are not the task's: with
    two threads on a loaded 2-core host a decode took 85 ms instead of 4)."""
    device = torch.device(assigned if arg == "auto" else arg)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device={arg!r} but torch sees no CUDA device (use device=cpu)")
    if device.type == "cpu" and threads > 0:
        torch.set_num_threads(threads)
    return device


class Generate(IterativeTask):
    """Completes every prompt of `prompts` into `out` (JSONL); progress: prompts done, sequences in flight, tokens/s."""

    mem_limit_bytes = 1024 * 2**20  # weights, KV cache and activations: the batch is sized to fit the cap

    def __init__(self, prompts: str = "", out: str = "", model: str = DEFAULT_MODEL,
                 weights: str = "", max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int = 0, stop_token: int = -1, max_batch: int = 16, device: str = "cpu",
                 max_step_ms: float = 10.0, threads: int = 1) -> None:
        if max_batch < 1 or max_step_ms <= 0:
            raise ValueError("need max_batch >= 1 and max_step_ms > 0")
        self.sampling = Sampling(max_new_tokens, temperature, top_p, seed, stop_token)
        self.sampling.check()
        self.prompts_arg, self.out_arg, self.model_arg, self.weights = prompts, out, model, weights
        self.max_batch, self.device_arg, self.threads = max_batch, device, threads
        self.budget = StepBudget(max_step_ms / 1e3)
        self.busy_s = 0.0
        self._unit_s: deque[float] = deque(maxlen=64)

    @classmethod
    def check_args(cls, **kwargs: Any) -> None:
        if not kwargs.get("prompts"):
            raise ValueError("pass prompts=FILE (JSON lines {\"id\": ..., \"prompt\": \"text\"}, or one prompt a line)")
        path = str(kwargs["prompts"])
        try:
            prompts = read_prompts(path)
        except OSError as exc:
            raise ValueError(f"prompts={path}: {exc.strerror or exc}") from None
        if not prompts:
            raise ValueError(f"prompts={path} holds no prompt")
        _check_common(kwargs)
        model = str(kwargs.get("model", DEFAULT_MODEL))
        if ":" not in model and not has_tokenizer(model) and any("tokens" not in args for _, args in prompts):
            raise no_tokenizer(model)
        # What the model declares without being built (the shipped one does): a prompt it cannot take is refused
        # here, not after a worker loaded the model; the worker checks the rest against the model it built.
        limits = declared_limits(model)
        if limits is None:
            return
        for prompt_id, args in prompts:
            tokens = known_tokens(args, limits)
            problem = fit_problem(prompt_id, tokens, int(kwargs.get("max_new_tokens", 64)), limits) if tokens else ""
            if problem:
                raise ValueError(f"prompts={path}: {problem}")

    # -- lifecycle -----------------------------------------------------------------------------------------------
    def setup(self) -> None:
        self.device = _resolve_device(self.device_arg, self.context.device, self.threads)
        self.budget.track(self.device)  # on a GPU: one unit's kernels in flight at most
        self.model = load_model(self.model_arg, self.weights, self.device)
        self.encode, self.decode = encoder(self.model)
        prompts = self._prompts()
        self.lines = Lines(Path(self.out_arg) if self.out_arg else self._default_out())
        finished = frozenset(str(r["id"]) for r in self.lines.existing)
        self.done_before = len(finished & {p.id for p in prompts})
        self.total = len(prompts)
        self.sampling = with_model_stop(self.sampling, self.model)
        self.width, self.per_seq_bytes, self.used_bytes = self._size_batch(prompts, self.vocab)
        self.decoder = Decoder(self.model, prompts, self.sampling, self.width, self.device, skip=finished)
        self.written = 0

    def _default_out(self) -> Path:
        ckpt = self.context.checkpoint_path
        if not ckpt:
            raise ValueError("no out given and the task has no checkpoint path to put its output beside")
        path = Path(ckpt)
        return path.with_name(path.stem + "-completions.jsonl")

    def _prompts(self) -> list[Prompt]:
        """The prompts, each checked against the model built: one it cannot take would fail every restart the same
        way (or, on a GPU, hit a device-side assert), so it is a PermanentError, naming the file and prompt."""
        try:
            read = read_prompts(self.prompts_arg)  # an OSError is not permanent: the file may come back
            prompts = [Prompt(i, prompt_tokens(i, a, self.encode)) for i, a in read]
        except ValueError as exc:
            raise PermanentError(f"prompts={self.prompts_arg}: {exc}") from None
        max_len = getattr(self.model, "max_len", None)
        self.vocab = self._vocab()
        limits = Limits(self.vocab, max_len if isinstance(max_len, int) else None)
        for p in prompts:
            problem = fit_problem(p.id, p.tokens, self.sampling.max_new_tokens, limits)
            if problem:
                raise PermanentError(f"prompts={self.prompts_arg}: {problem}")
        return prompts

    def _vocab(self) -> int:
        """The model's vocabulary: the width of its logits for one token."""
        one = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        logits, _ = self.model(one, one, torch.ones(1, 1, dtype=torch.bool, device=self.device), None)
        return int(logits.shape[-1])

    def _size_batch(self, prompts: list[Prompt], vocab: int) -> tuple[int, int, int]:
        """The batch width that fits the memory cap, the bytes one sequence is estimated to need, and the bytes the
        process held before it (the width: what 80 % of the cap leaves over those, in sequences, 1 at least).

        Measured: the process (torch, the weights) after a warm-up prefill and decode of the longest prompt,
        which also makes the first real step as fast as the rest, and the KV cache bytes per token. Estimated
        per sequence: its cache at full length twice (a decode concatenates a copy), and the activations of
        its prefill (a cache's worth and 8 bytes a vocabulary entry, per prompt token)."""
        longest = max(len(p.tokens) for p in prompts)
        warm = Decoder(self.model, [Prompt("warm-up", [0] * longest)], Sampling(2), 1, self.device)
        warm.unit()
        kv_per_token = warm.cache_bytes() / longest
        warm.unit()
        per_seq = int(2 * kv_per_token * (longest + self.sampling.max_new_tokens)
                      + longest * (kv_per_token + 8 * vocab))
        cap = self.context.mem_limit_bytes or self.mem_limit_bytes
        used = self._used_bytes()
        return max(1, min(self.max_batch, len(prompts), int((0.8 * cap - used) // per_seq))), per_seq, used

    def _used_bytes(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.memory_allocated(self.device))
        import psutil

        return int(psutil.Process().memory_info().rss)

    def step(self) -> None:
        self.budget.start(self.context.remaining_s(), window=self.context.remaining_s)
        start = last = time.perf_counter()
        while True:
            for c in self.decoder.unit():
                self.lines.append(completion_record(c, self.decode))
                self.written += 1
            now = time.perf_counter()
            self._unit_s.append(now - last)
            last = now
            if self.decoder.done() or not self.budget.another():
                break
        self.busy_s += time.perf_counter() - start

    def is_done(self) -> bool:
        return self.decoder.done()

    def min_step_s(self) -> float | None:
        """One unit: the median of the recent ones, half again for the odd slow one (a prefill)."""
        if len(self._unit_s) < 5:
            return None
        return 1.5 * sorted(self._unit_s)[len(self._unit_s) // 2]

    def teardown(self) -> None:
        lines = getattr(self, "lines", None)
        if lines is not None:
            lines.close()

    def progress(self) -> Mapping[str, float]:
        done = self.done_before + self.written
        return {
            "prompts_done": float(done),
            "prompts": float(self.total),
            "done": done / self.total if self.total else 1.0,
            "in_flight": float(len(self.decoder.rows)),
            "batch": float(self.width),  # the width the memory cap allows (at most max_batch)
            "mem_per_seq_mib": self.per_seq_bytes / 2**20,
            "mem_used_mib": self.used_bytes / 2**20,  # what the process held when the width was chosen
            "kv_cache_mib": self.decoder.cache_bytes() / 2**20,
            "tokens": float(self.decoder.tokens_generated),
            "tokens_per_s": self.decoder.tokens_generated / self.busy_s if self.busy_s > 0 else 0.0,
        }

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def state_dict(self) -> Mapping[str, Any]:
        self.lines.sync()  # every completion the checkpoint counts is on disk before it
        return {"decoder": self.decoder.state_dict(), "busy_s": self.busy_s, "width": self.width}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if int(state["width"]) != self.width:  # another cap: the rows in flight still fit, the next ones follow
            self.decoder.width = self.width
        self.decoder.load_state_dict(state["decoder"])
        self.busy_s = float(state["busy_s"])


class GeneratePool(PoolTask):
    """Completes the prompts of a pool (item args: "prompt" or "tokens"), one `out_dir/<id>.json` each."""

    mem_limit_bytes = 1024 * 2**20

    def __init__(self, pool: str, out_dir: str = "", model: str = DEFAULT_MODEL,
                 weights: str = "", max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int = 0, stop_token: int = -1, device: str = "cpu", threads: int = 1) -> None:
        super().__init__(pool)
        self.threads = threads
        if not out_dir:
            raise ValueError("pass out_dir=DIR (where each prompt's completion is written)")
        self.sampling = Sampling(max_new_tokens, temperature, top_p, seed, stop_token)
        self.sampling.check()
        self.out_dir, self.model_arg, self.weights, self.device_arg = Path(out_dir), model, weights, device
        self.model: torch.nn.Module | None = None

    @classmethod
    def check_args(cls, **kwargs: Any) -> None:
        _check_common(kwargs)
        super().check_args(**kwargs)

    def setup(self) -> None:
        self.device = _resolve_device(self.device_arg, self.context.device, self.threads)
        self.model = load_model(self.model_arg, self.weights, self.device)
        self.encode, self.decode = encoder(self.model)
        self.sampling = with_model_stop(self.sampling, self.model)
        self._generate(Prompt("warm-up", [0]))  # the first item is then as fast as the rest
        sweep(self.out_dir)  # what a worker killed mid-write left (a live one's is kept)

    def teardown(self) -> None:
        super().teardown()
        sweep(self.out_dir)

    def _generate(self, prompt: Prompt) -> Completion:
        assert self.model is not None
        decoder = Decoder(self.model, [prompt], self.sampling, 1, self.device)
        while True:
            finished = decoder.unit()
            if finished:
                return finished[0]

    def process(self, item: PoolItem) -> None:
        completion = self._generate(Prompt(item.id, prompt_tokens(item.id, item.args, self.encode)))
        record = completion_record(completion, self.decode)
        publish(output_path(self.out_dir, item.id), (json.dumps(record, ensure_ascii=False, sort_keys=True)
                                                     + "\n").encode())


def output_path(out_dir: Path, item_id: str) -> Path:
    """`out_dir/<id, percent-encoded>.json`: one flat file per prompt, whatever characters its id holds."""
    return out_dir / (urllib.parse.quote(item_id, safe="") + ".json")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sidetasks.generate")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="print GeneratePool's completions in OUT_DIR as one JSONL, by id")
    c.add_argument("out_dir", type=Path)
    ns = p.parse_args(argv)
    if not ns.out_dir.is_dir():
        print(f"{ns.out_dir} is not a directory; pass GeneratePool's out_dir", file=sys.stderr)
        return 2
    for path in sorted(ns.out_dir.glob("*.json")):
        sys.stdout.write(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
