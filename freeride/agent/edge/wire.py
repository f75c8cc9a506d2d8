"""Requests that do not parse become INVALID_ARGUMENT with one log line, not UNKNOWN with a traceback.

gRPC decodes a request before the servicer runs, and a decode error surfaces as "Unexpected
DecodeError" (UNKNOWN) with a full traceback in the agent's log for every bad message: a log
flood anyone on the socket can trigger. This interceptor decodes instead; a message that fails
becomes a `Malformed` value, which unary handlers answer here and streaming servicers check
when they read.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

log = logging.getLogger("freeride.agent")


class Malformed:
    """What a request that does not parse decodes to."""

    def __init__(self, method: str, error: Exception) -> None:
        self.method = method
        self.error = error

    def describe(self) -> str:
        return f"malformed request to {self.method}: {self.error}"


async def reject(context: grpc.aio.ServicerContext, bad: Malformed) -> None:
    """Log one line and end the call with INVALID_ARGUMENT (raises)."""
    log.warning("%s (from %s); rejected", bad.describe(), context.peer())
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, bad.describe())


def _safe(method: str, decode: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if decode is None:
        return None

    def safe(data: bytes) -> Any:
        try:
            return decode(data)
        except (DecodeError, ValueError, UnicodeDecodeError) as exc:
            return Malformed(method, exc)

    return safe


def _checked_stream(stream: Any) -> Any:
    """The same kind of handler as `stream` (gRPC tells an async generator from a writer by its function)."""
    if inspect.isasyncgenfunction(stream):

        async def generator(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, Malformed):
                await reject(context, request)
            async for reply in stream(request, context):
                yield reply

        return generator

    async def writer(request: Any, context: grpc.aio.ServicerContext) -> None:
        if isinstance(request, Malformed):
            await reject(context, request)
        await stream(request, context)

    return writer


class RejectMalformed(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = details.method
        replaced: dict[str, Any] = {"request_deserializer": _safe(method, handler.request_deserializer)}
        if handler.unary_unary is not None:
            unary = handler.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if isinstance(request, Malformed):
                    await reject(context, request)
                return await unary(request, context)

            replaced["unary_unary"] = unary_unary
        elif handler.unary_stream is not None:
            replaced["unary_stream"] = _checked_stream(handler.unary_stream)
        # Streaming requests are read by the servicers, which check each message (service.py).
        return handler._replace(**replaced)
