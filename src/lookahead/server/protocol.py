"""The OpenAI wire format: request bodies (validated by pydantic), responses and errors.

Only what the engine can honour is accepted: ``echo``, ``suffix``, ``best_of`` other than
``n``, and the legacy ``functions`` / ``function_call`` are refused with a 400 naming the
field, rather than silently ignored. Unknown fields are ignored, as OpenAI does. ``n``,
``logprobs`` (chat: with ``top_logprobs``), ``presence_penalty``, ``frequency_penalty``,
``logit_bias``, vLLM's ``repetition_penalty``, and in chat ``response_format`` (JSON mode and
JSON schema) and ``tools`` / ``tool_choice`` (``lookahead.server.structured``) are honoured.

The extra body field ``lookahead`` picks the method and its shape per request::

    {"model": "smollm2-135m", "prompt": "def f(x):", "max_tokens": 64, "temperature": 0,
     "lookahead": {"method": "prompt_lookup", "num_draft_tokens": 8}}

Its other keys are the method's options (``lookahead.config.MethodSpec.options``), checked by the
library's own config classes; ``ignore_eos`` keeps decoding past end-of-sequence tokens.

Types are strict: ``"max_tokens": "16"`` or ``"stream": "yes"`` is a 400, not a guess (an
integer is accepted where a number is expected). A validator's refusal carries OpenAI's error
code as its pydantic error type (``unsupported_parameter``, ``unsupported_value``, ...), which
the app reports as the error's ``code``. ``parse_body`` reads the raw body: it must be
a JSON object whose strings are valid Unicode (no lone surrogates, which no tokenizer encodes).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from lookahead.logprobs import MAX_TOP_LOGPROBS
from lookahead.penalties import MAX_BIAS, MAX_PENALTY

MAX_STOP_STRINGS = 4
MAX_STOP_LENGTH = 256  # characters of one stop string: held back text grows with it
MAX_CHOICES = 128  # OpenAI's limit for n


def refuse(code: str, message: str) -> PydanticCustomError:
    """A validator's refusal whose pydantic type is OpenAI's error ``code``."""
    return PydanticCustomError(code, message.replace("{", "{{").replace("}", "}}"))


class _Strict(BaseModel):
    """No coercion: a string is not a number, 1 is not True (an int is a valid float)."""

    model_config = ConfigDict(strict=True, extra="ignore")


class LookaheadOptions(_Strict):
    """The ``lookahead`` extra field: method, method options, ``ignore_eos``."""

    model_config = ConfigDict(strict=True, extra="allow")

    method: str | None = None
    ignore_eos: bool = False

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    """Fields common to both endpoints."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)  # an extension, as in vLLM; 0 = off
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, le=(1 << 63) - 1)
    presence_penalty: float = Field(0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    frequency_penalty: float = Field(0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)  # vLLM's extension; 1 = off
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    lookahead: LookaheadOptions = Field(default_factory=LookaheadOptions)

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, stop):
        if isinstance(stop, list) and len(stop) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        for one in [stop] if isinstance(stop, str) else stop or []:
            if len(one) > MAX_STOP_LENGTH:
                raise ValueError(f"a stop string may have at most {MAX_STOP_LENGTH} characters; "
                                 f"got one of {len(one)}")
        return stop

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, value, info: ValidationInfo):
        if value is not None and info.data.get("stream") is not True:
            raise ValueError("stream_options is only allowed when stream is true")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias_by_token_id(cls, value):
        """{"1234": -100} -> {1234: -100.0}; the ids' range is checked against the model."""
        if value is None:
            return None
        out = {}
        for key, bias in value.items():
            if not key.isascii() or not key.isdigit():
                raise refuse("invalid_value", f"logit_bias keys must be token ids written as "
                             f"strings (\"1234\"), got {key[:32]!r}")
            if not -MAX_BIAS <= bias <= MAX_BIAS:
                raise refuse("invalid_value", f"logit_bias values must be in [-{MAX_BIAS:g}, "
                             f"{MAX_BIAS:g}], got {bias!r} for {key}")
            out[int(key)] = float(bias)
        return out

    @property
    def penalties(self) -> dict[str, Any]:
        """The options of ``lookahead.penalties.penalty_processors``."""
        return {"presence_penalty": self.presence_penalty,
                "frequency_penalty": self.frequency_penalty,
                "repetition_penalty": self.repetition_penalty,
                "logit_bias": self.logit_bias}

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: one prompt, as text or as token ids."""

    prompt: str | list[str] | list[int]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt):
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise refuse("unsupported_value", "only one prompt per request is supported")
            prompt = prompt[0]
        if not prompt:
            raise ValueError("the prompt must not be empty")
        return prompt

    @field_validator("echo", "suffix")
    @classmethod
    def _unsupported(cls, value, info):
        if value:
            raise refuse("unsupported_parameter", f"{info.field_name} is not supported")
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, value, info):
        if value is not None and value != info.data.get("n", 1):
            raise refuse("unsupported_value", "best_of other than n is not supported (the "
                         "server does not rank candidates)")
        return value

    @property
    def logprob_count(self) -> int | None:
        """The ``Decoder``'s ``logprobs``: None, or how many top tokens per position."""
        return self.logprobs


class ContentPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's calls, earlier in the chat
    tool_call_id: str | None = None  # a tool's answer: the call it answers

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``: messages rendered with the tokenizer's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    functions: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    function_call: str | dict[str, Any] | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, value, info):
        if value is not None and info.data.get("logprobs") is not True:
            raise refuse("invalid_value", "top_logprobs needs logprobs set to true")
        return value

    @field_validator("response_format")
    @classmethod
    def _known_format(cls, value):
        kind = (value or {}).get("type", "text")
        if kind not in ("text", "json_object", "json_schema"):
            raise refuse("unsupported_value", "response_format's type must be text, "
                         f"json_object or json_schema, got {kind!r}")
        if kind == "json_schema" and not isinstance(
                (value.get("json_schema") or {}).get("schema"), dict):
            raise refuse("invalid_value", "response_format json_schema needs "
                         "json_schema.schema, a JSON schema object")
        return value

    @field_validator("functions", "function_call")
    @classmethod
    def _no_legacy_functions(cls, value, info):
        if value:
            raise refuse("unsupported_parameter", f"{info.field_name} (the legacy function "
                         "calling) is not supported: use tools and tool_choice")
        return value

    @property
    def logprob_count(self) -> int | None:
        """The ``Decoder``'s ``logprobs``: None without ``logprobs``, else ``top_logprobs``
        (0 when absent)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


# ----------------------------------------------------------------------------- the raw body


class BodyError(ValueError):
    """The body is not a request at all; ``param`` names the field at fault (or None)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body, before the fields are checked.

    Raises ``BodyError`` for text that is not JSON, JSON that is not an object (``null``, a
    list), and a string anywhere that holds a lone UTF-16 surrogate (``"\\ud800"`` is valid
    JSON, but not Unicode that a tokenizer or a JSON answer can encode).
    """
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise BodyError("The body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BodyError(f"the request body must be a JSON object, got {_json_kind(body)}")
    bad = _surrogate_path(body)
    if bad is not None:
        raise BodyError(f"'{bad or 'body'}' holds a lone surrogate (\\ud800-\\udfff), which is "
                        "not valid Unicode", bad or None)
    return body


def _json_kind(value: object) -> str:
    kinds = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "a number", float: "a number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _surrogate_path(body: object) -> str | None:
    """The path (``messages[0].content``) of the first string or key with a lone surrogate."""
    stack: list[tuple[object, str]] = [(body, "")]
    while stack:  # not recursive: a deeply nested body must not exhaust the stack
        value, path = stack.pop()
        if isinstance(value, str):
            if not _is_unicode(value):
                return path
        elif isinstance(value, dict):
            for key, item in value.items():
                where = f"{path}.{key}" if path else str(key)
                if not _is_unicode(key):
                    return path
                stack.append((item, where))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(value))
    return None


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# ----------------------------------------------------------------------------- responses


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def choice_body(index: int, text: str | None, reason: str, chat: bool, logprobs=None,
                tool_calls: list[dict] | None = None) -> dict:
    """One choice of a whole response (``tool_calls``: the calls parsed from the answer)."""
    if chat:
        message = {"role": "assistant", "content": text}
        if tool_calls:
            message["tool_calls"] = tool_calls
        return {"index": index, "message": message, "logprobs": logprobs,
                "finish_reason": "tool_calls" if tool_calls else reason}
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}


def completion_body(rid, model, choices: list[dict], usage_, chat: bool, stats=None) -> dict:
    """A whole (non-streamed) response; ``stats`` (the engine's figures) go in ``lookahead``."""
    body = {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_,
    }
    if stats is not None:
        body["lookahead"] = stats
    return body


def chunk_body(rid, model, chat: bool, text=None, reason=None, role=False, usage_=None,
               index: int = 0, logprobs=None, tool_calls: list[dict] | None = None) -> dict:
    """One SSE chunk of choice ``index``; with ``usage_`` the usage-only chunk (no choices);
    ``tool_calls``: calls completed in this chunk, each with its ``index``."""
    if usage_ is not None:
        choices = []
    elif chat:
        delta = {"role": "assistant", "content": ""} if role else {}
        if text:
            delta["content"] = text
        if tool_calls:
            delta["tool_calls"] = tool_calls
        choices = [{"index": index, "delta": delta, "logprobs": logprobs,
                    "finish_reason": reason}]
    else:
        choices = [{"index": index, "text": text or "", "logprobs": logprobs,
                    "finish_reason": reason}]
    body = {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }
    if usage_ is not None:
        body["usage"] = usage_
    return body


def error_body(message: str, error_type: str = "invalid_request_error",
               param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


class ApiError(Exception):
    """An error answered with OpenAI's error body; ``code`` is OpenAI's error code."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 error_type: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = (
            status, message, param, error_type, code)

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)
