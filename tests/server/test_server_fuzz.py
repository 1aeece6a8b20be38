"""Malformed requests against a real server: each is a 4xx with an OpenAI error naming the
field at fault, never a 500, and the server serves a good request afterwards."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_server import MODEL, ServerThread
from tiny import server_llama, server_tokenizer

from lookahead.server.app import ServerSettings, create_app
from lookahead.server.engine import Engine, EngineConfig

BASE = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "w1"}], "max_tokens": 2,
        "temperature": 0}
SURROGATE = "\ud800"


@pytest.fixture(scope="module")
def url():
    engine = Engine(server_llama(), server_tokenizer(), EngineConfig()).start()
    app = create_app(engine, ServerSettings(MODEL, "autoregressive", max_tokens=64,
                                            max_prompt_chars=4000))
    with ServerThread(app) as server:
        yield server.url
    engine.stop()


def _raw(members: str) -> bytes:
    """A completion body with JSON text ``members`` after model and prompt, as written."""
    return ('{"model": "' + MODEL + '", "prompt": "w1", ' + members + "}").encode()


def _json(body: dict) -> bytes:
    return json.dumps(body).encode()  # ensure_ascii: a lone surrogate goes as \ud800


def _with(base: dict, **change) -> bytes:
    return _json({**base, **change})


C, H = "/v1/completions", "/v1/chat/completions"
# (path, body, status, param): param None where no one field is at fault.
MALFORMED = [
    (C, b"null", 400, None),
    (C, b"[]", 400, None),
    (C, b"[1, 2]", 400, None),
    (C, b'"text"', 400, None),
    (C, b"3", 400, None),
    (C, b"", 400, None),
    (C, b"{", 400, None),
    (C, b"\xff\xfe{}", 400, None),
    (C, b"[" * 100_000 + b"]" * 100_000, 400, None),
    (C, b"{}", 400, "model"),
    (C, _with(BASE, prompt=SURROGATE), 400, "prompt"),
    (C, _with(BASE, prompt="w1 " + SURROGATE), 400, "prompt"),
    (C, _with(BASE, model=SURROGATE), 400, "model"),
    (C, _with(BASE, stop=["ok", SURROGATE]), 400, "stop[1]"),
    (C, _raw('"\\udc00": 1'), 400, None),
    (C, _with(BASE, max_tokens="16"), 400, "max_tokens"),
    (C, _with(BASE, max_tokens=16.0), 400, "max_tokens"),
    (C, _with(BASE, max_tokens=True), 400, "max_tokens"),
    (C, _with(BASE, max_tokens=-1), 400, "max_tokens"),
    (C, _with(BASE, max_tokens=10**30), 400, "max_tokens"),
    (C, _with(BASE, stream="yes"), 400, "stream"),
    (C, _with(BASE, stream=1), 400, "stream"),
    (C, _with(BASE, stream_options={"include_usage": True}), 400, "stream_options"),
    (C, _with(BASE, stream=True, stream_options={"include_usage": "yes"}), 400,
     "stream_options.include_usage"),
    (C, _with(BASE, temperature="0"), 400, "temperature"),
    (C, _raw('"temperature": NaN'), 400,
     "temperature"),
    (C, _raw('"temperature": Infinity'), 400,
     "temperature"),
    (C, _with(BASE, temperature=-1), 400, "temperature"),
    (C, _with(BASE, top_p=2), 400, "top_p"),
    (C, _with(BASE, top_k=-1), 400, "top_k"),
    (C, _with(BASE, top_k=1.5), 400, "top_k"),
    (C, _with(BASE, seed=-1), 400, "seed"),
    (C, _with(BASE, seed="1"), 400, "seed"),
    (C, _with(BASE, seed=2**64), 400, "seed"),
    (C, _with(BASE, n=0), 400, "n"),
    (C, _with(BASE, n="1"), 400, "n"),
    (C, _with(BASE, stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    (C, _with(BASE, stop="x" * 300), 400, "stop"),
    (C, _with(BASE, stop=5), 400, "stop"),
    (C, _with(BASE, stop=[1]), 400, "stop"),
    (C, _with(BASE, prompt=5), 400, "prompt"),
    (C, _with(BASE, prompt=[]), 400, "prompt"),
    (C, _with(BASE, prompt=[[1, 2]]), 400, "prompt"),
    (C, _with(BASE, prompt=["w1", "w2"]), 400, "prompt"),
    (C, _with(BASE, prompt=[-1]), 400, "prompt"),
    (C, _with(BASE, prompt=[1.5]), 400, "prompt"),
    (C, _with(BASE, prompt=[True]), 400, "prompt"),
    (C, _with(BASE, prompt="w1 " * 2000), 400, "prompt"),
    (C, _with(BASE, model=5), 400, "model"),
    (C, _with(BASE, model="other"), 404, "model"),
    (C, _with(BASE, lookahead="x"), 400, "lookahead"),
    (C, _with(BASE, lookahead={"method": 5}), 400, "lookahead.method"),
    (C, _with(BASE, lookahead={"ignore_eos": "yes"}), 400, "lookahead.ignore_eos"),
    (C, _with(BASE, lookahead={"method": "lookahead", "window": "4"}), 400, "lookahead.window"),
    (C, _with(BASE, logit_bias={"1": 500}), 400, "logit_bias"),
    (C, _with(BASE, presence_penalty=3), 400, "presence_penalty"),
    (C, _with(BASE, echo=True), 400, "echo"),
    (C, _with(BASE, logprobs=-1), 400, "logprobs"),
    (C, _with(BASE, suffix="x"), 400, "suffix"),
    (C, _with(BASE, best_of=2), 400, "best_of"),
    (H, b"null", 400, None),
    (H, _with(CHAT, messages="hi"), 400, "messages"),
    (H, _with(CHAT, messages=None), 400, "messages"),
    (H, _with(CHAT, messages=[]), 400, "messages"),
    (H, _with(CHAT, messages=[{"role": "wizard", "content": "x"}]), 400, "messages[0].role"),
    (H, _with(CHAT, messages=[{"content": "x"}]), 400, "messages[0].role"),
    (H, _with(CHAT, messages=[{"role": "user", "content": 5}]), 400, "messages[0].content"),
    (H, _with(CHAT, messages=[{"role": "user", "content": SURROGATE}]), 400,
     "messages[0].content"),
    (H, _with(CHAT, messages=[{"role": "user", "content": [{"type": "image_url"}]}]), 400,
     "messages[0].content"),
    (H, _with(CHAT, messages=[{"role": "user", "content": "w1 " * 2000}]), 400, "messages"),
    (H, _with(CHAT, max_completion_tokens="5"), 400, "max_completion_tokens"),
    (H, _with(CHAT, max_completion_tokens=100), 400, "max_completion_tokens"),
    (H, _with(CHAT, response_format="json"), 400, "response_format"),
    (H, _with(CHAT, stream="true"), 400, "stream"),
]


@pytest.mark.parametrize("path, body, status, param", MALFORMED,
                         ids=[f"{i}" for i in range(len(MALFORMED))])
def test_malformed_request_is_a_4xx_naming_the_field(url, path, body, status, param) -> None:
    response = httpx.post(url + path, content=body, timeout=30,
                          headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param, error
    if param is None and body in (b"null", b"[]", b"[1, 2]", b'"text"', b"3"):
        assert "must be a JSON object" in error["message"]
    assert "Traceback" not in error["message"]


# Any JSON value, in any field: never a 500.
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats()
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                  max_size=4),
    max_leaves=12,
)
FIELDS = ["model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "stream",
          "stream_options", "stop", "seed", "lookahead", "messages", "logit_bias", "echo",
          "logprobs", "top_logprobs", "presence_penalty", "repetition_penalty"]


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chat=st.booleans(), field=st.sampled_from(FIELDS), value=JSON_VALUES)
def test_any_value_in_any_field_is_never_a_500(url, chat, field, value) -> None:
    body = {**(CHAT if chat else BASE), field: value}
    text = json.dumps(body, allow_nan=True).encode()
    response = httpx.post(url + (H if chat else C), content=text, timeout=60,
                          headers={"Content-Type": "application/json"})
    assert response.status_code == 200 or 400 <= response.status_code < 500, response.text
    if response.status_code != 200:
        assert response.json()["error"]["message"]


def test_the_server_serves_a_good_request_after_all_that(url) -> None:
    for path, body in ((C, BASE), (H, CHAT)):
        response = httpx.post(url + path, json=body, timeout=30)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] >= 1
    assert httpx.get(url + "/health").json()["status"] == "ok"
