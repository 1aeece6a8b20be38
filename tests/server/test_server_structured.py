"""Structured output and tool calls through the official client, on the bundled SmolLM2 served
quantized: JSON schemas are always met, greedy JSON is the same whatever the method, and a
tool call goes out as ``tool_calls`` and comes back as a ``tool`` message."""

from __future__ import annotations

import copy
import json

import openai
import pytest
from test_server import ServerThread

import lookahead
from lookahead.models.registry import ModelNotAvailableError
from lookahead.server.app import ServerSettings, create_app
from lookahead.server.engine import Engine, EngineConfig

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")
pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = "smollm2-135m"
SCHEMAS = [
    {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]}},
     "required": ["name", "age", "role"], "additionalProperties": False},
    {"type": "object", "properties": {
        "city": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 10},
            "country": {"enum": ["France", "Japan", "Peru"]}},
            "required": ["name", "country"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"enum": ["big", "old", "coastal"]},
                 "maxItems": 3}},
     "required": ["city", "tags"], "additionalProperties": False},
    {"type": "object", "properties": {
        "steps": {"type": "array", "items": {"type": "object", "properties": {
            "n": {"type": "integer", "minimum": 1, "maximum": 9},
            "done": {"type": "boolean"}}, "required": ["n", "done"],
            "additionalProperties": False}, "minItems": 1, "maxItems": 3}},
     "required": ["steps"], "additionalProperties": False},
    {"type": "object", "properties": {
        "answer": {"enum": ["yes", "no", "maybe"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
     "required": ["answer", "confidence"], "additionalProperties": False},
]
QUESTIONS = ["Describe a user of a web site.", "Tell me about a city.",
             "Plan three steps to bake bread.", "Will it rain tomorrow?"]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"enum": ["Paris", "Tokyo", "Lima"]},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
# A Hermes-style template that renders tools, calls and tool answers (SmolLM2's own has none).
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}"
    "</tools><|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m.get('tool_calls') %}{% for c in m['tool_calls'] %}<tool_call>\n"
    "{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}"
    "\n</tool_call>{% endfor %}{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def client():
    try:
        model, tokenizer = lookahead.load_model(MODEL)
    except ModelNotAvailableError as error:  # the test command installs it
        pytest.skip(str(error))
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = TOOL_TEMPLATE
    engine = Engine(model, tokenizer, EngineConfig(warm_up=False)).start()
    with ServerThread(create_app(engine, ServerSettings(MODEL, "lookahead", {}))) as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    engine.stop()


def _json_answer(client, index: int, method: str, sample: bool) -> str:
    fmt = {"type": "json_schema", "json_schema": {"name": f"s{index}", "schema": SCHEMAS[index],
                                                  "strict": True}}
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTIONS[index]}], max_tokens=120,
        temperature=0.8 if sample else 0, seed=index if sample else None, response_format=fmt,
        extra_body={"lookahead": {"method": method}})
    assert reply.choices[0].finish_reason == "stop"
    return reply.choices[0].message.content


def test_twenty_schema_answers_validate_and_greedy_is_the_same_for_every_method(client):
    """4 schemas (nested objects, enums, arrays), each greedy with three methods and sampled
    with two: 20 answers, every one valid JSON of its schema."""
    for index, schema in enumerate(SCHEMAS):
        greedy = {m: _json_answer(client, index, m, False)
                  for m in ("lookahead", "prompt_lookup", "autoregressive")}
        sampled = [_json_answer(client, index, m, True) for m in ("lookahead", "prompt_lookup")]
        for text in [*greedy.values(), *sampled]:
            jsonschema.validate(json.loads(text), schema)
        assert len(set(greedy.values())) == 1, greedy


def test_json_mode_gives_an_object_and_bad_formats_are_named(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "A JSON object about a cat."}],
        max_tokens=80, temperature=0, response_format={"type": "json_object"})
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    else:  # the object was not closed within max_tokens: still a prefix of one
        assert reply.choices[0].message.content.startswith("{")
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "n"}})
    assert error.value.body["param"] == "response_format"


def test_a_tool_call_round_trip(client):
    """A required call comes back as tool_calls (streamed too) whose arguments fit the
    function's schema; the call and the tool's answer sent back give a plain answer."""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER],
                                           tool_choice="required", max_tokens=60, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments),
                        WEATHER["function"]["parameters"])
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], tool_choice="required",
        max_tokens=60, temperature=0, stream=True))
    streamed = [c for chunk in chunks for ch in chunk.choices for c in ch.delta.tool_calls or ()]
    assert [c.function.arguments for c in streamed] == [call.function.arguments]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}]
    answer = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER],
                                            tool_choice="none", max_tokens=24, temperature=0)
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER],
                                       tool_choice={"type": "function",
                                                    "function": {"name": "nope"}})
    assert error.value.body["param"] == "tool_choice"
