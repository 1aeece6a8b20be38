"""What an OpenAI client switching to this server relies on: JSON-only bodies (415), CORS
only where asked for, OpenAI's error codes, ``logprobs``, penalties and ``logit_bias``, and
``n`` choices; spoken to with the official ``openai`` client where it can say it."""

from __future__ import annotations

import httpx
import openai
import pytest
from test_server import ServerThread
from tiny import SERVER_CONTEXT as CONTEXT
from tiny import server_llama, server_tokenizer

from lookahead.cli import main as cli_main
from lookahead.server.app import ServerSettings, create_app
from lookahead.server.engine import Engine, EngineConfig

MODEL = "tiny-llama"
ORIGIN = "https://app.example"


GOOD = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0}


# ----------------------------------------------------------------------------- safe defaults


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x",
                                          "application/json; charset=latin-1"])
def test_a_body_not_declared_json_is_415(served, content_type) -> None:
    """A web page can post these to a loopback server without a CORS preflight."""
    headers = {} if content_type is None else {"Content-Type": content_type}
    response = httpx.post(served[0].url + "/v1/completions", timeout=30, headers=headers,
                          content=b'{"model": "tiny-llama", "prompt": "w5", "max_tokens": 2}')
    assert response.status_code == 415, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported_media_type" and "application/json" in error["message"]


def test_json_with_or_without_charset_is_served(served) -> None:
    for content_type in ("application/json", "Application/JSON; charset=UTF-8"):
        response = httpx.post(served[0].url + "/v1/chat/completions", timeout=30,
                              headers={"Content-Type": content_type},
                              content=b'{"model": "tiny-llama", "max_tokens": 2, '
                                      b'"messages": [{"role": "user", "content": "w5"}]}')
        assert response.status_code == 200, response.text


def _preflight(url: str, origin: str) -> httpx.Response:
    return httpx.options(url + "/v1/chat/completions", timeout=30, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})


def test_no_cors_headers_without_the_flag(served) -> None:
    url = served[0].url
    assert "access-control-allow-origin" not in _preflight(url, ORIGIN).headers
    answer = httpx.post(url + "/v1/completions", json=GOOD, headers={"Origin": ORIGIN},
                        timeout=30)
    assert answer.status_code == 200
    assert not any(name.startswith("access-control-") for name in answer.headers)


def test_cors_headers_for_the_origins_given() -> None:
    model, tokenizer = server_llama(), server_tokenizer()
    engine = Engine(model, tokenizer, EngineConfig(warm_up=False)).start()
    settings = ServerSettings(MODEL, "autoregressive", api_keys=("k1",), cors_origins=(ORIGIN,))
    with ServerThread(create_app(engine, settings)) as server:
        allowed = _preflight(server.url, ORIGIN)  # a preflight carries no key: not a 401
        other = _preflight(server.url, "https://evil.example")
        answer = httpx.post(server.url + "/v1/completions", json=GOOD, timeout=30,
                            headers={"Origin": ORIGIN, "Authorization": "Bearer k1"})
        refused = httpx.post(server.url + "/v1/completions", json=GOOD, timeout=30,
                             headers={"Origin": ORIGIN})
    engine.stop()
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == ORIGIN
    assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
    assert "access-control-allow-origin" not in other.headers
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == ORIGIN
    # the page can read why it was refused
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == ORIGIN


@pytest.mark.parametrize("value", ["app.example", "https://app.example/", "https://a/b", ","])
def test_cors_origins_flag_refuses_what_is_not_an_origin(value, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main.main(["serve", "--model", "unused", "--cors-origins", value])
    assert exit_.value.code == 2
    assert "--cors-origins" in capsys.readouterr().err


@pytest.mark.parametrize("change, param, code", [
    ({"prompt": [5] * CONTEXT}, "prompt", "context_length_exceeded"),
    ({"prompt": [5] * 500, "max_tokens": 13}, "max_tokens", "context_length_exceeded"),
    ({"model": None}, "model", "missing_required_parameter"),
    ({"max_tokens": "16"}, "max_tokens", "invalid_type"),
    ({"max_tokens": 0}, "max_tokens", "integer_below_min_value"),
    ({"temperature": 2.5}, "temperature", "decimal_above_max_value"),
    ({"n": 200}, "n", "integer_above_max_value"),
    ({"echo": True}, "echo", "unsupported_parameter"),
    ({"best_of": 4}, "best_of", "unsupported_value"),
    ({"logit_bias": {"w5": 3}}, "logit_bias", "invalid_value"),
])
def test_openai_error_codes(client, change, param, code) -> None:
    body = {**GOOD, **change}
    body = {key: value for key, value in body.items() if value is not None}
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(**body) if "model" in body else client.post(
            "/completions", body=body, cast_to=object)
    assert info.value.code == code and info.value.param == param, info.value.body


def test_chat_context_length_exceeded_names_messages(client) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, max_tokens=2, messages=[
            {"role": "user", "content": "w5 " * CONTEXT}])
    assert info.value.code == "context_length_exceeded" and info.value.param == "messages"
    assert f"maximum context length is {CONTEXT} tokens" in info.value.message
