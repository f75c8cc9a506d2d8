"""The models that `sidetasks.generate` and `sidetasks.evaluate` run: how they are named, loaded and called.

A model is named by `model=`:
- `package.module:callable` or `path/to/file.py:callable`: a factory called with no arguments that returns a
  torch `nn.Module`; `weights=PATH` then loads a state dict into it (`torch.load(PATH)`, or its "model" entry);
- a directory: a local Hugging Face causal LM (`transformers` installed; `local_files_only=True`, nothing is
  downloaded; its tokenizer optional), through `sidetasks.hf.HFCausalLM`.

A language model's forward signature (the KV-cache protocol the decoder batches over):

    forward(tokens, positions, mask, cache) -> (logits, cache)

    tokens     LongTensor [B, T]   the new tokens of each row
    positions  LongTensor [B, T]   each new token's position in its own sequence (rows are left-padded)
    mask       BoolTensor [B, S+T] True where a key is a real token: the S cached ones, then the T new ones
    cache      None, or a list of tensors [B, heads, S, head_dim] (e.g. keys and values per layer)
    logits     FloatTensor [B, T, vocab]; cache: the same list with the T new entries appended (dim 2)

A new token attends to the cached and new keys that the mask allows and that are not after it. The decoder
selects rows (dim 0) and left-pads or trims columns (dim 2) of every cache tensor: nothing else about the cache
is assumed. Text is turned into ids by the model's own `encode(str) -> list[int]` and `decode(list[int]) -> str`
when it has them, else as UTF-8 bytes (the model's vocabulary must then hold 256 ids). A classifier (for
`sidetasks.evaluate` over images) is `forward(images [B, C, H, W]) -> logits [B, classes]`.

What prompts a model can take (`Limits`: its ids, its positions) is known before it is built from a Hugging
Face directory's config.json, or from a factory that declares it (`@declares(Limits(...))`, as `byte_decoder`
does): `Generate` then refuses a prompt that does not fit at submit, not after a worker loaded the model.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
from torch import nn
from torch.nn import functional as F

from sidetasks.hf import HFCausalLM, check_directory

VOCAB = 256
MAX_LEN = 1024  # the shipped byte decoder's positions

_Factory = TypeVar("_Factory", bound=Callable[..., Any])


@dataclass(frozen=True)
class Limits:
    """What a prompt must fit: ids below `vocab`, prompt and new tokens within `max_len` (None: not known)."""

    vocab: int | None
    max_len: int | None
    bytes_are_tokens: bool = False  # no tokenizer: a text prompt's ids are its UTF-8 bytes


def declares(limits: Limits) -> Callable[[_Factory], _Factory]:
    """Mark a model factory with the limits of the model it builds, so they are known without building it."""
    def mark(factory: _Factory) -> _Factory:
        factory.__dict__["limits"] = limits
        return factory
    return mark


def declared_limits(model: str) -> Limits | None:
    """The limits of the model `model` names, known without building it (None where nothing declares them)."""
    if ":" not in model:
        try:
            config = json.loads((Path(model) / "config.json").read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(config, dict):
            return None
        return Limits(_whole(config.get("vocab_size")), _whole(config.get("max_position_embeddings",
                                                                          config.get("n_positions"))))
    module_part, _, name = model.rpartition(":")
    limits = getattr(_resolve(module_part, name), "limits", None)
    return limits if isinstance(limits, Limits) else None


def _whole(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def check_model(model: str, weights: str = "") -> None:
    """Refuse, in one line, a model that cannot be loaded: a malformed reference, a missing file or directory."""
    if not model:
        raise ValueError("pass model=package.module:factory, model=file.py:factory or model=DIR (a local Hugging "
                         "Face model)")
    if weights and not Path(weights).is_file():
        raise ValueError(f"weights={weights}: no such file")
    if ":" not in model:
        directory = Path(model)
        if not directory.is_dir():
            raise ValueError(f"model={model} is neither package.module:factory nor a directory")
        check_directory(model)
        return
    module_part, _, name = model.rpartition(":")
    if module_part.endswith(".py") and not Path(module_part).is_file():
        raise ValueError(f"model={model}: {module_part} is not a file")
    if not callable(_resolve(module_part, name)):
        raise ValueError(f"model={model}: {name} is not callable")


def load_model(model: str, weights: str = "", device: str | torch.device = "cpu") -> nn.Module:
    """The model named by `model` (see the module's docstring), weights loaded, in eval mode on `device`."""
    if ":" not in model:
        return HFCausalLM(model).to(device).eval()
    module_part, _, name = model.rpartition(":")
    built = _resolve(module_part, name)()
    if not isinstance(built, nn.Module):
        raise TypeError(f"model={model} returned {type(built).__name__}, not a torch nn.Module")
    if weights:
        state = torch.load(weights, map_location="cpu", weights_only=True)
        built.load_state_dict(state["model"] if isinstance(state, dict) and "model" in state else state)
    return built.to(device).eval()


def _resolve(module_part: str, name: str) -> Callable[[], Any]:
    if module_part.endswith(".py"):
        path = Path(module_part).resolve()
        module_name = f"_freeride_model_{abs(hash(str(path)))}"
        module = sys.modules.get(module_name)
        if module is None:
            spec = importlib.util.spec_from_file_location(module_name, path)
            if spec is None or spec.loader is None:
                raise ValueError(f"cannot import {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_part)
    found = getattr(module, name, None)
    if found is None:
        raise ValueError(f"{module_part} has no {name}")
    return cast(Callable[[], Any], found)


def encoder(model: nn.Module) -> tuple[Callable[[str], list[int]], Callable[[list[int]], str | None]]:
    """The model's own encode/decode (a Hugging Face model without a tokenizer decodes to None), or UTF-8 bytes."""
    enc, dec = getattr(model, "encode", None), getattr(model, "decode", None)
    if callable(enc) and callable(dec):
        return enc, dec
    return _utf8_encode, _utf8_decode


def _utf8_encode(text: str) -> list[int]:
    return list(text.encode())


def _utf8_decode(ids: list[int]) -> str:
    return bytes(i for i in ids if 0 <= i < VOCAB).decode("utf-8", errors="replace")


# -- the shipped model: the demo's byte-level transformer, with a KV cache -------------------------------------------
class _Block(nn.Module):
    """Pre-norm self-attention and MLP, as in freeride's demo pipeline (freeride.tooling.bench.lm)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, k_past: torch.Tensor | None,
                v_past: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, dim = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        if k_past is not None and v_past is not None:
            k, v = torch.cat([k_past, k], dim=2), torch.cat([v_past, v], dim=2)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, dim))
        return x + self.mlp(self.ln2(x)), k, v


class ByteDecoder(nn.Module):
    """A byte-level decoder-only transformer (256 ids) with learned positions, following the KV-cache protocol."""

    def __init__(self, dim: int = 128, layers: int = 4, heads: int = 4, max_len: int = MAX_LEN) -> None:
        super().__init__()
        self.max_len = max_len
        self.embed = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(_Block(dim, heads) for _ in range(layers))
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, VOCAB))

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                cache: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        t = tokens.shape[1]
        past = mask.shape[1] - t
        x = self.embed(tokens) + self.pos(positions.clamp(0, self.max_len - 1))
        causal = torch.ones(t, past + t, dtype=torch.bool, device=tokens.device).tril(past)
        # A query that is itself padding would see no key (softmax over nothing: NaN, which a zero attention
        # weight does not cancel in a later row): it sees itself; its output is never used.
        own = torch.zeros_like(causal)
        own[:, past:] = torch.eye(t, dtype=torch.bool, device=tokens.device)
        allowed = ((causal[None] & mask[:, None, :]) | own[None])[:, None]  # [B, 1, T, S+T]
        out: list[torch.Tensor] = []
        for i, block in enumerate(self.blocks):
            k_past = cache[2 * i] if cache is not None else None
            v_past = cache[2 * i + 1] if cache is not None else None
            x, k, v = block(x, allowed, k_past, v_past)
            out += [k, v]
        return self.head(x), out


@declares(Limits(VOCAB, MAX_LEN, bytes_are_tokens=True))
def byte_decoder() -> ByteDecoder:
    """The shipped factory (`model=sidetasks.models:byte_decoder`): 4 blocks of width 128, seeded weights.

    Untrained (its output is deterministic but not text) unless `weights=` names a state dict of it.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return ByteDecoder()


def lm_loss(model: nn.Module, tokens: torch.Tensor) -> tuple[float, int]:
    """Summed next-token cross-entropy (nats) over `tokens` [B, T] through the protocol's forward, and its count."""
    b, t = tokens.shape
    positions = torch.arange(t, device=tokens.device).expand(b, t)
    mask = torch.ones(b, t, dtype=torch.bool, device=tokens.device)
    logits, _ = model(tokens[:, :-1], positions[:, :-1], mask[:, :-1], None)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1), reduction="sum")
    return float(loss), b * (t - 1)


def perplexity(loss_per_token: float) -> float:
    return math.exp(min(loss_per_token, 700.0))
