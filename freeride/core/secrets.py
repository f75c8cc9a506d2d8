"""Passwords in URLs (a pool's `redis://:PASSWORD@host/…`) are never printed: replace them with ***.

`mask` hides them in a URL (or text holding URLs); `secrets_in` + `scrub` hide the same values
anywhere in a message, such as an error a server sent back."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, urlsplit

_CREDENTIALS = re.compile(r"(?<=://)([^/@\s]*)@")
_PASSWORD_PARAM = re.compile(r"(?i)(password=)[^&\s]*")


def _hide(credentials: str) -> str:
    user, colon, _ = credentials.partition(":")
    return f"{user}:***" if colon else "***"


def mask(text: str) -> str:
    """`text` with the password of any URL in it (user:PASSWORD@, or ?password=) replaced by ***."""
    text = _CREDENTIALS.sub(lambda m: _hide(m.group(1)) + "@", text)
    return _PASSWORD_PARAM.sub(r"\1***", text)


def secrets_in(text: str) -> list[str]:
    """What in a URL as typed must never be printed: its credentials and any ?password=, raw and decoded,
    longest first (for `scrub`).

    Read loosely on purpose (everything between "://" and the last "@" of the authority), so that a
    URL that does not parse is covered too."""
    rest = text.strip().partition("://")[2]
    authority = rest.split("?", 1)[0]
    userinfo = authority.rpartition("@")[0]
    user, colon, password = userinfo.partition(":")
    found = [password if colon else user]  # USER:PASSWORD, or a bare word that may be a password
    try:
        query = urlsplit(text.strip()).query
    except ValueError:
        query = text.partition("?")[2]
    found += [value for key, value in parse_qsl(query) if key.lower() == "password"]
    found += [unquote(s) for s in found]
    return sorted({s for s in found if s}, key=len, reverse=True)


def scrub(message: str, secrets: list[str]) -> str:
    """`message` (say, an error a server sent back) with each of `secrets` replaced by ***."""
    for secret in secrets:
        message = message.replace(secret, "***")
    return message
