"""OpenAI tool calls: tools in the prompt, a grammar that forces a call, calls parsed back.

    prompt = render_prompt(tokenizer, messages, tools, tool_choice)       # text to tokenize
    grammar = tool_call_grammar(compiler, tools, tool_choice)             # None: unconstrained
    processors = [grammar.processor()] if grammar is not None else []
    ... generate ...
    content, calls = parse_tool_calls(text)  # calls: OpenAI ``tool_calls`` entries

The call format is the one Qwen2.5's chat template (and Hermes-style templates) teach the
model: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one block per call.
``tool_choice`` "required" or a named function forces exactly one such block, whose
arguments follow the function's ``parameters`` schema; "auto" leaves the model free (its
text is parsed for calls), "none" asks for none (its text is content only).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from lookahead.grammar import Grammar, GrammarCompiler, require_xgrammar

logger = logging.getLogger(__name__)

CHOICES = ("auto", "none", "required")


@dataclass(frozen=True)
class ToolCallFormat:
    """How a model writes a call: ``start`` + JSON ``{"name", "arguments"}`` + ``end``."""

    start: str = "<tool_call>\n"
    end: str = "\n</tool_call>"
    separator: str = "\n"  # between two calls


HERMES = ToolCallFormat()  # Qwen2.5, Hermes


def check_tools(tools) -> list[dict]:
    """OpenAI ``tools``: a list of ``{"type": "function", "function": {"name": str,
    "description"?: str, "parameters"?: JSON schema}}``; returns it as a list."""
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)) or not tools:
        raise ValueError(f"tools must be a non-empty list of functions, got {tools!r}")
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or \
                not isinstance(function, Mapping):
            raise ValueError(f"tools[{index}] must be {{'type': 'function', 'function': {{...}}}}, "
                             f"got {tool!r}")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise ValueError(f"tools[{index}].function.name must be a non-empty string")
        if not isinstance(function.get("parameters", {}), Mapping):
            raise ValueError(f"tools[{index}].function.parameters must be a JSON schema object")
    return list(tools)


def check_tool_choice(tool_choice, tools) -> str:
    """``tool_choice`` as "auto", "none", "required" or the name of the function it names
    (None: "auto" with tools, "none" without)."""
    if tool_choice is None:
        return "auto" if tools else "none"
    if isinstance(tool_choice, str):
        if tool_choice not in CHOICES:
            raise ValueError(f"tool_choice must be one of {', '.join(CHOICES)} or "
                             f"{{'type': 'function', 'function': {{'name': ...}}}}, got "
                             f"{tool_choice!r}")
        if tool_choice == "required" and not tools:
            raise ValueError("tool_choice 'required' needs tools")
        return tool_choice
    function = tool_choice.get("function") if isinstance(tool_choice, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str) or tool_choice.get("type") != "function":
        raise ValueError("tool_choice must be one of auto, none, required or {'type': "
                         f"'function', 'function': {{'name': ...}}}}, got {tool_choice!r}")
    if not tools:
        raise ValueError(f"tool_choice names function {name!r} but no tools were given")
    names = [tool["function"]["name"] for tool in check_tools(tools)]
    if name not in names:
        raise ValueError(f"tool_choice names function {name!r}, which is not in tools "
                         f"({', '.join(names)})")
    return name


def render_prompt(tokenizer, messages: list[dict], tools=None, tool_choice=None, *,
                  chat_template: str | None = None, **template_kwargs) -> str:
    """The chat prompt (text) with ``tools`` rendered by the model's chat template (its
    ``tools=`` argument), ready for the assistant's turn. ``chat_template``: a template to use
    instead of the tokenizer's. Tools are rendered for every choice, "none" included (the
    model knows them but is not asked to call); a template that ignores ``tools`` is refused
    rather than silently dropping them."""
    check_tool_choice(tool_choice, tools)
    if tools:
        check_tools(tools)
        template = chat_template or getattr(tokenizer, "chat_template", None) or ""
        if "tools" not in template:
            raise ValueError("this model's chat template does not render tools; give "
                             "chat_template= a template that does (e.g. Qwen2.5's)")
    return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                         add_generation_prompt=True,
                                         chat_template=chat_template, **template_kwargs)


def call_schema(tools, tool_choice) -> dict | None:
    """The JSON schema of one call's ``{"name", "arguments"}`` object for "required" (any of
    the tools) or a named function; None for "auto" and "none"."""
    choice = check_tool_choice(tool_choice, tools)
    if choice in ("auto", "none"):
        return None
    functions = [tool["function"] for tool in check_tools(tools)]
    if choice != "required":
        functions = [f for f in functions if f["name"] == choice]
    options = [{
        "type": "object",
        "properties": {"name": {"const": f["name"]},
                       "arguments": f.get("parameters") or {"type": "object"}},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    } for f in functions]
    return options[0] if len(options) == 1 else {"anyOf": options}


def tool_call_grammar(compiler: GrammarCompiler, tools, tool_choice,
                      call_format: ToolCallFormat = HERMES) -> Grammar | None:
    """The grammar of exactly one call block (``call_format``) for ``tool_choice``
    "required" or a named function; None for "auto" and "none" (no constraint). The JSON
    inside is written as ``json.dumps`` writes it (``", "`` and ``": "``), the format the
    chat template shows the model."""
    schema = call_schema(tools, tool_choice)
    if schema is None:
        return None
    xgr = require_xgrammar()
    try:
        body = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
    except (RuntimeError, ValueError) as error:
        raise ValueError(f"cannot compile the tools' parameters schema: {error}") from error
    grammar = xgr.Grammar.concat(_literal(xgr, call_format.start), body,
                                 _literal(xgr, call_format.end))
    return compiler.grammar(grammar)


def _literal(xgr, text: str):
    """A grammar of exactly ``text``."""
    return xgr.Grammar.from_ebnf(f"root ::= {json.dumps(text)}")


def new_call_id() -> str:
    """An OpenAI-style call id, ``call_`` and 24 hex digits."""
    return "call_" + uuid.uuid4().hex[:24]


class ToolCallParser:
    """Splits generated text, fed piece by piece, into content and tool calls.

    ``feed(text)`` returns the content that can be shown now (text before or between call
    blocks; a tail that may begin a block is held back) and the calls completed by this
    piece, as OpenAI ``tool_calls`` entries; ``finish()`` returns what is left at the end (an
    unfinished block is content). A block whose JSON is not a call stays in the content.
    ``make_id``: the ids given to calls.
    """

    def __init__(self, call_format: ToolCallFormat = HERMES,
                 make_id: Callable[[], str] = new_call_id) -> None:
        self.format = call_format
        self.make_id = make_id
        self.calls: list[dict] = []  # every call so far, in order
        self._buffer = ""
        self._inside = False

    def feed(self, text: str) -> tuple[str, list[dict]]:
        start, end = self.format.start.strip(), self.format.end.strip()
        self._buffer += text
        content, calls = [], []
        while True:
            if not self._inside:
                at = self._buffer.find(start)
                if at < 0:
                    keep = _partial_suffix(self._buffer, start)
                    content.append(self._buffer[: len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    break
                content.append(self._buffer[:at])
                self._buffer, self._inside = self._buffer[at + len(start):], True
            else:
                at = self._buffer.find(end)
                if at < 0:
                    break
                body, self._buffer = self._buffer[:at], self._buffer[at + len(end):]
                self._inside = False
                call = self._call(body)
                if call is None:
                    content.append(start + body + end)
                else:
                    calls.append(call)
        self.calls.extend(calls)
        return "".join(content), calls

    def finish(self) -> str:
        """The text held back at the end: a partial start tag, or an unfinished block."""
        rest = (self.format.start.strip() if self._inside else "") + self._buffer
        self._buffer, self._inside = "", False
        return rest

    def _call(self, body: str) -> dict | None:
        try:
            value = json.loads(body)
        except json.JSONDecodeError:
            logger.debug("a tool call block that is not JSON: %r", body[:200])
            return None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        arguments = value.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        return {"id": self.make_id(), "type": "function",
                "function": {"name": value["name"], "arguments": arguments}}


def parse_tool_calls(text: str, call_format: ToolCallFormat = HERMES,
                     make_id: Callable[[], str] = new_call_id) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of a whole generated text: the content is the text outside the
    call blocks, stripped (None when nothing is left but calls, as OpenAI gives it)."""
    parser = ToolCallParser(call_format, make_id)
    content, calls = parser.feed(text)
    content = (content + parser.finish()).strip()
    return (content or (None if calls else "")), calls


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag`` (held back in case the
    next piece completes the tag)."""
    for length in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0

