"""The TCP listener's gate: every call must carry the agent's bearer token.

The unix socket is served by a separate server without this interceptor; its file mode and group
decide who may call. Health checks are exempt so that probes (Kubernetes' gRPC probe cannot send
metadata) work; they reveal nothing but SERVING.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from freeride.core.auth import METADATA_KEY

log = logging.getLogger("freeride.agent")

_OPEN_PREFIX = "/grpc.health.v1.Health/"


class LogBudget:
    """At most `burst` lines, refilled at `per_s` a second: a caller hammering the port cannot flood the log."""

    def __init__(self, burst: int = 20, per_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._burst, self._per_s, self._clock = burst, per_s, clock
        self._tokens = float(burst)
        self._last = clock()
        self.suppressed = 0

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._per_s)
        self._last = now
        if self._tokens < 1:
            self.suppressed += 1
            return False
        self._tokens -= 1
        return True


class TokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()
        self._log_budget = LogBudget()

    def _authorized(self, metadata: Any) -> tuple[bool, str]:
        values = [v for k, v in (metadata or ()) if k == METADATA_KEY]
        if not values:
            return False, "no token"
        given = values[0].encode() if isinstance(values[0], str) else bytes(values[0])
        return (True, "") if hmac.compare_digest(given, self._expected) else (False, "wrong token")

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(_OPEN_PREFIX):
            return handler
        ok, why = self._authorized(details.invocation_metadata)
        return handler if ok else _refusal(handler, details.method, why, self._log_budget)


def _refusal(handler: grpc.RpcMethodHandler, method: str, why: str, budget: LogBudget) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that logs the caller and answers UNAUTHENTICATED."""

    async def refuse(_request: Any, context: grpc.aio.ServicerContext) -> None:
        if budget.take():
            more = f" ({budget.suppressed} more refusals not logged)" if budget.suppressed else ""
            budget.suppressed = 0
            log.warning("refused %s from %s: %s%s", method, context.peer(), why, more)
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            f"{why}: calls over TCP need the agent's token (--token-file or FREERIDE_TOKEN_FILE)",
        )

    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(
        refuse, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )
