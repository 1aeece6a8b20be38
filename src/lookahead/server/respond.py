"""A submitted request's answer: server-sent events, or one JSON body once it is done.

Both read the events of the request's choices (one engine request each, ``n`` of them) from
their ``RequestHandle``s; a client that goes away cancels them (the engine drops them at its
next iteration). A request that failed in the engine
answers with the ``ErrorEvent``'s message, which never quotes an exception (see
``requests.ErrorEvent``): 500 (internal), 504 (``--request-timeout``) or 503 (shutting down).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from lookahead.server.protocol import (
    choice_body,
    chunk_body,
    completion_body,
    error_body,
    usage,
)
from lookahead.server.requests import (
    ERROR_SHUTDOWN,
    ERROR_TIMEOUT,
    ErrorEvent,
    Event,
    FinishEvent,
    RequestHandle,
    TokenEvent,
)
from lookahead.server.structured import StreamSplitter, split_answer
from lookahead.stats import GenerationStats

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


def stream_response(handles: list[RequestHandle], rid: str, model: str, chat: bool,
                    include_usage: bool, formatters: list | None = None,
                    calls: bool = False) -> StreamingResponse:
    """The choices' events as server-sent events; ``formatters``: one ``LogprobFormatter``
    per choice where ``logprobs`` was asked for, else None; ``calls``: the answers may hold
    tool calls, sent as ``tool_calls`` deltas once each is complete."""
    splitters = [StreamSplitter() for _ in handles] if calls else None
    return StreamingResponse(_sse(handles, rid, model, chat, include_usage, formatters,
                                  splitters),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


def _sse_data(body: dict | str) -> str:
    return f"data: {body if isinstance(body, str) else json.dumps(body)}\n\n"


async def _merged(handles: list[RequestHandle]) -> AsyncIterator[tuple[int, Event]]:
    """(choice index, event) from every handle as they come, until each has ended."""
    if len(handles) == 1:
        async for event in handles[0].aevents():
            yield 0, event
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, handle: RequestHandle) -> None:
        async for event in handle.aevents():
            queue.put_nowait((index, event))

    tasks = [asyncio.ensure_future(pump(i, handle)) for i, handle in enumerate(handles)]
    try:
        running = len(handles)
        while running:
            index, event = await queue.get()
            if not isinstance(event, TokenEvent):
                running -= 1
            yield index, event
    finally:
        for task in tasks:
            task.cancel()


def _logprobs(formatters: list | None, index: int, records) -> dict | None:
    if formatters is None or not records:
        return None
    return formatters[index].format(records)


def _token_chunk(rid, model, chat, index: int, text: str, splitters, logprobs=None,
                 reason=None) -> dict:
    """A chunk of new text (and the finish reason), its tool calls split off when asked."""
    if splitters is None:
        return chunk_body(rid, model, chat, text=text, index=index, logprobs=logprobs,
                          reason=reason)
    splitter = splitters[index]
    content, calls = splitter.feed(text)
    if reason is not None:
        content += splitter.finish()
        reason = "tool_calls" if splitter.calls else reason
    return chunk_body(rid, model, chat, text=content, index=index, logprobs=logprobs,
                      reason=reason, tool_calls=calls)


async def _sse(handles, rid: str, model: str, chat: bool, include_usage: bool,
               formatters, splitters=None) -> AsyncIterator[str]:
    """The response's server-sent events; leaving early (the client left) cancels the
    requests, and so does one choice failing (the error event ends the stream)."""
    ended: set[int] = set()
    completion = 0
    try:
        if chat:
            for index in range(len(handles)):
                yield _sse_data(chunk_body(rid, model, chat, role=True, index=index))
        async for index, event in _merged(handles):
            if isinstance(event, TokenEvent):
                yield _sse_data(_token_chunk(rid, model, chat, index, event.text, splitters,
                                             _logprobs(formatters, index, event.logprobs)))
            elif isinstance(event, FinishEvent):
                ended.add(index)
                completion += event.completion_tokens
                yield _sse_data(_token_chunk(rid, model, chat, index, "", splitters,
                                             _logprobs(formatters, index, event.logprobs),
                                             event.reason))
                if include_usage and len(ended) == len(handles):
                    counts = usage(event.prompt_tokens, completion)
                    yield _sse_data(chunk_body(rid, model, chat, usage_=counts))
            elif isinstance(event, ErrorEvent):
                ended.add(index)
                yield _sse_data(error_event_body(event)[1])
                break
        yield _sse_data("[DONE]")
    finally:
        for index, handle in enumerate(handles):
            if index not in ended:
                handle.cancel()


async def complete_response(request: Request, handles: list[RequestHandle], rid: str,
                            model: str, chat: bool, with_stats: bool,
                            formatters: list | None = None, calls: bool = False) -> Response:
    """Wait for every choice's whole answer, watching for the client going away meanwhile.

    with_stats: add the engine's figures (steps, tokens per step, ...) as ``lookahead``
    (over all choices together).
    """
    texts: list[list[str]] = [[] for _ in handles]
    records: list[list] = [[] for _ in handles]
    final: list = [None] * len(handles)

    async def gather() -> None:
        async for index, event in _merged(handles):
            if isinstance(event, TokenEvent):
                texts[index].append(event.text)
            else:
                final[index] = event
            records[index].extend(getattr(event, "logprobs", ()))
            if isinstance(event, ErrorEvent):
                return

    task = asyncio.ensure_future(gather())
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=0.5)
            if not task.done() and await request.is_disconnected():
                return Response(status_code=499)
    finally:
        if not task.done():
            task.cancel()
        for index, handle in enumerate(handles):
            if not isinstance(final[index], FinishEvent):
                handle.cancel()
    failed = [event for event in final if isinstance(event, ErrorEvent)]
    if failed:
        status, body = error_event_body(failed[0])
        return JSONResponse(body, status_code=status)
    choices = []
    for index, event in enumerate(final):
        text, tool_calls = "".join(texts[index]), None
        if calls:  # the answer's tool calls, parsed out of its text
            text, tool_calls = split_answer(text)
        choices.append(choice_body(index, text, event.reason, chat,
                                   formatters[index].format(records[index]) if formatters
                                   else None, tool_calls))
    stats = stats_body([event.stats for event in final]) if with_stats else None
    counts = usage(final[0].prompt_tokens, sum(event.completion_tokens for event in final))
    return JSONResponse(completion_body(rid, model, choices, counts, chat, stats))


def stats_body(stats: list[GenerationStats]) -> dict:
    """The ``lookahead`` field: the figures of one or more choices' decoding, together."""
    steps = sum(s.steps for s in stats)
    tokens = sum(s.new_tokens for s in stats)
    accepted = [a for s in stats for a, p in zip(s.accepted_per_step, s.proposed_per_step) if p]
    return {"method": stats[0].method, "steps": steps,
            "tokens_per_step": round(tokens / steps if steps else 0.0, 3),
            "mean_accepted": round(sum(accepted) / len(accepted) if accepted else 0.0, 3),
            "seconds": round(max(s.seconds for s in stats), 4),
            "time_to_first_token": round(min(s.time_to_first_token for s in stats), 4)}
