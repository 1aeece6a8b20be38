"""Fixtures of the server tests: the tiny model and its tokenizer (``tests/tiny.py``), and
``served`` / ``client``: that model served over HTTP (a module's own server) and an ``openai``
client of it."""

from __future__ import annotations

import openai
import pytest
from test_server import MODEL, ServerThread
from tiny import server_llama, server_tokenizer

from lookahead.server.app import ServerSettings, create_app
from lookahead.server.engine import Engine, EngineConfig


@pytest.fixture(scope="module")
def model():
    return server_llama()


@pytest.fixture(scope="module")
def tokenizer():
    return server_tokenizer()


@pytest.fixture(scope="module")
def served():
    model, tokenizer = server_llama(), server_tokenizer()
    engine = Engine(model, tokenizer, EngineConfig(step_token_budget=64)).start()
    settings = ServerSettings(MODEL, "lookahead", {"window": 4, "ngram": 3})
    with ServerThread(create_app(engine, settings)) as server:
        yield server, engine, model, tokenizer
    engine.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[0].url + "/v1", api_key="none", max_retries=0)
