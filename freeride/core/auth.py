"""Bearer tokens for TCP: read from a file, sent as `authorization` metadata on every call.

Unix-socket callers need no token (the socket's file permissions are the control); over TCP the
agent refuses every call that lacks the token (see freeride.agent.edge.auth).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from freeride.errors import FreerideError

TOKEN_ENV = "FREERIDE_TOKEN_FILE"
METADATA_KEY = "authorization"
_MAX_TOKEN_BYTES = 4096


class TokenError(FreerideError):
    """The token file is missing, unreadable or empty."""


def read_token(path: Path | str) -> str:
    """The token in `path` (surrounding whitespace stripped); a clear error if there is none."""
    try:
        raw = Path(path).read_bytes()[: _MAX_TOKEN_BYTES + 1]
    except OSError as exc:
        raise TokenError(f"cannot read token file {path}: {exc.strerror or exc}") from None
    token = raw.decode("utf-8", errors="replace").strip()
    if not token:
        raise TokenError(f"token file {path} is empty; put a secret in it, e.g. `head -c 32 /dev/urandom | base64`")
    if len(raw) > _MAX_TOKEN_BYTES or any(c.isspace() for c in token):
        raise TokenError(f"token file {path} must hold one token (no spaces, at most {_MAX_TOKEN_BYTES} bytes)")
    return token


def token_from(path: Path | str | None = None) -> str | None:
    """The token from an explicit file, else from $FREERIDE_TOKEN_FILE, else None."""
    path = path or os.environ.get(TOKEN_ENV) or None
    return read_token(path) if path else None


def token_interceptor(token: str) -> Any:
    """A client interceptor adding `authorization: Bearer <token>` to every call (for grpc.intercept_channel)."""
    from freeride.core.interceptor import TokenInterceptor  # grpc: loaded by the callers that talk gRPC only

    return TokenInterceptor(token)
