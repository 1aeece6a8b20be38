"""The server on the real bundled model, as a user starts it: SmolLM2-135M from its GGUF file,
quantized, on the row-invariant attention. A greedy answer does not depend on the requests
served beside it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from test_server import ServerThread

import lookahead
from lookahead.bench.datasets import load_prompts
from lookahead.models.registry import ModelNotAvailableError
from lookahead.server.app import ServerSettings, create_app
from lookahead.server.engine import Engine, EngineConfig

MODEL = "smollm2-135m"

# One intra-op thread: on a busy machine two threads wait for each other at every operation.
pytestmark = pytest.mark.usefixtures("one_thread")



@pytest.fixture(scope="module")
def bundled():
    try:
        model, tokenizer = lookahead.load_model(MODEL)
    except ModelNotAvailableError as error:  # the test command installs it
        pytest.skip(str(error))
    assert model.config._attn_implementation == "lookahead_invariant"
    return model, tokenizer


@pytest.fixture(scope="module")
def client(bundled):
    engine = Engine(*bundled, EngineConfig(warm_up=False)).start()
    with ServerThread(create_app(engine, ServerSettings(MODEL, "lookahead", {}))) as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    engine.stop()


def test_greedy_text_alone_equals_greedy_text_among_eight(client) -> None:
    """8 chat requests (code and general questions, lookahead and autoregressive), each sent
    alone, then all 8 at once: the same texts, token for token."""
    questions = [p.text for name in ("humaneval", "mtbench") for p in load_prompts(name, limit=4)]
    methods = ["lookahead", "autoregressive"]

    def ask(index: int) -> str:
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": questions[index]}],
            max_tokens=40, temperature=0,
            extra_body={"lookahead": {"method": methods[index % 2]}})
        return reply.choices[0].message.content

    alone = [ask(i) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, range(8)))
    assert all(alone) and together == alone


def _converse(url: str, conversations: list[list[str]]) -> list[str]:
    """The conversations played turn by turn, interleaved, each turn sending the whole
    conversation so far (as every chat client does); every answer, in the order asked."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    histories: list[list[dict]] = [[] for _ in conversations]
    answers = []
    for turn in range(max(map(len, conversations))):
        for questions, history in zip(conversations, histories):
            history.append({"role": "user", "content": questions[turn]})
            reply = client.chat.completions.create(model=MODEL, messages=history, max_tokens=24,
                                                   temperature=0)
            history.append({"role": "assistant", "content": reply.choices[0].message.content})
            answers.append(reply.choices[0].message.content)
    return answers


def test_conversations_read_the_same_with_the_prefix_cache_on_and_off(bundled) -> None:
    """Two 5-turn chats that open with the same question, turn by turn: each turn reuses the
    KV entries of the last (or of the other chat's first turn), with a budget that holds one
    chat and not two, so that entries are evicted on the way; every answer is the answer of a
    server that prefills every prompt whole."""
    questions = [p.text for p in load_prompts("mtbench", limit=9)]
    chats = [questions[:5], questions[:1] + questions[5:9]]
    model, tokenizer = bundled
    answers, hits = {}, {}
    for budget in (0, 12 << 20):
        engine = Engine(model, tokenizer, EngineConfig(warm_up=False,
                                                       prefix_cache_bytes=budget)).start()
        app = create_app(engine, ServerSettings(MODEL, "lookahead", {}))
        with ServerThread(app) as server:
            answers[budget] = _converse(server.url, chats)
        hits[budget] = engine.metrics.prefix_hits.value(MODEL)
        engine.stop()
    assert all(answers[0]) and answers[12 << 20] == answers[0]
    assert hits[0] == 0 and hits[12 << 20] > 0
