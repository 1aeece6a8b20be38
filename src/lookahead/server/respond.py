"""A submitted request's answer: server-sent events, or one JSON body once it is done.

Both read the request's events from its ``RequestHandle``; a client that goes away cancels the
request (the engine drops it at its next iteration). A request that failed in the engine
answers with the ``ErrorEvent``'s message, which never quotes an exception (see
``requests.ErrorEvent``): 500 (internal), 504 (``--request-timeout``) or 503 (shutting down).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from lookahead.server.protocol import chunk_body, completion_body, error_body, usage
from lookahead.server.requests import (
    ERROR_SHUTDOWN,
    ERROR_TIMEOUT,
    ErrorEvent,
    FinishEvent,
    RequestHandle,
    TokenEvent,
)

# ErrorEvent.code -> (HTTP status, OpenAI error type, error code)
_ERRORS = {
    ERROR_TIMEOUT: (504, "timeout_error", "request_timeout"),
    ERROR_SHUTDOWN: (503, "server_error", "shutting_down"),
}
_INTERNAL = (500, "server_error", None)


def error_event_body(event: ErrorEvent) -> tuple[int, dict]:
    """The HTTP status and OpenAI error body of a request that failed in the engine."""
    status, kind, code = _ERRORS.get(event.code, _INTERNAL)
    return status, error_body(event.message, kind, None, code)


def stream_response(handle: RequestHandle, rid: str, model: str, chat: bool,
                    include_usage: bool) -> StreamingResponse:
    return StreamingResponse(_sse(handle, rid, model, chat, include_usage),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


def _sse_data(body: dict | str) -> str:
    return f"data: {body if isinstance(body, str) else json.dumps(body)}\n\n"


async def _sse(handle, rid: str, model: str, chat: bool, include_usage: bool) -> AsyncIterator[str]:
    """The response's server-sent events; leaving early (the client left) cancels the request."""
    finished = False
    try:
        if chat:
            yield _sse_data(chunk_body(rid, model, chat, role=True))
        async for event in handle.aevents():
            if isinstance(event, TokenEvent):
                yield _sse_data(chunk_body(rid, model, chat, text=event.text))
            elif isinstance(event, FinishEvent):
                finished = True
                yield _sse_data(chunk_body(rid, model, chat, reason=event.reason))
                if include_usage:
                    counts = usage(event.prompt_tokens, event.completion_tokens)
                    yield _sse_data(chunk_body(rid, model, chat, usage_=counts))
            elif isinstance(event, ErrorEvent):
                finished = True
                yield _sse_data(error_event_body(event)[1])
        yield _sse_data("[DONE]")
    finally:
        if not finished:
            handle.cancel()


async def complete_response(request: Request, handle: RequestHandle, rid: str, model: str,
                            chat: bool, with_stats: bool) -> Response:
    """Wait for the whole answer, watching for the client going away meanwhile.

    with_stats: add the engine's figures (steps, tokens per step, ...) as ``lookahead``.
    """
    text: list[str] = []
    final: list = []

    async def gather() -> None:
        async for event in handle.aevents():
            if isinstance(event, TokenEvent):
                text.append(event.text)
            else:
                final.append(event)

    task = asyncio.ensure_future(gather())
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=0.5)
            if not task.done() and await request.is_disconnected():
                handle.cancel()
                task.cancel()
                return Response(status_code=499)
    finally:
        if not task.done():
            task.cancel()
            handle.cancel()
    event = final[0]
    if isinstance(event, ErrorEvent):
        status, body = error_event_body(event)
        return JSONResponse(body, status_code=status)
    stats = None
    if with_stats:
        stats = {"method": event.stats.method, "steps": event.stats.steps,
                 "tokens_per_step": round(event.stats.tokens_per_step, 3),
                 "mean_accepted": round(event.stats.mean_accepted, 3),
                 "seconds": round(event.stats.seconds, 4),
                 "time_to_first_token": round(event.stats.time_to_first_token, 4)}
    counts = usage(event.prompt_tokens, event.completion_tokens)
    return JSONResponse(completion_body(rid, model, "".join(text), event.reason, counts, chat,
                                        stats))
