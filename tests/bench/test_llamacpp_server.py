"""llama.cpp's modes through ``llama-server`` (``lookahead.bench.llamacpp_server``).

Without llama.cpp: the command of each mode, a ``/completion`` response written by hand
after llama.cpp's tools/server/README.md (``tests/fixtures/llama-server-completion.json``),
and a fake ``llama-server`` (a Python script serving ``/health`` and ``/completion`` with
made-up answers and times) that the engines start, time and stop, alone and in a whole
``lookahead bench`` run. With a real ``llama-server`` on PATH, its greedy tokens are checked
against HF's on a tiny float32 GGUF (skipped where there is none).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType
from tiny import bench_argv
from tiny_gguf import write_tiny_gguf
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

from lookahead.bench import llamacpp
from lookahead.bench import llamacpp_server as server
from lookahead.bench.runner import BenchConfig
from lookahead.cli.main import main

FIXTURES = Path(__file__).parent.parent / "fixtures"
NEW_FLAGS = {"--no-webui", "--cache-ram", "--spec-draft-n-max", "--spec-type"}

# A stand-in for llama-server: --help lists NEW_FLAGS; it logs its argv and each request to
# <spec-type>.jsonl beside itself; /health answers 503 twice (loading) then 200; /completion
# answers the prompt's ids over again, in times that make ngram-mod the fastest mode.
FAKE = """#!{python}
import http.server, json, os, pathlib, sys
argv = sys.argv[1:]
if "--help" in argv:
    print("-m,    --model FNAME\\n--port PORT\\n--no-webui\\n-cram, --cache-ram N\\n"
          "--spec-draft-n-max N\\n--spec-type TYPES")
    sys.exit(0)
mode = argv[argv.index("--spec-type") + 1] if "--spec-type" in argv else "none"
if mode == {fail!r}:
    print("error: failed to load model " + argv[argv.index("-m") + 1], file=sys.stderr)
    sys.exit(1)
log = pathlib.Path(__file__).parent / (mode + ".jsonl")
def note(item):
    with open(log, "a") as handle:
        handle.write(json.dumps(item) + "\\n")
note({{"argv": argv, "pid": os.getpid()}})
polls = []
class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        polls.append(1)
        if len(polls) < 3 or {never_ready!r}:
            return self.answer(503, {{"error": {{"code": 503, "message": "Loading model"}}}})
        self.answer(200, {{"status": "ok"}})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        note({{"request": body}})
        prompt, n = body["prompt"], body["n_predict"]
        tokens = [prompt[i % len(prompt)] for i in range(n)]
        accepted = {{"none": 0, "ngram-mod": n // 2, "draft-simple": n // 4}}[mode]
        ms = {{"none": 40.0, "ngram-mod": 10.0, "draft-simple": 20.0}}[mode]
        self.answer(200, {{"content": " ".join(map(str, tokens)),
                          "tokens": tokens if body.get("return_tokens") else [],
                          "stop_type": "limit",
                          "timings": {{"cache_n": 0, "prompt_n": len(prompt), "prompt_ms": 5.0,
                                      "predicted_n": n, "predicted_ms": ms,
                                      "draft_n": n, "draft_n_accepted": accepted}}}})
http.server.HTTPServer(("127.0.0.1", int(argv[argv.index("--port") + 1])),
                       Handler).serve_forever()
"""


def write_fake_server(folder: Path, fail: str = "", never_ready: bool = False) -> Path:
    """The fake ``llama-server`` in ``folder`` (``fail``: the --spec-type it refuses to
    start with, "none" for the plain mode; ``never_ready``: /health never says ok)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "llama-server"
    path.write_text(FAKE.format(python=sys.executable, fail=fail, never_ready=never_ready))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def logged(folder: Path, mode: str) -> list[dict]:
    return [json.loads(line) for line in (folder / f"{mode}.jsonl").read_text().splitlines()]


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie no one reaped yet has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "\nState:\tZ" in status.read_text()


# ----------------------------------------------------------------------------- no process


def test_server_command_of_each_mode(tmp_path) -> None:
    binary, gguf, draft = Path("/b/llama-server"), tmp_path / "m.gguf", tmp_path / "d.gguf"
    plain = server.server_command(binary, gguf, "llamacpp_server", 8123, 3, NEW_FLAGS)
    flags = dict(zip(plain[1::2], plain[2::2], strict=False))
    assert plain[0] == "/b/llama-server" and flags["-m"] == str(gguf)
    assert flags["--port"] == "8123" and flags["--host"] == "127.0.0.1"
    assert flags["-t"] == flags["-tb"] == "3" and flags["-np"] == "1"
    assert flags["-c"] == str(server.CONTEXT)
    assert "--no-webui" in plain and plain[plain.index("--cache-ram") + 1] == "0"
    assert "--spec-type" not in plain and "-md" not in plain

    ngram = server.server_command(binary, gguf, "llamacpp_ngram", 8123, 3, NEW_FLAGS)
    assert ngram[-2:] == ["--spec-type", "ngram-mod"]  # llama.cpp's own n-gram defaults

    drafting = server.server_command(binary, gguf, "llamacpp_draft", 8123, 3, NEW_FLAGS,
                                     draft, 4)
    assert drafting[-6:] == ["--spec-type", "draft-simple", "-md", str(draft),
                             "--spec-draft-n-max", "4"]


def test_server_command_follows_what_the_build_lists(tmp_path) -> None:
    binary, gguf, draft = Path("llama-server"), tmp_path / "m.gguf", tmp_path / "d.gguf"
    older = server.server_command(binary, gguf, "llamacpp_draft", 1, 2, {"--draft-max"},
                                  draft, 5)
    assert older[-2:] == ["--draft-max", "5"]
    assert "--no-webui" not in older and "--cache-ram" not in older
    unknown = server.server_command(binary, gguf, "llamacpp_draft", 1, 2, set(), draft, 5)
    assert unknown[-2:] == ["-md", str(draft)]  # no count flag: llama.cpp's default
    exact = server.server_command(binary, gguf, "llamacpp_server", 1, 2, set(), f32_cache=True)
    assert exact[-4:] == ["-ctk", "f32", "-ctv", "f32"]
    with pytest.raises(ValueError, match="--draft-model"):
        server.server_command(binary, gguf, "llamacpp_draft", 1, 2, NEW_FLAGS)
    with pytest.raises(ValueError, match="method must be one of"):
        server.server_command(binary, gguf, "llamacpp", 1, 2, NEW_FLAGS)


def test_parse_completion_reads_a_recorded_response() -> None:
    response = json.loads((FIXTURES / "llama-server-completion.json").read_text())
    reply = server.parse_completion(response)
    assert reply.tokens[:3] == [1558, 902, 30] and len(reply.tokens) == 14
    assert reply.content.startswith("def add(a, b):")
    assert (reply.prompt_ms, reply.predicted_ms) == (61.214, 98.532)
    assert reply.seconds == pytest.approx((61.214 + 98.532) / 1000)
    assert (reply.prompt_tokens, reply.cached_tokens, reply.predicted) == (39, 0, 14)
    assert (reply.draft_tokens, reply.draft_accepted, reply.stop_type) == (9, 6, "eos")


def test_parse_completion_refuses_errors_and_missing_timings() -> None:
    with pytest.raises(ValueError, match="error"):
        server.parse_completion({"error": {"code": 400, "message": "bad prompt"}})
    with pytest.raises(ValueError, match="no timings"):
        server.parse_completion({"content": "x", "tokens": []})
    plain = server.parse_completion({"content": "x", "stop_type": "limit", "timings": {
        "prompt_n": 3, "prompt_ms": 1.0, "predicted_n": 2, "predicted_ms": 2.0}})
    assert (plain.draft_tokens, plain.draft_accepted, plain.tokens) == (0, 0, [])


def test_answer_tokens_from_the_ids_else_from_the_text() -> None:
    class Words:
        def __call__(self, text, add_special_tokens):
            return {"input_ids": [len(word) for word in text.split()]}

    engine = server.ServerEngine(None, Words(), [99])
    response = json.loads((FIXTURES / "llama-server-completion.json").read_text())
    reply = server.parse_completion(response)
    assert engine.answer_tokens(reply, 32) == reply.tokens
    assert engine.answer_tokens(reply, 5) == reply.tokens[:5]
    response["tokens"] = []  # a server without return_tokens: the text, encoded
    textual = server.parse_completion(response)
    # "def add(a, b):\n    return a + b\n" -> word lengths, then the end it stopped at
    assert engine.answer_tokens(textual, 32) == [3, 6, 3, 6, 1, 1, 1, 99]
    assert engine.answer_tokens(textual, 3) == [3, 6, 3]  # cut at the limit, no end added


def test_completion_request_is_greedy_and_uncached() -> None:
    body = server.completion_request([1, 2, 3], 16)
    assert body["prompt"] == [1, 2, 3] and body["n_predict"] == 16
    assert body["temperature"] == 0 and body["top_k"] == 1
    assert body["cache_prompt"] is False and body["return_tokens"] is True


def test_find_server_in_a_folder_beside_a_binary_or_on_path(tmp_path, monkeypatch) -> None:
    binary = write_fake_server(tmp_path / "bin")
    (tmp_path / "bin" / "llama-completion").write_text("")
    assert server.find_server(str(binary)) == binary
    assert server.find_server(str(tmp_path / "bin")) == binary
    assert server.find_server(str(tmp_path / "bin" / "llama-completion")) == binary
    with pytest.raises(FileNotFoundError, match="--llamacpp-bin"):
        server.find_server(str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert server.find_server(None) == binary
    monkeypatch.setenv("PATH", str(tmp_path))
    assert server.find_server(None) is None
    with pytest.raises(ValueError, match="llama-server"):
        server.start_engines(("llamacpp_ngram",), None, tmp_path / "m.gguf", None, [])


# ----------------------------------------------------------------------------- a fake server


def test_fake_server_started_measured_and_stopped(tmp_path) -> None:
    folder = tmp_path / "bin"
    write_fake_server(folder)
    assert server.server_flags(folder / "llama-server") >= NEW_FLAGS
    engines = server.start_engines(("hf", "llamacpp_server", "llamacpp_ngram"), str(folder),
                                   tmp_path / "m.gguf", None, [2], threads=3)
    try:
        assert set(engines) == {"llamacpp_server", "llamacpp_ngram"}
        measured = engines["llamacpp_ngram"].measure(torch.tensor([[5, 6, 7]]), 8)
    finally:
        server.close_engines(engines)
    assert measured.tokens == [5, 6, 7, 5, 6, 7, 5, 6]  # the fake's answer, as sent
    assert measured.seconds == pytest.approx((5.0 + 10.0) / 1000)
    assert measured.time_to_first_token == pytest.approx(5.0 / 1000)
    assert measured.steps == 8 - 4  # tokens made less the draft tokens accepted
    started, request = logged(folder, "ngram-mod")
    assert request["request"] == server.completion_request([5, 6, 7], 8)
    assert started["argv"][started["argv"].index("-t") + 1] == "3"
    assert gone(started["pid"]) and gone(logged(folder, "none")[0]["pid"])


def test_a_server_that_fails_to_start_stops_those_started(tmp_path) -> None:
    folder = tmp_path / "bin"
    write_fake_server(folder, fail="draft-simple")
    with pytest.raises(RuntimeError, match=r"(?s)exited.*failed to load model .*m\.gguf"):
        server.start_engines(("llamacpp_server", "llamacpp_draft"), str(folder),
                             tmp_path / "m.gguf", None, [], tmp_path / "d.gguf", 4)
    assert gone(logged(folder, "none")[0]["pid"])  # the plain one, started first


def test_a_server_never_ready_is_given_up_and_stopped(tmp_path) -> None:
    binary = write_fake_server(tmp_path, never_ready=True)
    port = server.free_port()
    command = server.server_command(binary, tmp_path / "m.gguf", "llamacpp_server", port, 1,
                                    set())
    with pytest.raises(RuntimeError, match="not ready"), \
            server.LlamaServer(command, port, start_timeout=1.5):
        pass
    assert gone(logged(tmp_path, "none")[0]["pid"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_benchmark_takes_its_server_with_it(tmp_path) -> None:
    folder = tmp_path / "bin"
    write_fake_server(folder)
    script = (f"import os, signal\nfrom lookahead.bench import llamacpp_server as s\n"
              f"s.start_engines(('llamacpp_server',), {str(folder)!r}, None, None, [], "
              f"threads=1)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", script], env=env, check=False, timeout=120)
    assert done.returncode == -signal.SIGKILL
    pid = logged(folder, "none")[0]["pid"]
    deadline = time.monotonic() + 30  # the signal's delivery, not a speed
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    orphaned = not gone(pid)
    if orphaned:  # leave nothing running, then fail
        os.kill(pid, signal.SIGKILL)
    assert not orphaned


def test_bench_runs_the_server_modes_and_names_llamacpps_best(tiny, tmp_path, capsys,
                                                              monkeypatch) -> None:
    folder = tmp_path / "bin"
    write_fake_server(folder)
    monkeypatch.setattr(llamacpp, "gguf_of",
                        lambda model, cache_dir, option="--model": tmp_path / "m.gguf")
    argv = bench_argv(tiny, "--methods", "hf,llamacpp_server,llamacpp_ngram,llamacpp_draft",
                      "--llamacpp-bin", str(folder), "--baseline-dtypes", "none",
                      "--draft-tokens", "3", "--out", str(tmp_path / "out"), "--no-plots")
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| vs llama.cpp best (llamacpp_ngram) |" in printed
    assert "llama.cpp best: llamacpp_ngram" in printed
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    methods = {r["method"] for r in results["runs"]}
    assert methods == {"hf", "llamacpp_server", "llamacpp_ngram", "llamacpp_draft"}
    for mode in ("none", "ngram-mod", "draft-simple"):
        started, *requests = logged(folder, mode)
        assert gone(started["pid"]), mode  # every server stopped at the end
        assert len(requests) == 3  # the warm-up and two prompts
    drafting = logged(folder, "draft-simple")[0]["argv"]
    assert drafting[drafting.index("--spec-draft-n-max") + 1] == "3"


def test_server_methods_run_only_when_named_and_drafting_needs_a_draft() -> None:
    assert not set(server.MODES) & set(BenchConfig().run_methods)
    with pytest.raises(ValueError, match="llamacpp_draft.*--draft-model"):
        BenchConfig(methods=("hf", "llamacpp_draft"))
    assert BenchConfig(methods=("llamacpp_ngram", "llamacpp_server")).run_methods == (
        "hf", "llamacpp_server", "llamacpp_ngram")


# ----------------------------------------------------------------------------- the real one


def test_llama_server_greedy_equals_hf_greedy_on_a_float32_gguf(tmp_path) -> None:
    binary = server.find_server(None)
    if binary is None:
        pytest.skip("no llama-server on PATH")
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", "llama",
                           (GGMLQuantizationType.F32,), hidden=64, seed=3)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, gguf_file=gguf.name)
    ids = tokenizer("in the tree the hat the heat", return_tensors="pt").input_ids
    model = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=gguf.name, dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True)).eval()
    model.generation_config.eos_token_id = None
    want = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0,
                          attention_mask=torch.ones_like(ids))[0, ids.shape[1]:].tolist()
    engine = server.start_engine("llamacpp_server", binary, gguf, tokenizer, [], 1,
                                 f32_cache=True)
    try:
        measured = engine.measure(ids, 12)
    finally:
        engine.close()
    assert measured.tokens == want and measured.steps == 12
    assert 0 < measured.time_to_first_token <= measured.seconds
