"""What a task's progress() may carry to the agent: a few numbers, never a message gRPC refuses.

progress() goes to the agent in the worker's messages (`map<string, double>`), is kept in its database and
shown by `freeride ls/show/top`. gRPC refuses a message over 4 MiB by closing the stream, which the worker
can only read as a lost agent: a progress() returning a huge map used to end the worker (exit 0) with no
word of why. The worker therefore keeps the first MAX_KEYS numeric entries whose keys have at most
MAX_KEY_CHARS characters (at most ~40 KiB in all), drops the rest, adds `progress_dropped` (how many), and
logs one line per worker saying what it dropped. NaN and infinities are carried as they are (doubles);
`--json` prints them as null.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

MAX_KEYS = 64
MAX_KEY_CHARS = 128
DROPPED = "progress_dropped"


class BoundedProgress:
    """Turns what progress() returned into what the worker sends; warns once when it drops anything."""

    def __init__(self) -> None:
        self.warned = False

    def __call__(self, raw: Mapping[Any, Any]) -> dict[str, float]:
        out: dict[str, float] = {}
        too_long = not_number = seen = 0
        for key, value in raw.items():
            if len(out) >= MAX_KEYS:
                break
            seen += 1
            name = str(key)
            if len(name) > MAX_KEY_CHARS:
                too_long += 1
                continue
            try:
                out[name] = float(value)
            except (TypeError, ValueError, OverflowError):
                not_number += 1
        over = len(raw) - seen  # not looked at: a huge map costs no more than its first entries
        dropped = too_long + not_number + over
        if dropped:
            out[DROPPED] = float(dropped)
            if not self.warned:
                self.warned = True
                why = [f"{n} {what}" for n, what in ((over, f"past the first {MAX_KEYS} kept"),
                                                      (too_long, f"with keys over {MAX_KEY_CHARS} characters"),
                                                      (not_number, "whose values are not numbers")) if n]
                log.warning("progress() returned %d entries, %d dropped (%s): freeride keeps the first %d numbers "
                            "with short keys; `%s` in the task's progress counts what was dropped", len(raw),
                            dropped, ", ".join(why), MAX_KEYS, DROPPED)
        return out
