"""Structured output and tool calls for the chat API: which grammar a request decodes under,
its prompt with the tools rendered, and its answer split into content and ``tool_calls``.

``response_format`` (``json_object``, ``json_schema``) and a ``tool_choice`` of "required" or
a named function constrain decoding with a grammar (``lookahead.grammar``, xgrammar): the mask
applies at every position speculation verifies, so greedy output is the model's constrained
greedy output and sampling the constrained distribution. With ``tools`` the prompt is rendered
by the chat template's ``tools=``, and the answer is parsed into OpenAI's ``tool_calls``
(``lookahead.tools``), streamed too (``StreamSplitter``).
"""

from __future__ import annotations

import json
import threading

import torch

from lookahead.proposers.base import vocab_size
from lookahead.request import eos_token_ids
from lookahead.server.protocol import ApiError
from lookahead.tools import ToolCallParser, check_tool_choice, parse_tool_calls, render_prompt


class StructuredOutput:
    """The server's grammar compiler, built on first use (about a second: it indexes the
    vocabulary) and shared by every request; one per model."""

    def __init__(self, model, tokenizer) -> None:
        self.model, self.tokenizer = model, tokenizer
        self._compiler = None
        self._lock = threading.Lock()

    def compiler(self):
        with self._lock:
            if self._compiler is None:
                from lookahead.grammar import GrammarCompiler

                try:
                    self._compiler = GrammarCompiler(
                        self.tokenizer, vocab_size=vocab_size(self.model),
                        stop_token_ids=eos_token_ids(self.model))
                except ImportError as error:  # the extra is not installed
                    raise ApiError(400, str(error), "response_format",
                                   code="unsupported_value") from None
            return self._compiler

    def grammar(self, body):
        """The grammar ``body`` decodes under, or None: a required or named tool call first,
        else its ``response_format``."""
        choice = tool_choice_of(body.tool_choice, body.tools)  # "required" needs tools
        if body.tools and choice not in ("auto", "none"):
            from lookahead.tools import tool_call_grammar

            return _checked(lambda: tool_call_grammar(self.compiler(), body.tools,
                                                      body.tool_choice), "tools")
        kind = (body.response_format or {}).get("type", "text")
        if kind == "text":
            return None
        # Compact JSON (one space after "," and ":"): free whitespace lets a small model
        # write blank lines until its token limit, which no client can parse.
        if kind == "json_object":
            return _checked(lambda: self.compiler().json(any_whitespace=False),
                            "response_format")
        spec = body.response_format["json_schema"]
        return _checked(lambda: self.compiler().json_schema(
            spec["schema"], any_whitespace=False, strict=bool(spec.get("strict", True))),
            "response_format")

    def prompt(self, body, messages: list[dict]) -> torch.Tensor:
        """Token ids [1, L] of the conversation with ``body.tools`` rendered by the template."""
        tool_choice_of(body.tool_choice, body.tools)  # a bad choice is named as such
        text = _checked(lambda: render_prompt(self.tokenizer, messages, body.tools,
                                              body.tool_choice), "tools")
        return self.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]


def _checked(build, param: str):
    try:
        return build()
    except (ValueError, TypeError) as error:
        raise ApiError(400, str(error), param, code="invalid_value") from None


def tool_choice_of(tool_choice, tools) -> str:
    """``lookahead.tools.check_tool_choice`` with its errors as 400s naming ``tool_choice``."""
    return _checked(lambda: check_tool_choice(tool_choice, tools), "tool_choice")


def template_messages(messages) -> list[dict]:
    """The request's messages as the chat template takes them: an assistant's ``tool_calls``
    with their arguments as objects (templates write them with ``tojson``), a tool's answer
    with its ``tool_call_id``."""
    out = []
    for message in messages:
        item = {"role": message.role, "content": message.text}
        if message.tool_calls:
            item["tool_calls"] = [_call_for_template(call) for call in message.tool_calls]
        if message.tool_call_id is not None:
            item["tool_call_id"] = message.tool_call_id
        out.append(item)
    return out


def _call_for_template(call: dict) -> dict:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments)
        except json.JSONDecodeError:
            pass  # the template writes the string as it is
    return {**call, "function": function}


def split_answer(text: str) -> tuple[str | None, list[dict]]:
    """A whole answer's (content, tool_calls)."""
    return parse_tool_calls(text)


class StreamSplitter:
    """One streamed choice's text split into content deltas and complete tool calls."""

    def __init__(self) -> None:
        self.parser = ToolCallParser()
        self.calls = 0

    def feed(self, text: str) -> tuple[str, list[dict]]:
        """(the content to send now, the calls completed by ``text``, each with its index)."""
        content, calls = self.parser.feed(text)
        indexed = []
        for call in calls:
            indexed.append({"index": self.calls, **call})
            self.calls += 1
        return content, indexed

    def finish(self) -> str:
        return self.parser.finish()
