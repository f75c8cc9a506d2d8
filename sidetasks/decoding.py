"""Continuous batching over a KV cache: prompts join the batch as rows free up, finished rows leave.

One *unit* of work is one batched forward: either a prefill (the prompts that join, when a row is free
and prompts are waiting; each samples its first token) or a decode (one new token for every row).
Which unit comes next depends only on the units done before it: the batch width is fixed when the
decoder is made (from the memory cap, not from the window), prompts join in list order, a row leaves
the moment it has `max_new_tokens` or its stop token. So grouping units into steps (short bubbles,
long bubbles, a pause and a resume) never changes a completion: greedy output is the same, bit for
bit, whether a run is cut into many bubbles or runs in one go, and sampled output too (each row
samples from its own generator, seeded by (seed, prompt id), its state kept in the checkpoint).

Rows are left-padded to the longest cache in the batch; the cache columns that no row uses any more
are trimmed when rows leave. The model follows the protocol of `sidetasks.models`.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: greedy (temperature 0) or sampled with temperature and top-p."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop_token: int = -1  # -1: the model's end-of-sequence token (`eos_token_id`) if it has one, else none; -2: none

    def check(self) -> None:
        if self.max_new_tokens < 1 or self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("need max_new_tokens >= 1, temperature >= 0 and 0 < top_p <= 1")
        if self.stop_token < -2:
            raise ValueError("stop_token is a token id, -1 (the model's end-of-sequence token, if any) or -2 (none)")


@dataclass
class Prompt:
    id: str
    tokens: list[int]


@dataclass
class Row:
    """A sequence in the batch: its prompt, what it generated so far, its sampling generator."""

    prompt: Prompt
    out: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None

    @property
    def length(self) -> int:
        return len(self.prompt.tokens) + len(self.out)


@dataclass(frozen=True)
class Completion:
    id: str
    tokens: list[int]
    finish: str  # "length" or "stop"


class Decoder:
    """Runs units of work over `prompts` (see the module's docstring) with at most `width` rows at once."""

    def __init__(self, model: nn.Module, prompts: list[Prompt], sampling: Sampling, width: int,
                 device: torch.device, skip: frozenset[str] = frozenset()) -> None:
        self.model, self.prompts, self.sampling, self.width, self.device = model, prompts, sampling, width, device
        self.skip = skip  # ids finished by an earlier run (read from the output): never generated again
        self.next_prompt = 0
        self.rows: list[Row] = []
        self.cache: list[torch.Tensor] | None = None
        self.mask = torch.zeros(0, 0, dtype=torch.bool, device=device)  # [rows, cache columns]
        self.tokens_generated = 0

    # -- the work ----------------------------------------------------------------------------------------------------
    def done(self) -> bool:
        return not self.rows and self._waiting() is None

    @torch.no_grad()
    def unit(self) -> list[Completion]:
        """One prefill or one decode; the completions that finished with it."""
        if len(self.rows) < self.width and self._waiting() is not None:
            self._prefill()
        elif self.rows:
            self._decode()
        return self._retire()

    def _waiting(self) -> int | None:
        """The index of the next prompt to admit, past those already finished."""
        while self.next_prompt < len(self.prompts) and self.prompts[self.next_prompt].id in self.skip:
            self.next_prompt += 1
        return self.next_prompt if self.next_prompt < len(self.prompts) else None

    def _prefill(self) -> None:
        joining: list[Row] = []
        while len(self.rows) + len(joining) < self.width and self._waiting() is not None:
            prompt = self.prompts[self.next_prompt]
            self.next_prompt += 1
            joining.append(Row(prompt, generator=self._generator(prompt.id)))
        longest = max(len(r.prompt.tokens) for r in joining)
        tokens = torch.zeros(len(joining), longest, dtype=torch.long)
        mask = torch.zeros(len(joining), longest, dtype=torch.bool)
        for i, r in enumerate(joining):
            n = len(r.prompt.tokens)
            tokens[i, longest - n:] = torch.tensor(r.prompt.tokens, dtype=torch.long)
            mask[i, longest - n:] = True
        tokens, mask = tokens.to(self.device), mask.to(self.device)
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)
        logits, cache = self.model(tokens, positions, mask, None)
        self._sample(joining, logits[:, -1])
        self._join(joining, list(cache), mask)

    def _decode(self) -> None:
        last = torch.tensor([[r.out[-1]] for r in self.rows], dtype=torch.long, device=self.device)
        positions = torch.tensor([[r.length - 1] for r in self.rows], dtype=torch.long, device=self.device)
        mask = torch.cat([self.mask, torch.ones(len(self.rows), 1, dtype=torch.bool, device=self.device)], dim=1)
        logits, cache = self.model(last, positions, mask, self.cache)
        self.cache, self.mask = list(cache), mask
        self._sample(self.rows, logits[:, -1])

    def _sample(self, rows: list[Row], logits: torch.Tensor) -> None:
        s = self.sampling
        if s.temperature == 0:
            picked = logits.argmax(dim=-1).tolist()
        else:
            probs = torch.softmax(logits.float() / s.temperature, dim=-1).cpu()
            picked = [_top_p_draw(probs[i], s.top_p, r.generator) for i, r in enumerate(rows)]
        for r, token in zip(rows, picked, strict=True):
            r.out.append(int(token))
        self.tokens_generated += len(rows)

    def _join(self, joining: list[Row], cache: list[torch.Tensor], mask: torch.Tensor) -> None:
        if self.cache is None or not self.rows:
            self.rows, self.cache, self.mask = joining, cache, mask
            return
        width = max(self.mask.shape[1], mask.shape[1])
        old = [_left_pad(c, width) for c in self.cache]
        new = [_left_pad(c, width) for c in cache]
        self.cache = [torch.cat([a, b], dim=0) for a, b in zip(old, new, strict=True)]
        self.mask = torch.cat([_left_pad(self.mask, width, dim=1), _left_pad(mask, width, dim=1)], dim=0)
        self.rows = self.rows + joining

    def _retire(self) -> list[Completion]:
        s = self.sampling
        finished: list[Completion] = []
        keep: list[int] = []
        for i, r in enumerate(self.rows):
            if s.stop_token >= 0 and r.out[-1] == s.stop_token:
                finished.append(Completion(r.prompt.id, r.out[:-1], "stop"))
            elif len(r.out) >= s.max_new_tokens:
                finished.append(Completion(r.prompt.id, r.out, "length"))
            else:
                keep.append(i)
        if finished:
            self._keep(keep)
        return finished

    def _keep(self, keep: list[int]) -> None:
        self.rows = [self.rows[i] for i in keep]
        if not keep or self.cache is None:
            self.rows, self.cache = [], None
            self.mask = torch.zeros(0, 0, dtype=torch.bool, device=self.device)
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        mask = self.mask.index_select(0, index)
        first = int(mask.any(dim=0).long().argmax())  # columns before it are padding in every row left
        self.mask = mask[:, first:]
        self.cache = [c.index_select(0, index)[:, :, first:] for c in self.cache]

    def _generator(self, prompt_id: str) -> torch.Generator | None:
        if self.sampling.temperature == 0:
            return None
        return torch.Generator().manual_seed(self.sampling.seed * 1_000_003 + zlib.crc32(prompt_id.encode()))

    # -- what a checkpoint holds -----------------------------------------------------------------------------------
    def cache_bytes(self) -> int:
        return sum(c.numel() * c.element_size() for c in self.cache or [])

    def state_dict(self) -> dict[str, Any]:
        cpu = torch.device("cpu")
        return {
            "next_prompt": self.next_prompt,
            "rows": [(r.prompt.id, list(r.out), r.generator.get_state() if r.generator is not None else None)
                     for r in self.rows],
            "cache": [c.to(cpu).clone() for c in self.cache] if self.cache is not None else None,
            "mask": self.mask.to(cpu).clone(),
            "tokens_generated": self.tokens_generated,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the batch as it was; rows whose prompt finished since (in `skip`) leave it at once."""
        by_id = {p.id: p for p in self.prompts}
        self.next_prompt = int(state["next_prompt"])
        self.rows = []
        for prompt_id, out, gen_state in state["rows"]:
            row = Row(by_id[prompt_id], list(out), self._generator(prompt_id))
            if row.generator is not None and gen_state is not None:
                row.generator.set_state(gen_state)
            self.rows.append(row)
        cache = state["cache"]
        self.cache = [c.to(self.device) for c in cache] if cache is not None else None
        self.mask = state["mask"].to(self.device)
        self.tokens_generated = int(state["tokens_generated"])
        gone = [i for i, r in enumerate(self.rows) if r.prompt.id in self.skip]
        if gone:
            self._keep([i for i in range(len(self.rows)) if i not in set(gone)])


def _top_p_draw(probs: torch.Tensor, top_p: float, generator: torch.Generator | None) -> int:
    """One draw from the smallest set of most likely tokens whose probability reaches top_p."""
    if top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        keep = (sorted_p.cumsum(0) - sorted_p) < top_p  # the token that crosses top_p is kept
        sorted_p = sorted_p * keep
        return int(order[torch.multinomial(sorted_p, 1, generator=generator)])
    return int(torch.multinomial(probs, 1, generator=generator))


def _left_pad(t: torch.Tensor, width: int, dim: int = 2) -> torch.Tensor:
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)



def with_model_stop(sampling: Sampling, model: object) -> Sampling:
    """`stop_token=-1` means the model's own end-of-sequence token when it declares one (`eos_token_id`: a Hugging
    Face model's), so a local HF model stops where `generate()` would; -2 (or a model without one) means no stop."""
    eos = getattr(model, "eos_token_id", None)
    if sampling.stop_token == -1 and isinstance(eos, int) and eos >= 0:
        return dataclasses.replace(sampling, stop_token=eos)
    return sampling
