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
def client():
    try:
        model, tokenizer = lookahead.load_model(MODEL)
    except ModelNotAvailableError as error:  # the test command installs it
        pytest.skip(str(error))
    assert model.config._attn_implementation == "lookahead_invariant"
    engine = Engine(model, tokenizer, EngineConfig(warm_up=False)).start()
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
