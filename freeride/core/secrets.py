"""Passwords in URLs (a pool's `redis://:PASSWORD@host/…`) are never printed: replace them with ***."""

from __future__ import annotations

import re

_CREDENTIALS = re.compile(r"(?<=://)([^/@\s]*)@")
_PASSWORD_PARAM = re.compile(r"(?i)(password=)[^&\s]*")


def _hide(credentials: str) -> str:
    user, colon, _ = credentials.partition(":")
    return f"{user}:***" if colon else "***"


def mask(text: str) -> str:
    """`text` with the password of any URL in it (user:PASSWORD@, or ?password=) replaced by ***."""
    text = _CREDENTIALS.sub(lambda m: _hide(m.group(1)) + "@", text)
    return _PASSWORD_PARAM.sub(r"\1***", text)
