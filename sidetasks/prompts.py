"""Prompts for `sidetasks.generate`: read from a file, turned into token ids, and checked against a model.

Everything a model cannot take is refused before it runs, in one line that names the prompt (and the file
and line, where there is one): at submit what the file alone shows (text that is not UTF-8, an empty
prompt, token ids that are not ids) and what the model declares without being built (`Limits`); in the
worker, against the model it built, what only the model knows (its tokenizer's count, its vocabulary).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sidetasks.models import Limits

PromptArgs = dict[str, Any]  # "prompt" (text) or "tokens" (ids), and whatever else the line held


def read_prompts(path: str) -> list[tuple[str, PromptArgs]]:
    """The prompts of a file: a JSON object per line with an "id" and a "prompt" (text) or "tokens" (ids), or a
    plain line of text (its id: its line number). Blank lines are skipped; ids must be unique.

    OSError: the file cannot be read (it may come back). ValueError: what is wrong with its content, naming the
    file and line (it will not change by trying again)."""
    data = Path(path).read_bytes()
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        where = data[: exc.start].count(b"\n") + 1
        raise ValueError(f"{path} line {where}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save the prompts "
                         "as UTF-8") from None
    out: list[tuple[str, PromptArgs]] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        prompt_id, args = _parse_line(path, number, raw, line)
        if prompt_id in seen:
            raise ValueError(f"{path} line {number}: id {prompt_id!r} again (first on line {seen[prompt_id]})")
        seen[prompt_id] = number
        problem = shape_problem(args)
        if problem:
            raise ValueError(f"{path} line {number}: prompt {prompt_id!r}{problem}")
        out.append((prompt_id, args))
    return out


def _parse_line(path: str, number: int, raw: str, line: str) -> tuple[str, PromptArgs]:
    if not line.startswith("{"):
        return str(number), {"prompt": raw}
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} line {number}: not JSON ({exc.msg})") from None
    if not isinstance(obj, dict) or "id" not in obj or not ("prompt" in obj or "tokens" in obj):
        raise ValueError(f'{path} line {number}: need {{"id": ..., "prompt": "text"}} or "tokens": [ids]')
    return str(obj.pop("id")), obj


def shape_problem(args: Mapping[str, Any]) -> str:
    """What makes a prompt's arguments unusable by any model (": ..." or " is empty"), "" when nothing does."""
    if "tokens" in args:
        tokens = args["tokens"]
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                   for t in tokens):
            return ": tokens must be ids >= 0, as a JSON list of whole numbers"
        return " is empty" if not tokens else ""
    if not isinstance(args["prompt"], str):
        return ': "prompt" must be text (or give "tokens": [ids])'
    return " is empty" if not args["prompt"] else ""


def prompt_tokens(prompt_id: str, args: Mapping[str, Any], encode: Callable[[str], list[int]]) -> list[int]:
    """The prompt's token ids; ValueError for a prompt no model can take (empty, or ids that are not ids)."""
    problem = shape_problem(args)
    if problem:
        raise ValueError(f"prompt {prompt_id!r}{problem}")
    tokens = list(args["tokens"]) if "tokens" in args else encode(args["prompt"])
    if not tokens:
        raise ValueError(f"prompt {prompt_id!r} is empty once encoded")
    return [int(t) for t in tokens]


def fit_problem(prompt_id: str, tokens: list[int], max_new_tokens: int, limits: Limits) -> str:
    """Why the model cannot take these tokens and `max_new_tokens` more ("" when it can)."""
    if limits.vocab is not None:
        outside = next((t for t in tokens if not 0 <= t < limits.vocab), None)
        if outside is not None:
            return f"prompt {prompt_id!r}: token {outside} is outside the model's ids 0..{limits.vocab - 1}"
    if limits.max_len is not None and len(tokens) + max_new_tokens > limits.max_len:
        return (f"prompt {prompt_id!r}: {len(tokens)} tokens + max_new_tokens={max_new_tokens} exceed the model's "
                f"{limits.max_len} positions; shorten it or lower max_new_tokens")
    return ""


def known_tokens(args: Mapping[str, Any], limits: Limits) -> list[int] | None:
    """A prompt's token ids where they are known without the model's tokenizer (None where they are not)."""
    if "tokens" in args:
        return list(args["tokens"])
    return list(str(args["prompt"]).encode()) if limits.bytes_are_tokens else None
