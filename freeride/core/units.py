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


FOREVER = ("0", "forever")  # --retention values that keep finished tasks forever
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MIN_RETENTION_S = 60.0


def parse_duration(text: str) -> float:
    """'90s', '30m', '12h', '7d', '2w' (or '0') -> seconds; anything else is InvalidSpecError saying what to write."""
    m = _DURATION.fullmatch(text.strip().lower())
    if text.strip() == "0":
        return 0.0
    if m is None:
        raise InvalidSpecError(f"bad duration {text!r}: use a number and a unit (s, m, h, d or w), like 30m, 12h or 7d")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def parse_retention(text: str) -> float | None:
    """--retention: a duration (> 0), or '0' / 'forever' to keep finished tasks forever (None)."""
    if text.strip().lower() in FOREVER:
        return None
    keep_s = parse_duration(text)
    if keep_s < MIN_RETENTION_S:
        raise InvalidSpecError(f"a retention of {text!r} is too short: use at least 1m, or 0 / forever to keep "
                               "finished tasks forever")
    return keep_s


def format_duration(seconds: float) -> str:
    """The largest unit that divides it: 604800 -> '7d', 5400 -> '90m'."""
    for unit in ("w", "d", "h", "m"):
        if seconds >= _UNIT_S[unit] and seconds % _UNIT_S[unit] == 0:
            return f"{seconds / _UNIT_S[unit]:g}{unit}"
    return f"{seconds:g}s"
