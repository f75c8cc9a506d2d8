"""A local Hugging Face causal LM behind the KV-cache protocol of `sidetasks.models` (`model=DIR`).

Tested with transformers 4.57 and 5.x (`tests/side_tasks/test_hf_models.py` runs on both). The cache crosses
the protocol as freeride's flat list of tensors, keys and values per layer ([k0, v0, k1, v1, ...], each
[B, heads, S, head_dim]), so the decoder selects rows, pads and trims columns and checkpoints it the same as
any model's. Each forward wraps that list in a fresh `DynamicCache` (`update(k, v, layer)` per layer: the same
call in 4.57 and 5.x, where 4.x's `from_legacy_cache`/`to_legacy_cache` are gone) and reads the new one back
from `cache.layers[i].keys/.values` (4.57 and 5.x alike). The forward's cache argument is `past_key_values`,
or `cache` where the model takes that name (5.x renames it), and so is the output's field.

Only plain full-attention caches fit the protocol (GPT-2, Llama, Qwen2, ...): a model whose cache keeps a
sliding window, recurrent state or shared layers is refused at its first forward, in one line.

The tokenizer is optional: loaded when the directory holds one, it gives `encode` and `decode`; without it the
prompts must be token ids (text is refused, naming the directory) and completions carry no text (None).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

# Files of which a saved tokenizer has at least one (AutoTokenizer reads the directory from them).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")


def check_directory(model: str) -> None:
    """Refuse, in one line, a directory that cannot be a local Hugging Face model here (checked at submit, in the
    agent's interpreter, which is the one the task's worker runs in)."""
    directory = Path(model)
    if not (directory / "config.json").is_file():
        raise ValueError(f"model={model}: no config.json in it (a local Hugging Face model directory has one)")
    if importlib.util.find_spec("transformers") is None:
        raise ValueError(f"model={model} is a Hugging Face directory, but transformers is not installed in the "
                         f"Python that runs this task ({sys.executable}: the agent's own, or the one given to "
                         f"`submit --python`): install it there ({sys.executable} -m pip install 'freeride[hf]' or "
                         "'transformers>=4.57'), or submit with --python naming a Python that has it")


def has_tokenizer(model: str) -> bool:
    return any((Path(model) / name).is_file() for name in TOKENIZER_FILES)


def no_tokenizer(model: str, why: str = "") -> ValueError:
    because = f" ({why})" if why else f" (none of {', '.join(TOKENIZER_FILES)} in it)"
    return ValueError(f"a prompt is text, but model={model} has no tokenizer{because}: save one into that directory "
                      f"(tokenizer.save_pretrained('{model}')) or give every prompt as token ids "
                      '({"id": ..., "tokens": [ids]})')


class HFCausalLM(nn.Module):
    """A local Hugging Face causal LM (`local_files_only=True`: nothing is downloaded) following the protocol."""

    def __init__(self, directory: str) -> None:
        super().__init__()
        transformers = importlib.import_module("transformers")
        self.directory = directory
        self._cache_cls = transformers.DynamicCache
        self.lm = transformers.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
        params = inspect.signature(self.lm.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self.tokenizer: Any = None
        self._tokenizer_error = ""
        if has_tokenizer(directory):
            try:
                self.tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
            except Exception as exc:  # said when a text prompt needs it; token-id prompts do without
                self._tokenizer_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        self.eos_token_id = _eos(self.lm, self.tokenizer)
        # Positions past the trained ones index out of the position table (GPT-2's n_positions; on a GPU a
        # device-side assert that poisons the process): the decoder refuses prompts that would reach them.
        positions = getattr(self.lm.config, "max_position_embeddings", getattr(self.lm.config, "n_positions", None))
        self.max_len = positions if isinstance(positions, int) and not isinstance(positions, bool) and positions > 0 \
            else None

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise no_tokenizer(self.directory, self._tokenizer_error)
        return list(self.tokenizer.encode(text))

    def decode(self, ids: list[int]) -> str | None:
        return None if self.tokenizer is None else str(self.tokenizer.decode(ids))

    def own_names(self, state: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint's state under this wrapper's names: the Hugging Face model's own ("lm_head.weight", what a
        training run of it saves) become "lm.lm_head.weight"; a state already in the wrapper's names is kept."""
        if state and all(key.startswith("lm.") for key in state):
            return state
        return {f"lm.{key}": value for key, value in state.items()}

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """The Hugging Face model's own state dict (what a training run of it saves), or this wrapper's ("lm.")."""
        if state_dict and all(key.startswith("lm.") for key in state_dict):
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        return self.lm.load_state_dict(state_dict, strict=strict, assign=assign)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                cache: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        past = None
        if cache is not None:
            past = self._cache_cls()
            for i in range(0, len(cache), 2):
                past.update(cache[i], cache[i + 1], i // 2)
        out = self.lm(input_ids=tokens, position_ids=positions, attention_mask=mask.long(), use_cache=True,
                      **{self._cache_arg: past})
        return out.logits, self._tensors(getattr(out, self._cache_arg))

    def _tensors(self, present: Any) -> list[torch.Tensor]:
        flat: list[torch.Tensor] = []
        for i, layer in enumerate(getattr(present, "layers", None) or []):
            keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
            if getattr(layer, "is_sliding", False) or not isinstance(keys, torch.Tensor) \
                    or not isinstance(values, torch.Tensor):
                raise ValueError(f"model={self.directory}: layer {i} of its KV cache is a {type(layer).__name__}, "
                                 "not a plain full-attention one; the decoder batches only those: use a "
                                 "full-attention model (GPT-2, Llama, Qwen2, ...)")
            flat += [keys, values]
        if not flat:
            raise ValueError(f"model={self.directory}: its forward returned no KV cache "
                             f"({type(present).__name__}); the decoder needs one: use a causal LM that caches")
        return flat


def _eos(lm: Any, tokenizer: Any) -> int | None:
    """The token `generate()` stops at: the generation config's end-of-sequence token (the first, if it lists
    several), else the tokenizer's."""
    eos = getattr(getattr(lm, "generation_config", None), "eos_token_id", None)
    if isinstance(eos, list | tuple):
        eos = eos[0] if eos else None
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    return int(eos) if isinstance(eos, int) else None
