"""Where a pool lives: `redis://[USER:PASS@]HOST[:PORT][/DB]/NAME`, `rediss://…` (TLS) or
`unix://[USER:PASS@]/PATH/TO/redis.sock/NAME[?db=N]`.

The pool's name is the URL's last path segment; the rest is a Redis URL as redis-py reads it
(credentials, TLS options and `?db=` included). `str()` of a pool URL never shows a password.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from freeride.core.secrets import mask
from freeride.errors import PoolError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_SCHEMES = ("redis", "rediss", "unix")
_FORMS = ("redis://HOST[:PORT][/DB]/NAME, rediss://HOST[:PORT][/DB]/NAME (TLS) or "
          "unix:///PATH/TO/redis.sock/NAME")


@dataclass(frozen=True)
class PoolUrl:
    redis_url: str  # for redis.Redis.from_url: may hold a password, never print it
    name: str
    safe_redis_url: str  # the same URL with any password replaced by ***

    def __str__(self) -> str:
        return f"{self.safe_redis_url.split('?', 1)[0].rstrip('/')}/{self.name}"


def parse_pool_url(text: str) -> PoolUrl:
    """A pool URL, or PoolError saying which part is wrong and what the forms are (never the password)."""
    try:
        return _parse(text)
    except PoolError as exc:
        raise PoolError(str(exc).replace(repr(text), repr(mask(text)))) from None


def _parse(text: str) -> PoolUrl:
    try:
        parts = urlsplit(text.strip())
    except ValueError as exc:
        raise PoolError(f"pool URL {text!r} does not parse ({exc}); use {_FORMS}") from None
    if parts.scheme not in _SCHEMES:
        raise PoolError(f"pool URL {text!r} must start with redis://, rediss:// or unix://; use {_FORMS}")
    path, _, name = parts.path.rstrip("/").rpartition("/")
    if not name:
        raise PoolError(f"pool URL {text!r} names no pool: put the pool's name last, as in {_FORMS}")
    if not _NAME.fullmatch(name):
        raise PoolError(f"pool name {name!r} in {text!r}: use 1-100 letters, digits, '.', '_' or '-'")
    query = dict(parse_qsl(parts.query))
    if parts.scheme == "unix":
        if not path:
            raise PoolError(f"pool URL {text!r} has no socket path: use unix:///PATH/TO/redis.sock/NAME")
    else:
        if not parts.hostname:
            raise PoolError(f"pool URL {text!r} has no host; use {_FORMS}")
        if path.strip("/") and not path.strip("/").isdigit():
            raise PoolError(f"pool URL {text!r}: {path.strip('/')!r} is not a database number; use {_FORMS}")
        if not path.strip("/") and name.isdigit() and "db" not in query:
            raise PoolError(f"pool URL {text!r}: {name!r} looks like a database number and no pool is named; "
                            f"put the pool's name last, as in {_FORMS}")
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError:
            raise PoolError(f"pool URL {text!r} has a bad port; use {_FORMS}") from None
    query_part = f"?{parts.query}" if parts.query else ""
    redis_url = f"{parts.scheme}://{parts.netloc}{path}{query_part}"
    safe = mask(f"{parts.scheme}://{parts.netloc}{path}{query_part}")
    return PoolUrl(redis_url=redis_url, name=name, safe_redis_url=safe)
