"""The HTTP server end to end: a real uvicorn on 127.0.0.1 serving a tiny float64 model,
spoken to with the official ``openai`` client (and ``httpx`` where a client must misbehave)."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import uvicorn
from tiny import SERVER_CONTEXT as CONTEXT
from tiny import prompt_ids, server_llama, server_tokenizer, wait_idle

import lookahead
from lookahead.cli import main as cli_main
from lookahead.bench.datasets import load_prompts
from lookahead.server.app import ServerSettings, create_app
from lookahead.detokenize import Detokenizer
from lookahead.server.engine import Engine, EngineConfig

MODEL = "tiny-llama"


class ServerThread:
    """uvicorn serving ``app`` on a free port of 127.0.0.1, in a daemon thread."""

    def __init__(self, app) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True
        )

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.server.started
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def expected(model, tokenizer, ids, max_tokens, method="lookahead", **options):
    """Text and token count of ``lookahead.generate`` alone, as the server would write them."""
    if method == "lookahead" and not options:
        options = {"window": 4, "ngram": 3}
    tokens = lookahead.generate(model, ids, max_tokens, method, **options).new_tokens[0].tolist()
    return Detokenizer(tokenizer, ids[0].tolist()).push(tokens, final=True), len(tokens)


def test_models_health_and_metrics(served, client) -> None:
    server = served[0]
    assert [m.id for m in client.models.list().data] == [MODEL]
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok"
    assert health["packed_weights"] == "plain"  # float64: nothing to pack
    metrics = httpx.get(server.url + "/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "lookahead_time_to_first_token_seconds" in metrics.text
    assert "process_resident_memory_bytes" in metrics.text


def test_completion_greedy_with_usage(served, client) -> None:
    _, _, model, tokenizer = served
    ids = prompt_ids(1, 12)
    text, count = expected(model, tokenizer, ids, 20)
    reply = client.completions.create(model=MODEL, prompt=ids[0].tolist(), max_tokens=20,
                                      temperature=0)
    assert reply.choices[0].text == text
    assert reply.usage.prompt_tokens == 12 and reply.usage.completion_tokens == count
    assert reply.usage.total_tokens == 12 + count
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_chat_streamed_equals_not_streamed(served, client) -> None:
    messages = [{"role": "system", "content": "w1 w2"}, {"role": "user", "content": "w3 w4 w3 w4"}]
    kwargs = {"model": MODEL, "messages": messages, "max_tokens": 25, "temperature": 0,
              "extra_body": {"lookahead": {"method": "prompt_lookup"}}}
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True,
                                                 stream_options={"include_usage": True}, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == [whole.choices[0].finish_reason]


def test_sixteen_concurrent_streams_each_equal_generate_alone(served, client) -> None:
    _, engine, model, tokenizer = served
    methods = ["lookahead", "autoregressive", "prompt_lookup", "lookahead"]
    cases = [(prompt_ids(10 + i, 5 + 3 * i), 10 + 2 * i, methods[i % 4]) for i in range(16)]
    wanted = [expected(model, tokenizer, ids, n, method) for ids, n, method in cases]

    def stream(case):
        ids, n, method = case
        chunks = client.completions.create(
            model=MODEL, prompt=ids[0].tolist(), max_tokens=n, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"lookahead": {"method": method}},
        )
        text, used = "", None
        for chunk in chunks:
            if chunk.choices:
                text += chunk.choices[0].text
            if chunk.usage:
                used = chunk.usage.completion_tokens
        return text, used

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(stream, cases))
    assert got == wanted
    assert wait_idle(engine)


def _cancelled(engine) -> float:
    return engine.metrics.requests.value("cancelled", "cancelled")


@pytest.fixture
def slow_steps(served, monkeypatch):
    """Each forward pass takes 10 ms more, so a 400-token request outlives a slow hang-up."""
    model = served[2]
    forward = model.forward

    def slow(*args, **kwargs):
        time.sleep(0.01)
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", slow)


@pytest.mark.usefixtures("slow_steps")
def test_client_that_hangs_up_mid_stream_is_cancelled(served) -> None:
    server, engine, *_ = served
    before = _cancelled(engine)
    body = {"model": MODEL, "prompt": prompt_ids(3, 6)[0].tolist(), "max_tokens": 400,
            "temperature": 0, "stream": True,
            "lookahead": {"method": "autoregressive", "ignore_eos": True}}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["choices"][0]["text"]
    # Leaving the block closed the connection mid-stream.
    assert wait_idle(engine)
    assert _cancelled(engine) == before + 1
    assert engine._cache.cache is None


@pytest.mark.usefixtures("slow_steps")
def test_client_that_gives_up_on_a_whole_answer_is_cancelled(served) -> None:
    server, engine, *_ = served
    before = _cancelled(engine)
    body = {"model": MODEL, "prompt": prompt_ids(4, 6)[0].tolist(), "max_tokens": 400,
            "temperature": 0, "lookahead": {"method": "autoregressive", "ignore_eos": True}}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=0.1)
    assert wait_idle(engine)
    assert _cancelled(engine) == before + 1


@pytest.mark.parametrize(
    "change, param",
    [
        ({"prompt": None}, "prompt"),
        ({"model": None}, "model"),
        ({"temperature": 3.0}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"n": 129}, "n"),
        ({"logprobs": 21}, "logprobs"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"10000": 1}}, "logit_bias"),
        ({"echo": True}, "echo"),
        ({"best_of": 3}, "best_of"),
        ({"lookahead": {"method": "nope"}}, "lookahead.method"),
        ({"lookahead": {"window": 0}}, "lookahead.window"),
        ({"lookahead": {"method": "prompt_lookup", "window": 3}}, "lookahead"),
        ({"lookahead": {"method": "draft"}}, "lookahead.method"),
        ({"lookahead": {"temperature": 1}}, "lookahead.temperature"),
        ({"lookahead": {"memory": True}}, "lookahead.memory"),
        ({"lookahead": {"workload": "code"}}, "lookahead.workload"),
        ({"prompt": [5] * (CONTEXT + 1)}, "prompt"),
        ({"max_tokens": CONTEXT}, "max_tokens"),
        ({"prompt": [10_000]}, "prompt"),
    ],
)
def test_bad_requests_are_400_naming_the_field(served, change, param) -> None:
    server = served[0]
    body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0}
    for key, value in change.items():
        if value is None:
            body.pop(key)
        else:
            body[key] = value
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error
    assert error["message"]


@pytest.mark.parametrize(
    "change, param",
    [
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
         "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"function_call": "auto"}, "function_call"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ],
)
def test_chat_fields_the_engine_cannot_honour_are_400(served, change, param) -> None:
    """A client that asks for a format or a tool call that cannot be honoured (an unknown
    format, a schema missing, tools on a chat template that does not render them, a required
    call without tools, the legacy functions) must not get free text it cannot parse;
    top_logprobs needs logprobs, and at most 20."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "w1"}], "max_tokens": 4,
            "temperature": 0, **change}
    response = httpx.post(served[0].url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    assert param in error["message"]


def test_chat_accepts_the_defaults_of_those_fields(served, client) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "w1"}], max_tokens=4, temperature=0,
        response_format={"type": "text"}, tool_choice="none", logprobs=False)
    assert reply.usage.completion_tokens >= 1


def test_server_keeps_answering_after_faults(served, client) -> None:
    server = served[0]
    assert httpx.post(server.url + "/v1/completions", content=b"{not json",
                      headers={"content-type": "application/json"}).status_code == 400
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="w1", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=2)
    assert info.value.body["param"] == "messages"
    reply = client.completions.create(model=MODEL, prompt="w5 w6 w7", max_tokens=3, temperature=0)
    assert reply.usage.completion_tokens >= 1
    assert httpx.get(server.url + "/health").status_code == 200


def test_stop_strings_and_sampling_options(served, client) -> None:
    _, _, model, tokenizer = served
    ids = prompt_ids(6, 10)
    full, _ = expected(model, tokenizer, ids, 30)
    stop = " ".join(full.split()[2:4])
    reply = client.completions.create(model=MODEL, prompt=ids[0].tolist(), max_tokens=30,
                                      temperature=0, stop=[stop])
    assert reply.choices[0].text == full[: full.index(stop)]
    assert reply.choices[0].finish_reason == "stop"
    sampled = [client.completions.create(model=MODEL, prompt=ids[0].tolist(), max_tokens=15,
                                         temperature=0.9, top_p=0.9, seed=7).choices[0].text
               for _ in range(2)]
    assert sampled[0] == sampled[1]


def test_full_queue_answers_429() -> None:
    model, tokenizer = server_llama(), server_tokenizer()
    engine = Engine(model, tokenizer, EngineConfig(max_queue=1))  # never started: nothing drains
    app = create_app(engine, ServerSettings(MODEL, "autoregressive"))
    body = {"model": MODEL, "prompt": [5, 6], "max_tokens": 4, "temperature": 0, "stream": True}
    with (
        ServerThread(app) as server,
        httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as first,
    ):
        assert first.status_code == 200  # accepted, waiting in the queue
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.RateLimitError) as info:
            client.completions.create(model=MODEL, prompt=[5, 6], max_tokens=4)
        assert info.value.status_code == 429
        assert "max_queue=1" in info.value.body["message"]


def _steps(server, method: str) -> float:
    """The server's ``lookahead_spec_decode_steps_total`` for ``method`` (0 before any)."""
    line = f'lookahead_spec_decode_steps_total{{method="{method}"}} '
    found = [row for row in httpx.get(server.url + "/metrics").text.splitlines()
             if row.startswith(line)]
    return float(found[0].removeprefix(line)) if found else 0.0


def test_a_server_with_memory_copies_an_earlier_answer() -> None:
    model, tokenizer = server_llama(), server_tokenizer()
    engine = Engine(model, tokenizer, EngineConfig()).start()
    settings = ServerSettings(MODEL, "prompt_lookup", {"memory": lookahead.TextMemory()})
    ids = prompt_ids(6, 9)
    text, count = expected(model, tokenizer, ids, 30, method="prompt_lookup")
    assert count == 30  # no EOS early: enough answer to copy
    body = {"model": MODEL, "prompt": ids[0].tolist(), "max_tokens": 30, "temperature": 0}
    steps = []
    with ServerThread(create_app(engine, settings)) as server:
        for _ in range(2):
            before = _steps(server, "prompt_lookup")
            reply = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
            assert reply["choices"][0]["text"] == text
            steps.append(_steps(server, "prompt_lookup") - before)
        health = httpx.get(server.url + "/health").json()
    engine.stop()
    assert health["memory_tokens"] == 2 * (9 + 30)  # both texts: prompt and answer
    assert steps[1] < steps[0] / 2, steps  # the second answer was copied from the first


def test_a_server_with_a_datastore_copies_from_it_and_keeps_it_server_side() -> None:
    model, tokenizer = server_llama(), server_tokenizer()
    engine = Engine(model, tokenizer, EngineConfig()).start()
    ids = prompt_ids(6, 9)
    text, count = expected(model, tokenizer, ids, 30, method="prompt_lookup")
    answer = lookahead.generate(model, ids, 30, "autoregressive").sequences[0].tolist()
    store = lookahead.Datastore(answer + [0] + answer)  # holds the whole answer
    body = {"model": MODEL, "prompt": ids[0].tolist(), "max_tokens": 30, "temperature": 0}
    steps, health = {}, {}
    for name, options in (("without", {}), ("with", {"datastore": store})):
        settings = ServerSettings(MODEL, "prompt_lookup", options)
        with ServerThread(create_app(engine, settings)) as server:
            before = _steps(server, "prompt_lookup")
            reply = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
            assert reply["choices"][0]["text"] == text
            steps[name] = _steps(server, "prompt_lookup") - before
            health[name] = httpx.get(server.url + "/health").json()
            asked = {**body, "lookahead": {"datastore": "stdlib"}}
            refused = httpx.post(server.url + "/v1/completions", json=asked, timeout=60)
    engine.stop()
    assert count == 30 and steps["with"] < steps["without"] / 2, steps
    assert health["with"]["datastore_tokens"] == len(store)
    assert "datastore_tokens" not in health["without"]
    assert refused.status_code == 400 and "set by the server" in refused.text


def test_loadtest_alternates_methods_and_pools_repeats(served, tmp_path, monkeypatch) -> None:
    server, engine = served[0], served[1]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"w{i} w{i + 1} w{i} w{i + 1}", "chat": False})
                               + "\n" for i in range(10, 13)))
    submitted = []
    submit = engine.submit

    def recording_submit(decoder, **kwargs):
        submitted.append(kwargs.get("method") or decoder.stats.method)
        return submit(decoder, **kwargs)

    monkeypatch.setattr(engine, "submit", recording_submit)  # this test's engine object only
    out = tmp_path / "out"
    code = cli_main.main(["loadtest", "--url", server.url, "--concurrency", "1,2",
                               "--requests", "3", "--repeat", "3", "--max-tokens", "5",
                               "--warmup", "0", "--dataset", str(prompts), "--out", str(out)])
    assert code == 0
    la, ar = "lookahead", "autoregressive"
    per_row = [la] * 3 + [ar] * 3 + [ar] * 3 + [la] * 3 + [la] * 3 + [ar] * 3  # A B, B A, A B
    assert submitted == per_row * 2
    report = json.loads((out / "results.json").read_text())
    assert [(c["method"], c["concurrency"]) for c in report["cells"]] == [
        (la, 1), (ar, 1), (la, 2), (ar, 2)]
    for cell in report["cells"]:
        assert (cell["requests"], cell["completed"], cell["repeats"], cell["errors"]) == (9, 9, 3, 0)
        assert 9 <= cell["tokens"] <= 45 and cell["throughput"] > 0
        assert cell["ttft_p50"] <= cell["latency_p50"]
        outcomes = cell["outcomes"]  # every request, with its prompt and repeat
        assert sorted(o["repeat"] for o in outcomes) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
        assert {o["prompt"] for o in outcomes} == {p.id for p in load_prompts(str(prompts))}
        assert sum(o["tokens"] for o in outcomes) == cell["tokens"]
        assert all(o["ttft"] <= o["latency"] for o in outcomes)
    assert all((out / name).stat().st_size > 0 for name in ("throughput.png", "ttft.png",
                                                             "latency.png"))


def test_loadtest_without_a_server_is_an_error_naming_url(served, tmp_path, capsys) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    try:
        for url, says in [(dead, "no server answers"),
                          (served[0].url + "/elsewhere", "not an OpenAI-compatible server")]:
            with pytest.raises(SystemExit) as exit_:
                cli_main.main(["loadtest", "--url", url, "--requests", "1",
                                    "--out", str(tmp_path)])
            assert exit_.value.code == 2
            error = capsys.readouterr().err
            assert "argument --url" in error and says in error and url in error
    finally:
        closed.close()
    assert not (tmp_path / "results.json").exists()
