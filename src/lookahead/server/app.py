"""The HTTP side: an OpenAI-compatible FastAPI app in front of one ``Engine``.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both streamed as SSE when
``stream`` is true), ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text).

A request is checked and turned into a ``Decoder`` here, in the event loop (so that every bad
argument is a 400 before anything reaches the engine), then submitted to the engine; its
events come back through the request's ``RequestHandle``. A client that goes away cancels its
request: the engine drops it from the batch at its next iteration.

Errors use OpenAI's body ``{"error": {"message", "type", "param", "code"}}``: 400 for a bad
request (``param`` names the field), 404 for an unknown model, 429 when the queue is full,
500 when decoding failed. The server keeps serving after every one of them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from jinja2 import TemplateError
from starlette.exceptions import HTTPException as StarletteHTTPException

from lookahead.api import make_decoder
from lookahead.config import METHODS
from lookahead.models.load import chat_prompt
from lookahead.kernels.packing import packing_of
from lookahead.server.engine import (
    Engine,
    EngineClosedError,
    ErrorEvent,
    FinishEvent,
    QueueFullError,
    TokenEvent,
)
from lookahead.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    chunk_body,
    completion_body,
    error_body,
    new_id,
    usage,
)

logger = logging.getLogger(__name__)

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class ApiError(Exception):
    """An error answered with OpenAI's error body."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 error_type: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = (
            status, message, param, error_type, code)

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, self.type, self.param, self.code),
                            status_code=self.status)


@dataclass(frozen=True)
class ServerSettings:
    """What the server was started with (read once; requests override per request).

    model_name: the name clients pass as ``model``. method / method_options: the default
    method and its options. draft_model: the loaded draft for method "draft", if any.
    """

    model_name: str
    method: str = "lookahead"
    method_options: Mapping[str, object] = field(default_factory=dict)
    draft_model: object | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}; got {self.method!r}")


def create_app(engine: Engine, settings: ServerSettings) -> FastAPI:
    """The FastAPI app serving ``engine``. The caller starts and stops the engine."""
    app = FastAPI(title="lookahead", version="0.1.0")
    app.state.engine, app.state.settings = engine, settings
    _install_error_handlers(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        status = 200 if engine.alive else 503
        body = {"status": "ok" if engine.alive else "engine stopped",
                "running": engine.running_count, "waiting": engine.waiting_count,
                "active": engine.active_count,
                "packed_weights": packing_of(engine.model),
                "step_budget": engine.budget.table()}
        memory = settings.method_options.get("memory")
        if memory is not None:  # `serve --memory`: how much earlier text it holds
            body["memory_tokens"] = len(memory)
        datastore = settings.method_options.get("datastore")
        if datastore is not None:  # `serve --datastore`: the corpus's size
            body["datastore_tokens"] = len(datastore)
        return JSONResponse(body, status_code=status)

    @app.get("/v1/models")
    async def models() -> dict:
        card = {"id": settings.model_name, "object": "model", "created": 0, "owned_by": "lookahead"}
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(engine.metrics.render(),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        if isinstance(body.prompt, str):
            ids = engine.tokenizer(body.prompt, return_tensors="pt")["input_ids"]
        else:
            ids = _token_ids(body.prompt, engine)
        return await _serve(request, body, ids, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        messages = [{"role": m.role, "content": m.text} for m in body.messages]
        try:
            ids = chat_prompt(engine.tokenizer, messages)
        except (ValueError, TypeError, KeyError, TemplateError) as error:  # e.g. a role it rejects
            raise ApiError(400, f"cannot apply the chat template: {error}", "messages") from None
        return await _serve(request, body, ids, chat=True)

    return app


async def _serve(request: Request, body, input_ids, chat: bool) -> Response:
    engine: Engine = request.app.state.engine
    settings: ServerSettings = request.app.state.settings
    if body.model != settings.model_name:
        raise ApiError(404, f"The model '{body.model}' does not exist; this server serves "
                       f"'{settings.model_name}'", "model", code="model_not_found")
    decoder, method = _decoder(engine, settings, body, input_ids, chat)
    try:
        handle = engine.submit(decoder, stop=body.stop_strings, method=method,
                               loop=asyncio.get_running_loop())
    except QueueFullError as error:
        raise ApiError(429, str(error), None, "rate_limit_exceeded", "queue_full") from None
    except EngineClosedError as error:
        raise ApiError(503, str(error), None, "server_error") from None
    rid = new_id("chatcmpl" if chat else "cmpl")
    if body.stream:
        stream = _sse(handle, rid, body.model, chat, body.include_usage)
        return StreamingResponse(stream, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return await _complete(request, handle, rid, body.model, chat)


def _decoder(engine: Engine, settings: ServerSettings, body, input_ids, chat: bool):
    """The request's ``Decoder`` and method; every invalid argument is a 400 naming its field."""
    prompt_param = "messages" if chat else "prompt"
    context = engine.context_length
    prompt_len = input_ids.shape[1]
    if prompt_len == 0:
        raise ApiError(400, "the prompt encodes to no tokens", prompt_param)
    if context is not None and prompt_len >= context:
        raise ApiError(400, f"This model's maximum context length is {context} tokens; the "
                       f"prompt has {prompt_len} tokens", prompt_param,
                       code="context_length_exceeded")
    max_tokens = body.token_limit if chat else body.max_tokens
    if max_tokens is None:  # OpenAI's defaults: 16 for completions, the context's rest for chat
        room = (context - prompt_len) if context is not None else 1 << 30
        max_tokens = room if chat else min(COMPLETION_DEFAULT_MAX_TOKENS, room)
    if context is not None and prompt_len + max_tokens > context:
        field = "max_completion_tokens" if chat and body.max_tokens is None else "max_tokens"
        raise ApiError(400, f"This model's maximum context length is {context} tokens; the "
                       f"prompt has {prompt_len} tokens and {field} is {max_tokens}", field,
                       code="context_length_exceeded")
    method, options = _method_options(settings, body)
    try:
        decoder = make_decoder(engine.model, input_ids, max_tokens, method, **options)
    except (ValueError, TypeError) as error:
        raise ApiError(400, str(error), _param_of(str(error))) from None
    return decoder, method


_BODY_SAMPLING = ("do_sample", "temperature", "top_k", "top_p", "seed")
_SERVER_ONLY = ("draft_model", "eos_token_id", "memory", "datastore", "workload")


def _method_options(settings: ServerSettings, body) -> tuple[str, dict]:
    """The method and ``make_decoder`` options: the server's defaults for its own method, the
    request's ``lookahead`` field over them, then sampling from the body's own fields."""
    extra = body.lookahead
    method = extra.method or settings.method
    options = dict(settings.method_options) if method == settings.method else {}
    for key, value in extra.options.items():
        if key in _BODY_SAMPLING or key in _SERVER_ONLY:
            where = "the body's own fields" if key in _BODY_SAMPLING else "the server"
            raise ApiError(400, f"lookahead.{key} is not a per-request option here; it is set "
                           f"by {where}", f"lookahead.{key}")
        options[key] = value
    if method == "draft":
        if settings.draft_model is None:
            raise ApiError(400, "method 'draft' needs the server started with --draft-model",
                           "lookahead.method")
        options["draft_model"] = settings.draft_model
    if body.temperature > 0:  # 0 is greedy, as in the OpenAI API
        options.update(do_sample=True, temperature=body.temperature, top_p=body.top_p,
                       top_k=body.top_k, seed=body.seed)
    if extra.ignore_eos:
        options["eos_token_id"] = []
    return method, options


_TOP_LEVEL = frozenset({"temperature", "top_p", "top_k", "seed"})


def _param_of(message: str) -> str | None:
    """The request field a library error message is about (its messages start with it)."""
    if message.startswith("unknown option"):
        return "lookahead"
    if "exceeds the model's context" in message:
        return "max_tokens"
    match = re.match(r"(\w+) must", message)
    if not match:
        return None
    name = match.group(1)
    if name == "max_new_tokens":
        return "max_tokens"
    if name in _TOP_LEVEL:
        return name
    return f"lookahead.{name}"


def _token_ids(prompt: list[int], engine: Engine):
    import torch

    config = engine.model.config
    vocab = (config.get_text_config() if hasattr(config, "get_text_config") else config).vocab_size
    if any(not 0 <= t < vocab for t in prompt):
        raise ApiError(400, f"prompt token ids must be in [0, {vocab})", "prompt")
    return torch.tensor([prompt], dtype=torch.long)


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
                yield _sse_data(error_body(event.message, "server_error"))
        yield _sse_data("[DONE]")
    finally:
        if not finished:
            handle.cancel()


async def _complete(request: Request, handle, rid: str, model: str, chat: bool) -> Response:
    """Wait for the whole answer, watching for the client going away meanwhile."""
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
        raise ApiError(500, event.message, None, "server_error")
    stats = {"method": event.stats.method, "steps": event.stats.steps,
             "tokens_per_step": round(event.stats.tokens_per_step, 3),
             "mean_accepted": round(event.stats.mean_accepted, 3),
             "seconds": round(event.stats.seconds, 4),
             "time_to_first_token": round(event.stats.time_to_first_token, 4)}
    counts = usage(event.prompt_tokens, event.completion_tokens)
    return JSONResponse(completion_body(rid, model, "".join(text), event.reason, counts, chat, stats))


# ----------------------------------------------------------------------------- errors


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError) -> JSONResponse:
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        param = _param_of_loc(first.get("loc", ()))
        if first.get("type") == "missing":
            message = f"Missing required parameter: '{param}'"
        elif first.get("type") == "json_invalid":
            message, param = "The body is not valid JSON", None
        else:
            message = f"Invalid value for '{param}': {first.get('msg', 'invalid')}"
        return JSONResponse(error_body(message, param=param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(error.detail), "invalid_request_error"),
                            status_code=error.status_code)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, error: Exception) -> JSONResponse:
        logger.exception("unexpected error")
        return JSONResponse(error_body(f"{type(error).__name__}: {error}", "server_error"),
                            status_code=500)


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def _param_of_loc(loc) -> str | None:
    """pydantic's error location -> the field, e.g. ("body", "messages", 0, "role") ->
    "messages[0].role"; union member tags ("str", "list[int]") are left out."""
    param = ""
    for part in list(loc)[1:]:
        if isinstance(part, int):
            param += f"[{part}]"
            continue
        if part in _TYPE_TAGS or "[" in part or part.startswith("function-") or part[:1].isupper():
            break
        param += ("." if param else "") + part
    return param or None
