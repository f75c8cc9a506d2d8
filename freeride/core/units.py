"""Parsing and printing of sizes and durations for humans."""

from __future__ import annotations

import re
from decimal import Decimal

from freeride.errors import InvalidSpecError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40,
}


def parse_size(text: str) -> int:
    """'4GiB', '512M', '1.5GB', '1000' -> bytes; anything else is a clear error."""
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise InvalidSpecError(f"bad memory size {text!r}: use a number with B, KB, MB, GB, TB, KiB, MiB, GiB or TiB")
    return int(Decimal(m.group(1)) * _UNITS[unit])


def format_size(n: int) -> str:
    if n <= 0:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def format_seconds(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.2f} h"
    if s >= 60:
        return f"{s / 60:.1f} min"
    if s >= 1:
        return f"{s:.2f} s"
    return f"{s * 1000:.1f} ms"
