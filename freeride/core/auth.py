"""Bearer tokens for TCP: read from a file, sent as `authorization` metadata on every call.

Unix-socket callers need no token (the socket's file permissions are the control); over TCP the
agent refuses every call that lacks the token (see freeride.agent.edge.auth).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

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


class _TokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def __init__(self, token: str) -> None:
        self._header = (METADATA_KEY, f"Bearer {token}")

    def _details(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), self._header]
        return details._replace(metadata=metadata) if hasattr(details, "_replace") else _Details(details, metadata)

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Callable[..., Any], details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Callable[..., Any], details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


class _Details(grpc.ClientCallDetails):
    def __init__(self, base: Any, metadata: list[tuple[str, str]]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


def token_interceptor(token: str) -> Any:
    """A client interceptor adding `authorization: Bearer <token>` to every call (for grpc.intercept_channel)."""
    return _TokenInterceptor(token)
