"""Who may use the server: API keys, Host checks, the memory's scope per key, and the flags
that set them -- against a real uvicorn on 127.0.0.1."""

from __future__ import annotations

import json

import httpx
import pytest
from test_server import MODEL, expected
from test_server_limits import GOOD, served
from tiny import prompt_ids, server_llama, server_tokenizer

from lookahead.server.app import ServerSettings
from lookahead.server.guard import allowed_host_set

# ----------------------------------------------------------------------------- access


def test_api_key_guards_every_v1_path_but_not_health() -> None:
    engine, server = served(ServerSettings(MODEL, "autoregressive", api_keys=("k-one", "k-two")))
    with server:
        url = server.url
        none = httpx.get(url + "/v1/models")
        wrong = httpx.post(url + "/v1/completions", json=GOOD,
                           headers={"Authorization": "Bearer k-on"})
        basic = httpx.get(url + "/v1/models", headers={"Authorization": "Basic k-one"})
        chat = httpx.post(url + "/v1/chat/completions", json={})
        ok = httpx.post(url + "/v1/completions", json=GOOD, timeout=30,
                        headers={"Authorization": "Bearer k-two"})
        health = httpx.get(url + "/health")
    engine.stop()
    for refused in (none, wrong, basic, chat):
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
    assert ok.status_code == 200 and health.status_code == 200


def test_foreign_host_headers_are_refused_on_loopback() -> None:
    hosts = allowed_host_set(["my.box"])
    engine, server = served(ServerSettings(MODEL, "autoregressive", allowed_hosts=hosts))
    with server:
        port = server.url.rsplit(":", 1)[1]
        status = {host: httpx.get(server.url + "/health", headers={"Host": host}).status_code
                  for host in ("localhost", f"localhost:{port}", f"127.0.0.1:{port}",
                               "[::1]:80", "MY.BOX:1", "evil.example", f"evil.example:{port}",
                               "127.0.0.1.evil.example", "")}
        error = httpx.get(server.url + "/v1/models", headers={"Host": "evil.example"}).json()
    engine.stop()
    assert status == {"localhost": 200, f"localhost:{port}": 200, f"127.0.0.1:{port}": 200,
                      "[::1]:80": 200, "MY.BOX:1": 200, "evil.example": 400,
                      f"evil.example:{port}": 400, "127.0.0.1.evil.example": 400, "": 400}
    assert error["error"]["code"] == "invalid_host"
    assert allowed_host_set(["*"]) is None


# ----------------------------------------------------------------------------- memory


def _steps_of(url: str, key: str, ids) -> tuple[int | None, str]:
    body = {"model": MODEL, "prompt": ids[0].tolist(), "max_tokens": 30, "temperature": 0}
    reply = httpx.post(url + "/v1/completions", json=body, timeout=60,
                       headers={"Authorization": f"Bearer {key}"}).json()
    return reply.get("lookahead", {}).get("steps"), reply["choices"][0]["text"]


def test_memory_is_kept_apart_per_api_key() -> None:
    model, tokenizer = server_llama(), server_tokenizer()
    ids = prompt_ids(6, 9)
    text, count = expected(model, tokenizer, ids, 30, method="prompt_lookup")
    assert count == 30
    settings = ServerSettings(MODEL, "prompt_lookup", memory="per-key", api_keys=("ka", "kb"))
    engine, server = served(settings, model=model, tokenizer=tokenizer)
    with server:
        a1, a2, b1 = (_steps_of(server.url, key, ids) for key in ("ka", "ka", "kb"))
        health = httpx.get(server.url + "/health").json()
    engine.stop()
    assert a1[1] == a2[1] == b1[1] == text
    assert a2[0] < a1[0] / 2, (a1, a2)  # a's second answer copied from its first
    assert b1[0] == a1[0]  # b saw nothing of a's text
    assert health["memory_tokens"] == 3 * (9 + 30)


@pytest.mark.parametrize("settings", [
    ServerSettings(MODEL, "prompt_lookup", memory="shared", api_keys=("ka", "kb")),
    ServerSettings(MODEL, "prompt_lookup", memory="per-key"),  # no keys: one client
], ids=["shared", "per-key-without-keys"])
def test_a_shared_memory_reports_no_acceptance_figures(settings) -> None:
    engine, server = served(settings)
    with server:
        steps = [_steps_of(server.url, key, prompt_ids(6, 9))[0] for key in ("ka", "kb")]
    engine.stop()
    assert settings.shares_memory and steps == [None, None]


def test_recycled_predictions_are_kept_per_api_key_across_requests() -> None:
    """Each key's lookahead requests share one successor table (the model's predictions at
    that client's texts), never another key's; the texts stay the model's greedy ones."""
    model, tokenizer = server_llama(), server_tokenizer()
    ids = prompt_ids(6, 9)
    text, _ = expected(model, tokenizer, ids, 30, method="lookahead")
    settings = ServerSettings(MODEL, "lookahead", api_keys=("ka", "kb"))  # on by default
    engine, server = served(settings, model=model, tokenizer=tokenizer)
    with server:
        state = server.server.config.app.state.lookahead
        a1 = _steps_of(server.url, "ka", ids)
        rows = len(state.successors[0])
        a2 = _steps_of(server.url, "ka", prompt_ids(7, 9))
        tables = dict(state.successors)
        # sampled: reproduced by its seed, so it recycles from a table of its own
        body = {"model": MODEL, "prompt": ids[0].tolist(), "max_tokens": 20,
                "temperature": 0.9, "seed": 3}
        sampled = [httpx.post(server.url + "/v1/completions", json=body, timeout=60,
                              headers={"Authorization": "Bearer kb"}).json()
                   for _ in range(2)]
        kb_rows = len(state.successors.get(1) or ())
    engine.stop()
    assert a1[1] == text and rows > 0
    assert set(tables) == {0} and len(tables[0]) >= rows  # kb sent nothing: no table
    assert sampled[0]["choices"] == sampled[1]["choices"] and kb_rows == 0
    off = ServerSettings(MODEL, "lookahead", {"recycle": 0})
    engine, server = served(off, model=model, tokenizer=tokenizer)
    with server:
        assert _steps_of(server.url, "any", ids)[1] == text
        assert server.server.config.app.state.lookahead.successors == {}
    engine.stop()


# ----------------------------------------------------------------------------- flags


def test_serve_flags_parse_with_vllm_names(tmp_path) -> None:
    from lookahead.cli.main import build_parser
    from lookahead.cli.serve import _allowed_hosts, _api_keys

    keys = tmp_path / "keys.txt"
    keys.write_text("# the team's key\nk-file\n\n")
    args = build_parser().parse_args([
        "serve", "--max-num-seqs", "3", "--max-model-len", "100", "--max-tokens", "7",
        "--api-key", "k-flag", "--api-key-file", str(keys), "--allowed-host", "box:9"])
    assert (args.max_batch_size, args.max_model_len, args.max_tokens) == (3, 100, 7)
    assert _api_keys(args) == ("k-flag", "k-file")
    assert _allowed_hosts("127.0.0.1", args.allowed_host) == {"localhost", "127.0.0.1", "[::1]",
                                                              "box"}
    assert _allowed_hosts("::1", []) is not None
    assert _allowed_hosts("0.0.0.0", []) is None  # not loopback and nothing named: any Host
    assert _allowed_hosts("0.0.0.0", ["box"]) == {"localhost", "127.0.0.1", "[::1]", "box"}


@pytest.mark.parametrize("content, says", [(None, "cannot read"), ("# none\n\n", "holds no key"),
                                           ("two words\n", "printable ASCII")])
def test_a_bad_api_key_file_is_an_error_naming_it(tmp_path, capsys, content, says) -> None:
    from lookahead.cli.main import main

    path = tmp_path / "keys.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as info:
        main(["serve", "--model", "/no/such/model", "--api-key-file", str(path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--api-key" in err and says in err


def test_loadtest_sends_the_api_key(tmp_path) -> None:
    import lookahead.cli.main

    engine, server = served(ServerSettings(MODEL, "autoregressive", api_keys=("k-load",)))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "w10 w11 w10 w11", "chat": False}) + "\n")
    argv = ["loadtest", "--concurrency", "1", "--requests", "1", "--max-tokens", "3",
            "--warmup", "0", "--methods", "autoregressive", "--dataset", str(prompts)]
    with server:
        argv += ["--url", server.url, "--out", str(tmp_path / "out")]
        code = lookahead.cli.main.main([*argv, "--api-key", "k-load"])
        with pytest.raises(SystemExit):  # refused: "not an OpenAI-compatible server"
            lookahead.cli.main.main(argv)
    engine.stop()
    assert code == 0
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    assert report["cells"][0]["completed"] == 1
