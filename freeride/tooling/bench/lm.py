"""A small byte-level transformer language model, split into pipeline stages, and the text it learns.

Real compute for the demo's pipeline (attention, MLPs, cross-entropy over 256 byte values),
sized by a few numbers so one step is real work on a CPU core. The corpus is text that ships
with Python: the source of a few standard-library modules (nothing is downloaded), with a
generated fallback for installations without sources.
"""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path
from typing import Any

VOCAB = 256  # bytes
_WORDS = "the pipeline stage waits while its neighbour computes and a side task runs in the bubble"
_SOURCES = ("argparse.py", "inspect.py", "textwrap.py", "dataclasses.py", "functools.py", "json/decoder.py")


def corpus(min_bytes: int = 200_000) -> bytes:
    """Standard-library sources as training text; a generated corpus where they are not installed."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for name in _SOURCES:
        try:
            parts.append((root / name).read_bytes())
        except OSError:
            continue
    text = b"\n".join(parts)
    if len(text) >= min_bytes:
        return text
    return _generated(min_bytes)


def _generated(n_bytes: int) -> bytes:
    rng = random.Random(0)
    words = _WORDS.split(" ")
    out: list[str] = []
    size = 0
    while size < n_bytes:
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 12))).capitalize() + ". "
        out.append(sentence)
        size += len(sentence)
    return "".join(out).encode()


def build_stages(num_stages: int, layers_per_stage: int, dim: int, heads: int, seq_len: int) -> list[Any]:
    """One module per stage: embedding + blocks, blocks, ..., blocks + norm + byte logits."""
    import torch
    from torch import nn
    from torch.nn import functional

    class Block(nn.Module):
        """Pre-norm causal self-attention and MLP."""

        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

        def forward(self, x: Any) -> Any:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
            a = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, dim))
            return x + self.mlp(self.ln2(x))

    class Stage(nn.Module):
        def __init__(self, first: bool, last: bool) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, dim) if first else None
            self.pos = nn.Parameter(torch.zeros(seq_len, dim)) if first else None
            self.blocks = nn.Sequential(*(Block() for _ in range(layers_per_stage)))
            self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, VOCAB)) if last else None

        def forward(self, x: Any) -> Any:
            if self.embed is not None and self.pos is not None:
                x = self.embed(x) + self.pos[: x.shape[1]]
            x = self.blocks(x)
            return self.head(x) if self.head is not None else x

    return [Stage(s == 0, s == num_stages - 1) for s in range(num_stages)]


def loss_fn(logits: Any, target: Any) -> Any:
    """Next-byte cross-entropy (nats per byte)."""
    from torch.nn import functional

    return functional.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))


def batch(text_tensor: Any, size: int, seq_len: int, generator: Any) -> tuple[Any, Any]:
    """`size` random windows of the text: inputs and the same windows shifted by one byte."""
    import torch

    starts = torch.randint(0, text_tensor.numel() - seq_len - 1, (size,), generator=generator)
    windows = torch.stack([text_tensor[s : s + seq_len + 1] for s in starts.tolist()])
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
