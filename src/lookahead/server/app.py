"""The HTTP side: an OpenAI-compatible FastAPI app in front of one ``Engine``.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both streamed as SSE when
``stream`` is true), ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text).

Before an endpoint runs, ``guard.Guard`` checks the Host header, the API key and the declared
body size. A request is then checked cheapest first, so that a flood of bad or oversized
requests costs little: the body is read up to ``max_body_bytes``; it is parsed and its fields
checked (strict types, in a worker thread); the model name; whether the queue has room; the
prompt's length in characters. Only then is the prompt tokenized (chat template included) and
the ``Decoder`` built, in the worker thread, never on the event loop, which must stay free to
answer ``/health`` and stream other requests. Every bad argument is a 400 before anything
reaches the engine; the request is then submitted and its events come back through its
``RequestHandle`` (``respond.py``).

Errors use OpenAI's body ``{"error": {"message", "type", "param", "code"}}``: 400 for a bad
request (``param`` names the field), 401 without the API key, 404 for an unknown model, 413
for a body over the limit, 429 when the queue is full, 500 when decoding failed (the message
names the request's id, which the log has with the traceback; it never quotes an exception),
503 while shutting down, 504 past ``--request-timeout``. The server keeps serving after every
one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from jinja2 import TemplateError
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from lookahead.request import make_decoder
from lookahead.config import method_spec
from lookahead.kernels.packing import packing_of
from lookahead.models.load import chat_prompt
from lookahead.server.engine import Engine, EngineClosedError, QueueFullError
from lookahead.server.guard import BodyTooLargeError, Guard, read_body, too_large_error
from lookahead.server.metrics import CONTENT_TYPE
from lookahead.sources.memory import DEFAULT_CAPACITY, TextMemory
from lookahead.server.protocol import (
    BodyError,
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
    new_id,
    parse_body,
)
from lookahead.server.respond import complete_response, stream_response

logger = logging.getLogger(__name__)

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# Characters per token that a prompt may average before it is refused untokenized (see
# ServerSettings.max_prompt_chars): real text averages 3-5; 32 leaves room for odd text.
PROMPT_CHARS_PER_TOKEN = 32
MEMORY_SCOPES = ("per-key", "shared")


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
        self.preparing = 0  # changed on the event loop only

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
    limit = engine.config.max_queue
    if engine.waiting_count + state.preparing >= limit:
        raise ApiError(429, f"{engine.waiting_count + state.preparing} requests are already "
                       f"waiting (max_queue={limit}); retry later", None,
                       "rate_limit_exceeded", "queue_full")
    _check_prompt_size(body, chat, settings.prompt_char_limit(engine.context_length))
    memory = state.memory_for(getattr(request.state, "api_key_index", None))
    state.preparing += 1
    try:
        decoder, method = await state.run(_prepare, engine, settings, body, chat, memory)
        handle = engine.submit(decoder, stop=body.stop_strings, method=method,
                               loop=asyncio.get_running_loop(), request_id=rid)
    except QueueFullError as error:
        raise ApiError(429, str(error), None, "rate_limit_exceeded", "queue_full") from None
    except EngineClosedError as error:
        raise ApiError(503, str(error), None, "server_error") from None
    finally:
        state.preparing -= 1
    if body.stream:
        return stream_response(handle, rid, body.model, chat, body.include_usage)
    return await complete_response(request, handle, rid, body.model, chat,
                                   with_stats=not settings.shares_memory)


def _validate(raw: bytes, model: type):
    """The request body as ``model``; a 400 naming the field otherwise (worker thread)."""
    try:
        return model.model_validate(parse_body(raw))
    except BodyError as error:
        raise ApiError(400, str(error), error.param) from None
    except ValidationError as error:
        raise _validation_error(error.errors(include_url=False, include_input=False),
                                prefix=()) from None


def _check_prompt_size(body, chat: bool, limit: int) -> None:
    """Refuse a prompt that cannot fit before tokenizing it (tokenizing costs its length)."""
    if chat:
        chars = sum(len(message.text) for message in body.messages)
        param = "messages"
    else:
        chars, param = len(body.prompt), "prompt"  # characters, or token ids
        if not isinstance(body.prompt, str):
            return  # token ids: at most the body size allows; checked against the context
    if chars > limit:
        raise ApiError(400, f"the prompt has {chars} characters; this server takes at most "
                       f"{limit} (--max-prompt-chars)", param, code="context_length_exceeded")


def _prepare(engine: Engine, settings: ServerSettings, body, chat: bool,
             memory: TextMemory | None):
    """Tokenize the prompt and build the request's ``Decoder`` (in the worker thread)."""
    if chat:
        messages = [{"role": m.role, "content": m.text} for m in body.messages]
        try:
            ids = chat_prompt(engine.tokenizer, messages)
        except (ValueError, TypeError, KeyError, TemplateError) as error:  # e.g. a role it rejects
            raise ApiError(400, f"cannot apply the chat template: {error}", "messages") from None
    elif isinstance(body.prompt, str):
        ids = engine.tokenizer(body.prompt, return_tensors="pt")["input_ids"]
    else:
        ids = _token_ids(body.prompt, engine)
    return _decoder(engine, settings, body, ids, chat, memory)


def _decoder(engine: Engine, settings: ServerSettings, body, input_ids, chat: bool,
             memory: TextMemory | None):
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
    asked = body.token_limit if chat else body.max_tokens
    field = "max_completion_tokens" if chat and body.max_completion_tokens else "max_tokens"
    if asked is not None and asked > settings.max_tokens:
        raise ApiError(400, f"{field} is {asked}; this server writes at most "
                       f"{settings.max_tokens} tokens per request (--max-tokens)", field)
    room = (context - prompt_len) if context is not None else 1 << 30
    if asked is None:  # OpenAI's defaults, under --max-tokens: 16 for completions
        max_tokens = min(COMPLETION_DEFAULT_MAX_TOKENS if not chat else settings.max_tokens,
                         room)
    else:
        max_tokens = asked
    if context is not None and prompt_len + max_tokens > context:
        raise ApiError(400, f"This model's maximum context length is {context} tokens; the "
                       f"prompt has {prompt_len} tokens and {field} is {max_tokens}", field,
                       code="context_length_exceeded")
    method, options = _method_options(settings, body)
    if memory is not None and method == settings.method and method_spec(method).copies_text:
        options["memory"] = memory
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


# ----------------------------------------------------------------------------- errors


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError) -> JSONResponse:
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        return _validation_error(error.errors(), prefix=("body",)).response()

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
    if first.get("type") == "missing":
        return ApiError(400, f"Missing required parameter: '{param}'", param)
    if first.get("type") == "json_invalid":
        return ApiError(400, "The body is not valid JSON")
    where = f"'{param}'" if param else "the body"
    return ApiError(400, f"Invalid value for {where}: {first.get('msg', 'invalid')}", param)


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
