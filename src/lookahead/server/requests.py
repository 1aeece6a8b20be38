"""One request as the engine and its caller see it: its events, its handle, its state.

The HTTP side holds a ``RequestHandle`` (read the events, cancel); the engine thread holds an
``EngineRequest`` (the ``Decoder``, its detokenizer, its deadline) and emits the events.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

from lookahead.decode import Decoder
from lookahead.detokenize import Detokenizer
from lookahead.logprobs import TokenLogprob
from lookahead.stats import GenerationStats


class QueueFullError(RuntimeError):
    """Too many requests are waiting; the HTTP layer answers 429."""


class EngineClosedError(RuntimeError):
    """The engine was stopped."""


@dataclass(frozen=True)
class TokenEvent:
    """New text of a request (never empty); ``logprobs``: the records of the tokens committed
    since the last event (empty unless the request's ``Decoder`` records them)."""

    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class FinishEvent:
    """The request ended. reason: "stop" (EOS or a stop string), "length" or "cancelled".
    logprobs: the records not sent with a ``TokenEvent`` (tokens whose text was held back)."""

    reason: str
    prompt_tokens: int
    completion_tokens: int
    token_ids: list[int]
    stats: GenerationStats
    logprobs: tuple[TokenLogprob, ...] = ()


# ErrorEvent.code values: what went wrong, as the HTTP side reports it.
ERROR_INTERNAL = "internal"  # an exception while serving the request (logged, not shown)
ERROR_TIMEOUT = "timeout"  # the request outlived ``EngineConfig.request_timeout``
ERROR_SHUTDOWN = "shutdown"  # the engine stopped before the request ended


@dataclass(frozen=True)
class ErrorEvent:
    """The request failed; the server goes on with the others.

    message: safe to show a client: it never holds an exception's text (which can quote
    internals, paths or other requests' data); the exception is logged with the request's id.
    code: ``ERROR_INTERNAL``, ``ERROR_TIMEOUT`` or ``ERROR_SHUTDOWN``.
    """

    message: str
    code: str = ERROR_INTERNAL


Event = TokenEvent | FinishEvent | ErrorEvent


class RequestHandle:
    """The caller's side of one request: its events, and a switch to cancel it.

    With ``loop`` (an asyncio loop) read the events with ``async for event in handle.aevents()``
    in that loop; without, with ``for event in handle.events()``. Both end after a
    ``FinishEvent`` or ``ErrorEvent``.
    """

    def __init__(self, request_id: str, wake, loop: asyncio.AbstractEventLoop | None) -> None:
        self.id = request_id
        self._wake = wake
        self._loop = loop
        self._queue: asyncio.Queue | queue.Queue = asyncio.Queue() if loop else queue.Queue()
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop decoding this request and free its memory (at the engine's next iteration)."""
        if not self._cancelled.is_set():
            self._cancelled.set()
            self._wake()

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        while True:
            event = self._queue.get(timeout=timeout)
            yield event
            if not isinstance(event, TokenEvent):
                return

    async def aevents(self) -> AsyncIterator[Event]:
        while True:
            event = await self._queue.get()
            yield event
            if not isinstance(event, TokenEvent):
                return

    def emit(self, event: Event) -> None:
        """Called by the engine thread."""
        if self._loop is None:
            self._queue.put(event)
            return
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


@dataclass(eq=False)
class EngineRequest:
    """A submitted request as the engine tracks it.

    deadline: ``time.perf_counter()`` value past which the engine ends it with a timeout
    error (inf: never).
    """

    handle: RequestHandle
    decoder: Decoder
    detokenizer: Detokenizer
    method: str
    arrived: float = field(default_factory=time.perf_counter)
    last_token_at: float = 0.0
    deadline: float = float("inf")
    logprobs_sent: int = 0

    def take_logprobs(self) -> tuple[TokenLogprob, ...]:
        """The decoder's log-probability records not taken yet (engine thread)."""
        records = self.decoder.token_logprobs
        if self.logprobs_sent >= len(records):
            return ()
        new = tuple(records[self.logprobs_sent :])
        self.logprobs_sent = len(records)
        return new

    @property
    def past(self) -> int:
        """Tokens in the request's cache: every committed token but the last (x0)."""
        return len(self.decoder.context) - 1
