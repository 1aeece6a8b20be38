"""The HTTP side: an OpenAI-compatible FastAPI app in front of one ``Engine``.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both streamed as SSE when
``stream`` is true), ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text).

Before an endpoint runs, ``guard.Guard`` checks the Host header, the API key and the declared
body size (with ``cors_origins``, Starlette's ``CORSMiddleware`` sits in front of it, answering
browsers' preflights). A request is then checked cheapest first, so that a flood of bad or
oversized requests costs little: its ``Content-Type`` (``application/json``, else 415: a web
page can post ``text/plain`` to a loopback server without a CORS preflight, never JSON); the
body is read up to ``max_body_bytes``; it is parsed and its fields checked (strict types, in a
worker thread); the model name; whether the queue has room for its ``n`` choices; the prompt's
length in characters. Only then is the prompt tokenized (chat template included) and the
``Decoder``s built (``prepare.py``), in the worker thread, never on the event loop, which must
stay free to answer ``/health`` and stream other requests. Every bad argument is a 400 before
anything reaches the engine; each choice is then submitted as its own request and the events
come back through the ``RequestHandle``s (``respond.py``).

Errors use OpenAI's body ``{"error": {"message", "type", "param", "code"}}``: 400 for a bad
request (``param`` names the field, ``code`` is OpenAI's: ``missing_required_parameter``,
``invalid_type``, ``integer_above_max_value``, ``unsupported_parameter``,
``context_length_exceeded``, ...), 401 without the API key, 404 for an unknown model, 413 for a
body over the limit, 415 for a body that is not declared JSON, 429 when the queue is full, 500
when decoding failed (the message names the request's id, which the log has with the
traceback; it never quotes an exception), 503 while shutting down, 504 past
``--request-timeout``. The server keeps serving after every one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import ValidationError
from starlette.middleware.cors import CORSMiddleware
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from lookahead.config import LookaheadConfig, method_spec
from lookahead.kernels.packing import packing_of
from lookahead.server.engine import Engine, EngineClosedError, QueueFullError
from lookahead.server.guard import BodyTooLargeError, Guard, read_body, too_large_error
from lookahead.server.logprobs import LogprobFormatter
from lookahead.server.metrics import CONTENT_TYPE
from lookahead.server.prepare import check_prompt_size, prepare
from lookahead.server.structured import StructuredOutput, tool_choice_of
from lookahead.sources.memory import DEFAULT_CAPACITY, TextMemory
from lookahead.proposers.recycling import SuccessorTable
from lookahead.server.protocol import (
    ApiError,
    BodyError,
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
    new_id,
    parse_body,
)
from lookahead.server.respond import complete_response, stream_response

logger = logging.getLogger(__name__)

# Characters per token that a prompt may average before it is refused untokenized (see
# ServerSettings.max_prompt_chars): real text averages 3-5; 32 leaves room for odd text.
PROMPT_CHARS_PER_TOKEN = 32
MEMORY_SCOPES = ("per-key", "shared")


@dataclass(frozen=True)
class ServerSettings:
    """What the server was started with (read once; requests override per request).

    model_name: the name clients pass as ``model``. method / method_options: the default
    method and its options. draft_model: the loaded draft for method "draft", if any.
    api_keys: keys a ``/v1`` request must bear one of (``Authorization: Bearer``); () none.
    allowed_hosts: the ``Host`` names accepted (``guard.allowed_host_set``); None: any.
    max_body_bytes: largest request body; more is refused with 413 before it is read.
    max_prompt_chars: longest prompt, in characters, tokenized at all (the messages' text, for
        chat); None: ``PROMPT_CHARS_PER_TOKEN`` times the engine's context.
    max_tokens: the most new tokens one request may ask for, and what a chat request that
        asks for none gets (OpenAI would give the whole rest of the context).
    memory: "per-key": the copying methods also copy from earlier requests' texts, kept
        apart per API key; "shared": one memory for all clients. None: no memory. Where
        clients share a memory ("shared", or "per-key" without ``api_keys``, where every
        client is the same client) no acceptance figures are reported to them: they would
        tell one client about the text of another.
    memory_capacity: tokens each memory keeps.
    health_stall_s: ``/health`` answers 503 when the engine has work and made no progress for
        this many seconds (a hung forward pass).
    cors_origins: the web origins (``https://app.example``; ``*``: any) whose pages may call
        the API from a browser; () sends no CORS headers at all.
    """

    model_name: str
    method: str = "lookahead"
    method_options: Mapping[str, object] = field(default_factory=dict)
    draft_model: object | None = None
    api_keys: tuple[str, ...] = ()
    allowed_hosts: frozenset[str] | None = None
    max_body_bytes: int = 4 << 20
    max_prompt_chars: int | None = None
    max_tokens: int = 2048
    memory: str | None = None
    memory_capacity: int = DEFAULT_CAPACITY
    health_stall_s: float = 60.0
    cors_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        method_spec(self.method)  # a ValueError naming the methods there are
        if self.memory not in (None, *MEMORY_SCOPES):
            raise ValueError(f"memory must be None or one of {MEMORY_SCOPES}; got {self.memory!r}")
        for name in ("max_body_bytes", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")

    @property
    def shares_memory(self) -> bool:
        """Whether one client's text can shape what another's requests accept (a memory
        shared by all clients: "shared", or "per-key" without keys, where all are one)."""
        if self.memory == "per-key":
            return not self.api_keys
        return self.memory == "shared" or "memory" in self.method_options

    def prompt_char_limit(self, context: int | None) -> int:
        if self.max_prompt_chars is not None:
            return self.max_prompt_chars
        return PROMPT_CHARS_PER_TOKEN * (context if context is not None else 1 << 15)


class _State:
    """Per-app state: the worker thread, the memories per API key, requests being prepared."""

    def __init__(self, engine: Engine, settings: ServerSettings) -> None:
        self.engine, self.settings = engine, settings
        # One thread: tokenizing off the event loop, and never two at once on one tokenizer.
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="lookahead-prepare")
        self.memories: dict[int | None, TextMemory] = {}
        self.successors: dict[int | None, SuccessorTable] = {}
        self.preparing = 0  # changed on the event loop only
        self.structured = StructuredOutput(engine.model, engine.tokenizer)

    async def run(self, function, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, function, *args)

    def memory_for(self, key_index: int | None) -> TextMemory | None:
        """The memory of the client with API key ``key_index`` (bounded: one per key)."""
        if self.settings.memory is None:
            return None
        scope = None if self.settings.memory == "shared" else key_index
        if scope not in self.memories:
            self.memories[scope] = TextMemory(self.settings.memory_capacity)
        return self.memories[scope]

    def successors_for(self, key_index: int | None) -> SuccessorTable | None:
        """The Token Recycling table of the client with API key ``key_index`` (one per key,
        as its acceptance could otherwise tell one client what another's texts predicted;
        without keys, one for all), kept across its requests; None where recycling is off."""
        k = self.settings.method_options.get("recycle", LookaheadConfig.recycle)
        if not k:
            return None
        if key_index not in self.successors:
            self.successors[key_index] = SuccessorTable(k)
        return self.successors[key_index]

    def memory_tokens(self) -> int | None:
        legacy = self.settings.method_options.get("memory")
        if legacy is not None:
            return len(legacy)
        if self.settings.memory is None:
            return None
        return sum(len(memory) for memory in list(self.memories.values()))


def create_app(engine: Engine, settings: ServerSettings) -> FastAPI:
    """The FastAPI app serving ``engine``. The caller starts and stops the engine."""
    state = _State(engine, settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        state.pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="lookahead", version="0.1.0", lifespan=lifespan)
    app.state.engine, app.state.settings, app.state.lookahead = engine, settings, state
    app.add_middleware(Guard, allowed_hosts=settings.allowed_hosts, api_keys=settings.api_keys,
                       max_body_bytes=settings.max_body_bytes)
    if settings.cors_origins:  # added last, so outermost: preflights never meet the key check
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                           allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    _install_error_handlers(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        return _health(state)

    @app.get("/v1/models")
    async def models() -> dict:
        card = {"id": settings.model_name, "object": "model", "created": 0, "owned_by": "lookahead"}
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(engine.metrics.render(), media_type=CONTENT_TYPE)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _handle(request, state, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _handle(request, state, chat=True)

    return app


def _health(state: _State) -> JSONResponse:
    engine, settings = state.engine, state.settings
    stalled = engine.stalled_for()
    if not engine.alive:
        status = "engine stopped"
    elif stalled > settings.health_stall_s:
        status = (f"engine stalled: no step ended in {stalled:.0f} s with "
                  f"{engine.active_count} requests in it")
    else:
        status = "ok"
    body = {"status": status, "running": engine.running_count, "waiting": engine.waiting_count,
            "active": engine.active_count, "packed_weights": packing_of(engine.model),
            "step_budget": engine.budget.table()}
    memory = state.memory_tokens()
    if memory is not None:  # `serve --memory`: how much earlier text it holds
        body["memory_tokens"] = memory
    datastore = settings.method_options.get("datastore")
    if datastore is not None:  # `serve --datastore`: the corpus's size
        body["datastore_tokens"] = len(datastore)
    return JSONResponse(body, status_code=200 if status == "ok" else 503)


async def _handle(request: Request, state: _State, chat: bool) -> Response:
    """One completion request, checked cheapest first (see the module docstring)."""
    engine, settings = state.engine, state.settings
    rid = new_id("chatcmpl" if chat else "cmpl")
    request.state.request_id = rid
    _check_content_type(request.headers.get("content-type"))
    try:
        raw = await read_body(request, settings.max_body_bytes)
    except BodyTooLargeError:
        return too_large_error(settings.max_body_bytes)
    except ClientDisconnect:  # gone before its body was whole: nobody to answer
        return Response(status_code=499)
    body = await state.run(_validate, raw, ChatCompletionRequest if chat else CompletionRequest)
    if body.model != settings.model_name:
        raise ApiError(404, f"The model '{body.model}' does not exist; this server serves "
                       f"'{settings.model_name}'", "model", code="model_not_found")
    limit, waiting = engine.config.max_queue, engine.waiting_count + state.preparing
    if waiting + body.n > limit:
        room = f"room for {body.n} choices" if body.n > 1 else "room"
        raise ApiError(429, f"{waiting} requests are already waiting (max_queue={limit}), no "
                       f"{room}; retry later", None, "rate_limit_exceeded", "queue_full")
    check_prompt_size(body, chat, settings.prompt_char_limit(engine.context_length))
    key = getattr(request.state, "api_key_index", None)
    memory = state.memory_for(key)
    state.preparing += body.n
    try:
        decoders, method = await state.run(prepare, engine, settings, body, chat, memory,
                                           state.structured, state.successors_for(key))
        handles = _submit(engine, decoders, body, method, rid)
    finally:
        state.preparing -= body.n
    formatters = None
    if body.logprob_count is not None:
        formatters = [LogprobFormatter(engine.tokenizer, d.prompt, chat) for d in decoders]
    calls = chat and bool(body.tools) and tool_choice_of(body.tool_choice, body.tools) != "none"
    if body.stream:
        return stream_response(handles, rid, body.model, chat, body.include_usage, formatters,
                               calls)
    return await complete_response(request, handles, rid, body.model, chat,
                                   with_stats=not settings.shares_memory, formatters=formatters,
                                   calls=calls)


def _submit(engine: Engine, decoders: list, body, method: str, rid: str) -> list:
    """Submit every choice; none stays queued if one cannot be."""
    handles = []
    try:
        for index, decoder in enumerate(decoders):
            handles.append(engine.submit(
                decoder, stop=body.stop_strings, method=method, loop=asyncio.get_running_loop(),
                request_id=rid if len(decoders) == 1 else f"{rid}-{index}"))
    except QueueFullError as error:
        _cancel(handles)
        raise ApiError(429, str(error), None, "rate_limit_exceeded", "queue_full") from None
    except EngineClosedError as error:
        _cancel(handles)
        raise ApiError(503, str(error), None, "server_error") from None
    return handles


def _cancel(handles: list) -> None:
    for handle in handles:
        handle.cancel()


def _check_content_type(header: str | None) -> None:
    """415 unless the body is declared ``application/json`` (charset utf-8 or none).

    A web page may post ``text/plain`` (or a form) to any address without a CORS preflight;
    refusing everything but JSON keeps such pages off a loopback server.
    """
    media, _, parameters = (header or "").partition(";")
    charset = None
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip('"').lower()
    if media.strip().lower() != "application/json" or charset not in (None, "utf-8", "utf8"):
        got = f"'{header}'" if header else "none"
        raise ApiError(415, f"the body must be JSON sent with 'Content-Type: application/json' "
                       f"(charset utf-8 if any); got {got}", None,
                       code="unsupported_media_type")


def _validate(raw: bytes, model: type):
    """The request body as ``model``; a 400 naming the field otherwise (worker thread)."""
    try:
        return model.model_validate(parse_body(raw))
    except BodyError as error:
        raise ApiError(400, str(error), error.param) from None
    except ValidationError as error:
        raise _validation_error(error.errors(include_url=False, include_input=False),
                                prefix=()) from None


# ----------------------------------------------------------------------------- errors


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        found = _validation_error(error.errors(), prefix=("body",))
        return JSONResponse(found.body(), status_code=found.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(error.detail), "invalid_request_error"),
                            status_code=error.status_code)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        # The exception's text can quote internals (paths, other requests' data): it goes to
        # the log only, under an id the client can quote.
        rid = getattr(request.state, "request_id", None) or new_id("error")
        logger.exception("request %s failed", rid)
        return JSONResponse(error_body(f"the server failed on request {rid}; its log has the "
                                       "details", "server_error"), status_code=500)


def _validation_error(errors, prefix: tuple) -> ApiError:
    """pydantic's first error as a 400 naming the field (``messages[0].role``)."""
    first = errors[0] if errors else {}
    loc = tuple(first.get("loc", ()))
    param = _param_of_loc(loc[len(prefix):] if loc[: len(prefix)] == prefix else loc)
    kind = first.get("type")
    if kind == "missing":
        return ApiError(400, f"Missing required parameter: '{param}'", param,
                        code="missing_required_parameter")
    if kind == "json_invalid":
        return ApiError(400, "The body is not valid JSON")
    where = f"'{param}'" if param else "the body"
    return ApiError(400, f"Invalid value for {where}: {first.get('msg', 'invalid')}", param,
                    code=_openai_code(kind, first.get("ctx") or {}))


# OpenAI's codes for pydantic's error types; the protocol's own refusals carry theirs.
_BOUNDS = {"greater_than": "below_min_value", "greater_than_equal": "below_min_value",
           "less_than": "above_max_value", "less_than_equal": "above_max_value"}
_CODES = {"literal_error": "invalid_value", "enum": "invalid_value",
          "value_error": "invalid_value", "too_long": "array_above_max_length",
          "too_short": "array_below_min_length", "unsupported_parameter": "unsupported_parameter",
          "unsupported_value": "unsupported_value", "invalid_value": "invalid_value"}


def _openai_code(kind: str | None, ctx: dict) -> str | None:
    """OpenAI's error code for a pydantic error type (``int_type`` -> ``invalid_type``)."""
    if kind is None:
        return None
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()), 0)
        return ("decimal_" if isinstance(bound, float) else "integer_") + _BOUNDS[kind]
    if kind == "too_short" and ctx.get("min_length") == 1:
        return "empty_array"
    if kind.endswith("_type") or kind in ("union_tag_invalid", "is_instance_of"):
        return "invalid_type"
    return _CODES.get(kind)


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def _param_of_loc(loc) -> str | None:
    """pydantic's error location -> the field, e.g. ("messages", 0, "role") ->
    "messages[0].role"; union member tags ("str", "list[int]") are left out."""
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
            continue
        if part in _TYPE_TAGS or "[" in part or part.startswith("function-") or part[:1].isupper():
            break
        param += ("." if param else "") + part
    return param or None
