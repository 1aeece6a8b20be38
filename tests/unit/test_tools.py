"""lookahead.tools: rendering tools, forcing a call with a grammar, parsing calls."""

from __future__ import annotations

import itertools
import json
import re

import pytest
import torch
from tiny import smollm2_llama, smollm2_tokenizer

import lookahead
from lookahead.tools import (
    ToolCallParser,
    call_schema,
    check_tool_choice,
    parse_tool_calls,
    render_prompt,
    tool_call_grammar,
)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"enum": ["Paris", "Tokyo", "Lima"]},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
ALARM = {"type": "function", "function": {
    "name": "set_alarm",
    "parameters": {"type": "object", "properties": {
        "hour": {"enum": [6, 7, 8]}, "loud": {"type": "boolean"}},
        "required": ["hour", "loud"], "additionalProperties": False}}}
TOOLS = [WEATHER, ALARM]
# A Hermes-style template with tools (SmolLM2's own template has none).
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}"
    "</tools><|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
)


def numbered():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def test_parse_a_call_with_content_before_it():
    text = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris", "unit": "celsius"}}\n</tool_call>')
    content, calls = parse_tool_calls(text, make_id=numbered())
    assert content == "Let me look."
    assert calls == [{"id": "call_0", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]


def test_parse_several_calls_and_plain_text():
    text = ('<tool_call>\n{"name": "set_alarm", "arguments": {"hour": 7, "loud": true}}\n'
            '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": '
            '\\"Lima\\"}"}\n</tool_call>')
    content, calls = parse_tool_calls(text)
    assert content is None
    assert [c["function"]["name"] for c in calls] == ["set_alarm", "get_weather"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"hour": 7, "loud": True}
    assert calls[1]["function"]["arguments"] == '{"city": "Lima"}'  # a string stays as given
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", c["id"]) for c in calls)
    assert calls[0]["id"] != calls[1]["id"]
    assert parse_tool_calls("No tools needed: 4.") == ("No tools needed: 4.", [])


def test_broken_or_unfinished_blocks_stay_content():
    broken = "<tool_call>\n{not json}\n</tool_call> ok"
    assert parse_tool_calls(broken) == (broken, [])
    unfinished = 'Sure <tool_call>\n{"name": "get_weather", "argu'
    assert parse_tool_calls(unfinished) == (unfinished, [])
    assert parse_tool_calls('<tool_call>\n["a list"]\n</tool_call>')[1] == []


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_streaming_gives_what_the_whole_text_gives(size):
    """Fed in pieces of ``size`` characters, the content shown never includes a piece of a
    tag, and content and calls add up to the whole text's."""
    text = ('I will check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo",'
            ' "unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": "set_alarm", '
            '"arguments": {"hour": 6, "loud": false}}\n</tool_call> Done <tool')
    parser = ToolCallParser(make_id=numbered())
    shown, calls = "", []
    for at in range(0, len(text), size):
        content, new = parser.feed(text[at : at + size])
        assert "<" not in content and "tool_call" not in content
        shown += content
        calls += new
    shown += parser.finish()
    expected_content, expected_calls = parse_tool_calls(text, make_id=numbered())
    assert shown.strip() == expected_content
    assert calls == expected_calls == parser.calls
    assert [c["function"]["name"] for c in calls] == ["get_weather", "set_alarm"]


def test_tool_choice_is_checked_by_name():
    assert check_tool_choice(None, TOOLS) == "auto"
    assert check_tool_choice(None, None) == "none"
    assert check_tool_choice("required", TOOLS) == "required"
    assert check_tool_choice({"type": "function", "function": {"name": "set_alarm"}},
                             TOOLS) == "set_alarm"
    for bad, word in [("always", "tool_choice must be one of"),
                      ({"type": "function", "function": {"name": "nope"}}, "not in tools"),
                      ("required", "needs tools")]:
        with pytest.raises(ValueError, match=word):
            check_tool_choice(bad, TOOLS if word != "needs tools" else None)
    with pytest.raises(ValueError, match=r"tools\[0\]"):
        call_schema([{"type": "function"}], "required")
    assert call_schema(TOOLS, "auto") is None and call_schema(TOOLS, "none") is None
    assert len(call_schema(TOOLS, "required")["anyOf"]) == 2


def test_render_prompt_puts_the_tools_in_the_template():
    tokenizer = smollm2_tokenizer()
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    text = render_prompt(tokenizer, messages, TOOLS, "auto", chat_template=TOOL_TEMPLATE)
    assert '"name": "get_weather"' in text and '"name": "set_alarm"' in text
    assert text.rstrip().endswith("<|im_start|>assistant")
    with pytest.raises(ValueError, match="does not render tools"):
        render_prompt(tokenizer, messages, TOOLS)  # SmolLM2's own template has no tools
    assert "<tools>" not in render_prompt(tokenizer, messages, None,
                                          chat_template=TOOL_TEMPLATE)


@pytest.fixture(scope="module")
def tiny():
    """SmolLM2's tokenizer, a tiny model over its vocabulary and a grammar compiler."""
    pytest.importorskip("xgrammar")
    from lookahead.grammar import GrammarCompiler

    tokenizer, model = smollm2_tokenizer(), smollm2_llama()
    compiler = GrammarCompiler(tokenizer, vocab_size=model.config.vocab_size, stop_token_ids=[2])
    return tokenizer, model, compiler


@pytest.mark.parametrize(("choice", "sample"), [("get_weather", False), ("set_alarm", True),
                                                ("required", False), ("required", True)])
def test_a_forced_call_parses_and_its_arguments_validate(tiny, choice, sample):
    """A tiny random model under the call grammar writes one call block that parses into a
    call of the chosen function (any, for "required") whose arguments fit its schema."""
    jsonschema = pytest.importorskip("jsonschema")
    tokenizer, model, compiler = tiny
    tool_choice = choice if choice == "required" else {"type": "function",
                                                       "function": {"name": choice}}
    grammar = tool_call_grammar(compiler, TOOLS, tool_choice)
    prompt = render_prompt(tokenizer, [{"role": "user", "content": "Weather?"}], TOOLS,
                           tool_choice, chat_template=TOOL_TEMPLATE)
    ids = torch.tensor([tokenizer.encode(prompt)])
    options = {"do_sample": True, "seed": 3} if sample else {}
    result = lookahead.generate(model, ids, max_new_tokens=80, method="lookahead",
                                logits_processor=[grammar.processor()], **options)
    tokens = result.new_tokens[0].tolist()
    assert tokens[-1] == 2  # the call ends, then only EOS is allowed
    content, calls = parse_tool_calls(tokenizer.decode(tokens[:-1]))
    assert content is None and len(calls) == 1
    name = calls[0]["function"]["name"]
    assert name == choice or (choice == "required" and name in ("get_weather", "set_alarm"))
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[name]
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), schema)


def test_auto_and_none_leave_the_model_free(tiny):
    compiler = tiny[2]
    assert tool_call_grammar(compiler, TOOLS, "auto") is None
    assert tool_call_grammar(compiler, TOOLS, "none") is None


def test_qwen_template_calls_are_the_grammar_and_parse_back():
    """With Qwen2.5's own tokenizer and chat template: the tools are rendered, and an
    assistant turn with a call, as the template writes it, is a complete text of the forced
    call grammar and parses back into that call."""
    pytest.importorskip("xgrammar")
    from transformers import AutoTokenizer

    from lookahead.grammar import GrammarCompiler
    from lookahead.models.gguf import find_gguf
    from lookahead.models.registry import ModelNotAvailableError, get_model_spec

    try:
        path = find_gguf(get_model_spec("qwen2.5-coder-0.5b"))
    except ModelNotAvailableError:
        pytest.skip("qwen2.5-coder-0.5b is not installed (lookahead install-model)")
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    messages = [{"role": "user", "content": "Weather in Lima?"}]
    prompt = render_prompt(tokenizer, messages, TOOLS, "required")
    assert "<tools>" in prompt and '"name": "set_alarm"' in prompt
    arguments = {"city": "Lima", "unit": "fahrenheit"}
    turn = messages + [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": arguments}}]}]
    whole = tokenizer.apply_chat_template(turn, tools=TOOLS, tokenize=False)
    block = whole[len(prompt):].split("<|im_end|>")[0]
    compiler = GrammarCompiler(tokenizer, vocab_size=151936, stop_token_ids=[151645, 151643])
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        grammar = tool_call_grammar(compiler, TOOLS, choice)
        assert grammar.matches(tokenizer.encode(block, add_special_tokens=False)), block
    wrong = tool_call_grammar(compiler, TOOLS, {"type": "function",
                                                "function": {"name": "set_alarm"}})
    assert not wrong.matches(tokenizer.encode(block, add_special_tokens=False))
    content, calls = parse_tool_calls(block)
    assert content is None and [c["function"]["name"] for c in calls] == ["get_weather"]
    assert json.loads(calls[0]["function"]["arguments"]) == arguments
