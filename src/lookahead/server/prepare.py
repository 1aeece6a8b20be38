"""A checked request body turned into its ``Decoder``s: the prompt tokenized (chat template
included), its length checked against the context, the method and its options, the sampling
options, the penalties and ``logit_bias`` (``lookahead.penalties``, applied by
``lookahead.controls.Controls`` at every verified position) and ``logprobs``.

``n`` choices are ``n`` decoders over the same prompt, each its own engine request; with a
``seed``, choice i samples with seed + i (greedy choices are all the same text, as OpenAI's
are). Runs in the app's worker thread, never on the event loop; every bad argument is an
``ApiError`` (400) naming its field, with OpenAI's error code where it has one.
"""

from __future__ import annotations

import re

import torch
from jinja2 import TemplateError

from lookahead.config import method_names, method_spec
from lookahead.request import make_decoder
from lookahead.controls import Controls
from lookahead.models.load import chat_prompt
from lookahead.penalties import penalty_processors
from lookahead.server.protocol import ApiError
from lookahead.server.structured import StructuredOutput, template_messages
from lookahead.sources.memory import TextMemory

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def check_prompt_size(body, chat: bool, limit: int) -> None:
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


def prepare(engine, settings, body, chat: bool, memory: TextMemory | None,
            structured: StructuredOutput | None = None, successors=None):
    """(the ``body.n`` decoders, the method): the prompt tokenized, the decoders built;
    ``structured``: the grammars of ``response_format`` and tool calls (chat only);
    ``successors``: the client's ``SuccessorTable`` for the methods that recycle."""
    grammar = None
    if chat:
        messages = template_messages(body.messages)
        try:
            if body.tools:
                ids = structured.prompt(body, messages)
            else:
                ids = chat_prompt(engine.tokenizer, messages)
        except (ValueError, TypeError, KeyError, TemplateError) as error:  # e.g. a role it rejects
            raise ApiError(400, f"cannot apply the chat template: {error}", "messages") from None
        grammar = structured.grammar(body) if structured is not None else None
    elif isinstance(body.prompt, str):
        ids = engine.tokenizer(body.prompt, return_tensors="pt")["input_ids"]
    else:
        ids = _token_ids(body.prompt, engine)
    return decoders(engine, settings, body, ids, chat, memory, grammar, successors)


def token_limit(engine, settings, body, prompt_len: int, chat: bool) -> int:
    """The new tokens the request gets; a 400 where the prompt and they do not fit."""
    what = "messages" if chat else "prompt"
    context = engine.context_length
    if prompt_len == 0:
        raise ApiError(400, "the prompt encodes to no tokens", what)
    if context is not None and prompt_len >= context:
        raise ApiError(400, f"This model's maximum context length is {context} tokens. However, "
                       f"your {what} resulted in {prompt_len} tokens. Please reduce the length "
                       f"of the {what}.", what, code="context_length_exceeded")
    asked = body.token_limit if chat else body.max_tokens
    field = "max_completion_tokens" if chat and body.max_completion_tokens else "max_tokens"
    if asked is not None and asked > settings.max_tokens:
        raise ApiError(400, f"{field} is {asked}; this server writes at most "
                       f"{settings.max_tokens} tokens per request (--max-tokens)", field,
                       code="integer_above_max_value")
    room = (context - prompt_len) if context is not None else 1 << 30
    if asked is None:  # OpenAI's defaults, under --max-tokens: 16 for completions
        return min(COMPLETION_DEFAULT_MAX_TOKENS if not chat else settings.max_tokens, room)
    if context is not None and prompt_len + asked > context:
        raise ApiError(400, f"This model's maximum context length is {context} tokens. However, "
                       f"you requested {prompt_len + asked} tokens ({prompt_len} in the {what}, "
                       f"{asked} in the completion). Please reduce the length of the {what} or "
                       f"{field}.", field, code="context_length_exceeded")
    return asked


def decoders(engine, settings, body, input_ids: torch.Tensor, chat: bool,
             memory: TextMemory | None, grammar=None, successors=None):
    """The request's ``body.n`` ``Decoder``s and its method (see the module docstring);
    ``grammar``: a ``lookahead.grammar.Grammar`` every choice decodes under."""
    max_tokens = token_limit(engine, settings, body, input_ids.shape[1], chat)
    method, options = method_options(settings, body)
    if memory is not None and method == settings.method and method_spec(method).copies_text:
        options["memory"] = memory
    # A sampled text is reproduced by its seed: its draws follow its proposals, which a table
    # other requests change would change; it recycles from a table of its own.
    if (successors is not None and not options.get("do_sample")
            and method in method_names() and method_spec(method).recycles):
        options["successors"] = successors
    vocab = _vocab_size(engine)
    try:  # checked once here, built again for every choice: Controls keeps per-text state
        penalty_processors(input_ids.shape[1], vocab_size=vocab, **body.penalties)
    except ValueError as error:
        raise ApiError(400, str(error), _penalty_param(str(error)), code="invalid_value") from None
    out = []
    for choice in range(body.n):
        processors = penalty_processors(input_ids.shape[1], vocab_size=vocab, **body.penalties)
        if grammar is not None:  # last: the mask holds whatever the penalties did
            processors = [*processors, grammar.processor()]
        controls = Controls(processors) if processors else None
        chosen = dict(options)
        if chosen.get("seed") is not None:
            chosen["seed"] += choice
        try:
            out.append(make_decoder(engine.model, input_ids, max_tokens, method,
                                    controls=controls, logprobs=body.logprob_count, **chosen))
        except (ValueError, TypeError) as error:
            raise ApiError(400, str(error), _param_of(str(error))) from None
    return out, method


_BODY_SAMPLING = ("do_sample", "temperature", "top_k", "top_p", "seed")
_SERVER_ONLY = ("draft_model", "eos_token_id", "memory", "datastore", "workload", "successors")


def method_options(settings, body) -> tuple[str, dict]:
    """The method and ``make_decoder`` options: the server's defaults for its own method, the
    request's ``lookahead`` field over them, then sampling from the body's own fields."""
    extra = body.lookahead
    method = extra.method or settings.method
    options = dict(settings.method_options) if method == settings.method else {}
    for key, value in extra.options.items():
        if key in _BODY_SAMPLING or key in _SERVER_ONLY:
            where = "the body's own fields" if key in _BODY_SAMPLING else "the server"
            raise ApiError(400, f"lookahead.{key} is not a per-request option here; it is set "
                           f"by {where}", f"lookahead.{key}", code="unsupported_parameter")
        options[key] = value
    if method == "draft":
        if settings.draft_model is None:
            raise ApiError(400, "method 'draft' needs the server started with --draft-model",
                           "lookahead.method", code="unsupported_value")
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


def _penalty_param(message: str) -> str | None:
    """The field a ``penalty_processors`` error names (``logit_bias[12]`` -> logit_bias)."""
    match = re.match(r"(\w+)", message)
    return match.group(1) if match else None


def _vocab_size(engine) -> int:
    config = engine.model.config
    return (config.get_text_config() if hasattr(config, "get_text_config") else config).vocab_size


def _token_ids(prompt: list[int], engine) -> torch.Tensor:
    vocab = _vocab_size(engine)
    if any(not 0 <= t < vocab for t in prompt):
        raise ApiError(400, f"prompt token ids must be in [0, {vocab})", "prompt")
    return torch.tensor([prompt], dtype=torch.long)
