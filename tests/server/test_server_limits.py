"""The server exposed: body and prompt limits, per-request faults, timeouts, liveness and
metrics -- each against a real uvicorn on 127.0.0.1 (access: test_server_access.py)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from test_server import MODEL, ServerThread, expected
from tiny import prompt_ids, server_llama, server_tokenizer, wait_idle

from lookahead.server.app import ServerSettings, create_app
from lookahead.server.engine import Engine, EngineConfig

GOOD = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0}


def served(settings: ServerSettings | None = None, config: EngineConfig | None = None,
           model=None, tokenizer=None):
    """A started engine and a ``ServerThread`` (a context manager) serving it."""
    engine = Engine(model or server_llama(), tokenizer or server_tokenizer(),
                    config or EngineConfig()).start()
    return engine, ServerThread(create_app(engine, settings or ServerSettings(MODEL,
                                                                             "autoregressive")))


def health_latency(url: str) -> float:
    started = time.monotonic()
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    return time.monotonic() - started


def _status_line(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\r\n", 1)[0]


def _keep_sending(sock: socket.socket, total: int, chunked: bool, stop: threading.Event) -> None:
    piece = b"x" * (1 << 16)
    sent = 0
    try:
        while sent < total and not stop.is_set():
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            sent += len(piece)
    except OSError:  # the server closed the connection: it refused the rest
        pass


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_50_mb_body_is_refused_fast_while_health_answers(chunked) -> None:
    engine, server = served(ServerSettings(MODEL, "autoregressive", max_body_bytes=1 << 20))
    with server, socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1]))) as sock:
        length = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: 50000000"
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\n" + length + b"\r\n\r\n")
        stop = threading.Event()
        sender = threading.Thread(target=_keep_sending, args=(sock, 50_000_000, chunked, stop),
                                  daemon=True)
        started = time.monotonic()
        sender.start()
        with ThreadPoolExecutor(1) as pool:
            latencies = pool.submit(lambda: [health_latency(server.url) for _ in range(3)])
            status = _status_line(sock, timeout=30)
            refused_after = time.monotonic() - started
            stop.set()
            assert max(latencies.result()) < 1.0
        sender.join(10)
        assert status.startswith(b"HTTP/1.1 413"), status
        assert refused_after < 10, refused_after  # far less than reading 50 MB
        assert httpx.post(server.url + "/v1/completions", json=GOOD, timeout=30).status_code == 200
    engine.stop()


def test_413_is_an_openai_error() -> None:
    engine, server = served(ServerSettings(MODEL, "autoregressive", max_body_bytes=2048))
    with server:
        response = httpx.post(server.url + "/v1/completions",
                              json={**GOOD, "prompt": "w1 " * 2000}, timeout=30)
    engine.stop()
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_prompt_over_the_character_limit_is_refused_untokenized() -> None:
    class CountingTokenizer:
        def __init__(self, inner) -> None:
            self.inner, self.calls = inner, 0

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def __call__(self, *args, **kwargs):
            self.calls += 1
            return self.inner(*args, **kwargs)

    tokenizer = CountingTokenizer(server_tokenizer())
    engine, server = served(ServerSettings(MODEL, "autoregressive", max_prompt_chars=100),
                            tokenizer=tokenizer)
    with server:
        long = httpx.post(server.url + "/v1/completions", json={**GOOD, "prompt": "w1 " * 34},
                          timeout=30)
        short = httpx.post(server.url + "/v1/completions", json={**GOOD, "prompt": "w1 " * 33},
                           timeout=30)
        chat = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
            "model": MODEL, "messages": [{"role": "user", "content": "w2 " * 34}]})
    engine.stop()
    assert long.status_code == 400 and long.json()["error"]["param"] == "prompt"
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
    assert short.status_code == 200
    assert tokenizer.calls == 1  # the short one only


def test_a_stop_string_over_256_characters_is_400_naming_stop() -> None:
    engine, server = served()
    with server:
        long = httpx.post(server.url + "/v1/completions", json={**GOOD, "stop": ["a" * 257]},
                          timeout=30)
        fits = httpx.post(server.url + "/v1/completions", json={**GOOD, "stop": "a" * 256},
                          timeout=30)
    engine.stop()
    assert long.status_code == 400
    assert long.json()["error"]["param"] == "stop" and "256" in long.json()["error"]["message"]
    assert fits.status_code == 200


# ----------------------------------------------------------------------------- faults


SECRET = "secret-internal-detail-/etc/shadow"


class FaultyTokenizer:
    """Decodes as ``inner`` but raises once a request whose prompt ends with ``poison`` has
    written 3 tokens (so the fault comes in a batched step, not at prefill)."""

    def __init__(self, inner, poison: list[int]) -> None:
        self.inner, self.poison = inner, poison

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __call__(self, *args, **kwargs):
        return self.inner(*args, **kwargs)

    def decode(self, tokens, **kwargs):
        tokens = list(tokens)
        if tokens[: len(self.poison)] == self.poison and len(tokens) >= len(self.poison) + 3:
            raise RuntimeError(SECRET)
        return self.inner.decode(tokens, **kwargs)


def _good_cases(model, tokenizer):
    cases = [(prompt_ids(20 + i, 8 + i), 12) for i in range(3)]
    return cases, [expected(model, tokenizer, ids, n, "autoregressive") for ids, n in cases]


def _complete(url: str, ids, n: int) -> httpx.Response:
    body = {"model": MODEL, "prompt": ids[0].tolist(), "max_tokens": n, "temperature": 0,
            "lookahead": {"method": "autoregressive"}}
    return httpx.post(url + "/v1/completions", json=body, timeout=60)


def _check_isolated(url: str, bad_ids, cases, wanted, caplog) -> None:
    with ThreadPoolExecutor(4) as pool:
        bad = pool.submit(_complete, url, bad_ids, 30)
        good = [pool.submit(_complete, url, ids, n) for ids, n in cases]
        answers = [(r.json()["choices"][0]["text"], r.json()["usage"]["completion_tokens"])
                   for r in (f.result() for f in good)]
        bad = bad.result()
    assert answers == wanted
    assert bad.status_code == 500
    error = bad.json()["error"]
    assert SECRET not in bad.text and "RuntimeError" not in bad.text
    rid = error["message"].split("request ", 1)[1].split(";")[0]
    assert rid.startswith("cmpl-")
    logged = [r for r in caplog.records if rid in r.getMessage()]
    assert logged and any(r.exc_info and SECRET in str(r.exc_info[1]) for r in logged)


def test_a_detokenizer_fault_ends_that_request_alone(caplog) -> None:
    model, inner = server_llama(), server_tokenizer()
    bad_ids = prompt_ids(40, 9)
    tokenizer = FaultyTokenizer(inner, bad_ids[0, -4:].tolist())
    cases, wanted = _good_cases(model, inner)
    engine, server = served(model=model, tokenizer=tokenizer)
    caplog.set_level(logging.ERROR)
    with server:
        _check_isolated(server.url, bad_ids, cases, wanted, caplog)
        assert wait_idle(engine) and engine.alive
        assert _complete(server.url, *cases[0]).json()["choices"][0]["text"] == wanted[0][0]
    engine.stop()


def test_a_metrics_fault_ends_that_request_alone(caplog) -> None:
    model, tokenizer = server_llama(), server_tokenizer()
    bad_ids = prompt_ids(41, 9)
    cases, wanted = _good_cases(model, tokenizer)
    engine, server = served(model=model, tokenizer=tokenizer)
    record = engine.metrics.record_step
    poison = bad_ids[0].tolist()

    def faulty(method, stats):
        if engine._running and any(r.decoder.prompt == poison and r.decoder.stats is stats
                                   for r in engine._running):
            raise RuntimeError(SECRET)
        record(method, stats)

    engine.metrics.record_step = faulty  # this engine's own metrics object
    caplog.set_level(logging.ERROR)
    with server:
        _check_isolated(server.url, bad_ids, cases, wanted, caplog)
        assert wait_idle(engine) and engine.alive
    engine.stop()


def test_an_unexpected_error_answers_500_without_its_text(caplog) -> None:
    engine, server = served()

    def broken(*args, **kwargs):
        raise RuntimeError(SECRET)

    engine.submit = broken  # this engine object only
    caplog.set_level(logging.ERROR)
    with server:
        response = httpx.post(server.url + "/v1/completions", json=GOOD, timeout=30)
    engine.stop()
    assert response.status_code == 500
    assert SECRET not in response.text and response.json()["error"]["type"] == "server_error"
    assert any(SECRET in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


# ----------------------------------------------------------------------------- limits


def test_max_tokens_is_the_chat_default_and_the_cap() -> None:
    engine, server = served(ServerSettings(MODEL, "autoregressive", max_tokens=6))
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "w1 w2"}], "temperature": 0,
            "lookahead": {"ignore_eos": True}}
    with server:
        url = server.url + "/v1/chat/completions"
        default = httpx.post(url, json=chat, timeout=30).json()
        over = httpx.post(url, json={**chat, "max_tokens": 7}, timeout=30)
        over_new = httpx.post(url, json={**chat, "max_completion_tokens": 7}, timeout=30)
        completion = httpx.post(server.url + "/v1/completions", timeout=30,
                                json={**GOOD, "max_tokens": 7})
    engine.stop()
    assert default["usage"]["completion_tokens"] == 6
    assert default["choices"][0]["finish_reason"] == "length"
    assert over.status_code == 400 and over.json()["error"]["param"] == "max_tokens"
    assert over_new.json()["error"]["param"] == "max_completion_tokens"
    assert completion.status_code == 400 and "--max-tokens" in completion.text


def test_max_model_len_clamps_the_context() -> None:
    engine, server = served(config=EngineConfig(max_model_len=40))
    assert engine.context_length == 40
    with server:
        url = server.url + "/v1/completions"
        long = httpx.post(url, json={**GOOD, "prompt": [5] * 40}, timeout=30)
        room = httpx.post(url, json={**GOOD, "prompt": [5] * 30, "max_tokens": 11}, timeout=30)
        fits = httpx.post(url, json={**GOOD, "prompt": [5] * 30, "max_tokens": 10}, timeout=30)
    engine.stop()
    assert long.status_code == 400 and long.json()["error"]["code"] == "context_length_exceeded"
    assert room.status_code == 400 and room.json()["error"]["param"] == "max_tokens"
    assert fits.status_code == 200


def _slow(model, seconds: float):
    forward = model.forward

    def slow(*args, **kwargs):
        time.sleep(seconds)
        return forward(*args, **kwargs)

    model.forward = slow  # this model object only
    return model


def test_request_timeout_ends_that_request_only() -> None:
    model = _slow(server_llama(), 0.02)
    engine, server = served(config=EngineConfig(request_timeout=1.5), model=model)
    long = {**GOOD, "max_tokens": 400, "lookahead": {"ignore_eos": True}}
    with server, ThreadPoolExecutor(2) as pool:
        url = server.url + "/v1/completions"
        whole = pool.submit(httpx.post, url, json=long, timeout=60)
        with httpx.stream("POST", url, json={**long, "stream": True}, timeout=60) as stream:
            events = [line[6:] for line in stream.iter_lines() if line.startswith("data: ")]
        short = httpx.post(url, json=GOOD, timeout=60)
        whole = whole.result()
        assert wait_idle(engine) and engine.alive
    engine.stop()
    assert whole.status_code == 504 and whole.json()["error"]["code"] == "request_timeout"
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "request_timeout"
    assert len(events) > 3  # some text came first
    assert short.status_code == 200


def test_health_reports_a_hung_forward_then_recovers() -> None:
    model = server_llama()
    forward, release, hang = model.forward, threading.Event(), threading.Event()

    def blocking(*args, **kwargs):
        if hang.is_set():
            release.wait(30)
        return forward(*args, **kwargs)

    model.forward = blocking
    engine, server = served(ServerSettings(MODEL, "autoregressive", health_stall_s=0.3),
                            model=model)
    with server, ThreadPoolExecutor(1) as pool:
        assert httpx.get(server.url + "/health").status_code == 200
        hang.set()
        answer = pool.submit(httpx.post, server.url + "/v1/completions", json=GOOD, timeout=60)
        deadline, health = time.monotonic() + 20, None
        while time.monotonic() < deadline:
            health = httpx.get(server.url + "/health", timeout=5)
            if health.status_code == 503:
                break
            time.sleep(0.05)
        hang.clear()
        release.set()
        assert answer.result().status_code == 200
        assert wait_idle(engine)
        after = httpx.get(server.url + "/health")
    engine.stop()
    assert health.status_code == 503 and "stalled" in health.json()["status"]
    assert after.status_code == 200


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_health_reports_a_dead_engine_thread() -> None:
    model = server_llama()

    def dying(*args, **kwargs):
        raise SystemExit  # not an Exception: the engine's loop does not catch it

    model.forward = dying
    engine, server = served(model=model)
    with server:
        failed = httpx.post(server.url + "/v1/completions", json=GOOD, timeout=30)
        engine._thread.join(10)
        health = httpx.get(server.url + "/health")
    assert failed.status_code == 503 and failed.json()["error"]["code"] == "shutting_down"
    assert health.status_code == 503 and health.json()["status"] == "engine stopped"


def test_metrics_have_process_and_vllm_names_in_a_registry_per_server() -> None:
    model, tokenizer = server_llama(), server_tokenizer()
    engines = [Engine(model, tokenizer, EngineConfig(), model_name=MODEL).start()
               for _ in range(2)]
    body = {**GOOD, "prompt": prompt_ids(6, 12)[0].tolist(), "max_tokens": 20,
            "lookahead": {"method": "prompt_lookup"}}
    texts = []
    for engine, requests in zip(engines, (1, 0)):
        with ServerThread(create_app(engine, ServerSettings(MODEL, "autoregressive"))) as server:
            for _ in range(requests):
                assert httpx.post(server.url + "/v1/completions", json=body,
                                  timeout=30).status_code == 200
            texts.append(httpx.get(server.url + "/metrics").text)
        engine.stop()
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
               for line in texts[0].splitlines() if line and not line.startswith("#")}
    label = f'{{model_name="{MODEL}"}}'
    drafts = samples["vllm:spec_decode_num_drafts_total" + label]
    proposed = samples["vllm:spec_decode_num_draft_tokens_total" + label]
    accepted = samples["vllm:spec_decode_num_accepted_tokens_total" + label]
    assert drafts >= 1 and proposed >= drafts and 0 <= accepted <= proposed
    assert accepted == samples['lookahead_spec_decode_num_accepted_tokens_total'
                               '{method="prompt_lookup"}']
    per_pos = [value for key, value in samples.items()
               if key.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total{")]
    assert sum(per_pos) == accepted
    if accepted:
        assert samples[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="{MODEL}"'
                       f',position="0"}}'] >= 1
    assert samples["process_resident_memory_bytes"] > 0 and "process_cpu_seconds_total" in samples
    assert "vllm:spec_decode_num_drafts_total" + label not in texts[1]  # its own registry


def test_a_client_that_leaves_mid_body_is_no_error(caplog) -> None:
    engine, server = served()
    caplog.set_level(logging.ERROR)
    with server:
        port = int(server.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"mo")
            time.sleep(0.2)  # the server is reading the body
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not caplog.records:
            response = httpx.post(server.url + "/v1/completions", json=GOOD, timeout=30)
            if response.status_code == 200:
                break
        time.sleep(0.2)
    engine.stop()
    assert response.status_code == 200
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.records
