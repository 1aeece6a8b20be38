"""Tests of ``lookahead generate`` (and the options every subcommand shares) on a tiny model.

The model is a random-weight 2-layer Llama saved, with a word-level tokenizer and a chat
template, to a temporary folder, then run through ``lookahead.cli.main.main([...])`` in float64 so
that every method must print exactly the text of ``model.generate``'s greedy output.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from tiny import CHAT_WORDS, save_tiny_chat_model, word_tokenizer
from tokenizers import Tokenizer, decoders, pre_tokenizers
from tokenizers import models as tokenizer_models
from transformers import PreTrainedTokenizerFast

import lookahead
from lookahead.argtypes import UsageError
from lookahead.bench.methods import _our_options
from lookahead.cli.bench import config_from_args
from lookahead.cli.main import build_parser, main
from lookahead.cli.options import method_options
from lookahead.detokenize import Detokenizer
from lookahead.kernels.packing import cpu_packing_problem
from lookahead.models.load import chat_prompt

PROMPT = "def fast model return the same output for one token"


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    return save_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat-llama"))


@pytest.fixture(scope="module")
def tiny(tiny_folder):
    """The saved model and tokenizer loaded here, as the CLI loads them (float64)."""
    return lookahead.load_model(tiny_folder, dtype="float64")


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def check_completion(tiny, input_ids: torch.Tensor, max_new_tokens: int, out: str) -> None:
    """``out`` is ``model.generate``'s greedy continuation: the prompt's text followed by
    ``out`` (less the final newline) is the text of prompt and greedy output together."""
    model, tokenizer = tiny
    output = model.generate(input_ids, max_new_tokens=max_new_tokens, do_sample=False)
    assert output.shape[1] == input_ids.shape[1] + max_new_tokens
    prompt_text = tokenizer.decode(input_ids[0], skip_special_tokens=True)
    full_text = tokenizer.decode(output[0], skip_special_tokens=True)
    assert out.endswith("\n") and len(out) > 1
    assert prompt_text + out[:-1] == full_text


# ----------------------------------------------------------------------------- generate


@pytest.mark.parametrize(
    "method_args",
    [
        ["--method", "autoregressive"],
        [],  # lookahead, the default
        ["--method", "lookahead", "--window", "3", "--ngram", "3", "--guess", "2"],
        ["--method", "lookahead", "--lookup-tokens", "2", "--lookup-max-tokens", "16"],
        ["--method", "prompt_lookup", "--num-draft-tokens", "4", "--max-ngram", "2"],
        ["--method", "draft", "--draft-model", "SELF", "--num-draft-tokens", "3"],
    ],
    ids=["autoregressive", "lookahead", "lookahead-shape", "lookahead-copy", "prompt_lookup",
         "draft"],
)
def test_generate_prints_the_greedy_completion(tiny_folder, tiny, capsys, method_args) -> None:
    method_args = [str(tiny_folder) if a == "SELF" else a for a in method_args]
    argv = ["generate", "--model", str(tiny_folder), "--dtype", "float64", *method_args]
    code, out, _ = run_cli([*argv, "--max-new-tokens", "30", PROMPT], capsys)
    assert code == 0
    check_completion(tiny, tiny[1](PROMPT, return_tensors="pt")["input_ids"], 30, out)


def test_generate_chat_wraps_the_prompt_in_the_template(tiny_folder, tiny, capsys) -> None:
    argv = ["generate", "--model", str(tiny_folder), "--dtype", "float64", "--chat"]
    code, out, _ = run_cli([*argv, "--max-new-tokens", "12", "hello world"], capsys)
    assert code == 0
    check_completion(tiny, chat_prompt(tiny[1], "hello world"), 12, out)


def test_generate_stats_json_on_stderr(tiny_folder, capsys) -> None:
    argv = ["generate", "--model", str(tiny_folder), "--dtype", "float64", "--stats"]
    code, out, err = run_cli([*argv, "--max-new-tokens", "20", PROMPT], capsys)
    assert code == 0
    assert out.strip()
    stats = json.loads(err.strip().splitlines()[-1])
    assert stats["method"] == "lookahead"
    assert stats["prompt_tokens"] == len(PROMPT.split())
    assert stats["new_tokens"] == 20
    assert 1 <= stats["steps"] <= 20
    assert stats["tokens_per_step"] == pytest.approx(20 / stats["steps"])
    assert stats["tokens_per_second"] > 0
    assert len(stats["accepted_per_step"]) == stats["steps"]
    for name in ("seconds", "time_to_first_token", "mean_accepted", "mean_forward_tokens"):
        assert name in stats


def test_generate_without_stats_leaves_stderr_free_of_json(tiny_folder, capsys) -> None:
    argv = ["generate", "--model", str(tiny_folder), "--dtype", "float64"]
    code, _, err = run_cli([*argv, "--max-new-tokens", "5", PROMPT], capsys)
    assert code == 0
    assert "tokens_per_step" not in err


def test_generate_reads_the_prompt_from_stdin(tiny_folder, capsys, monkeypatch) -> None:
    argv = ["generate", "--model", str(tiny_folder), "--dtype", "float64", "--max-new-tokens", "9"]
    code, expected, _ = run_cli([*argv, PROMPT], capsys)
    monkeypatch.setattr(sys, "stdin", io.StringIO(PROMPT + "\n"))
    code_stdin, out, _ = run_cli([*argv, "-"], capsys)
    assert code == code_stdin == 0
    assert out == expected and out.strip()


def test_generate_sampling_with_a_seed_repeats(tiny_folder, capsys) -> None:
    argv = ["generate", "--model", str(tiny_folder), "--dtype", "float64", "--max-new-tokens", "16"]
    sample = ["--sample", "--temperature", "1.5", "--top-k", "20", "--top-p", "0.95"]
    outs = [run_cli([*argv, *sample, "--seed", str(s), PROMPT], capsys)[1] for s in (7, 7, 8)]
    assert outs[0] == outs[1]
    assert outs[0].strip() and outs[2].strip()


@pytest.mark.parametrize(
    "extra, option",
    [
        (["--method", "nope"], "--method"),
        (["--window", "0"], "--window"),
        (["--window", "x"], "--window"),
        (["--ngram", "1"], "--ngram"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--dtype", "int8"], "--dtype"),
        (["--method", "prompt_lookup", "--window", "5"], "--window"),
        (["--method", "autoregressive", "--num-draft-tokens", "3"], "--num-draft-tokens"),
        (["--method", "draft"], "--draft-model"),
        (["--lookup-tokens", "65"], "--lookup-tokens"),
        (["--lookup-tokens", "0"], "--lookup-tokens"),  # lookahead copies at least 1 token
        (["--method", "prompt_lookup", "--lookup-max-tokens", "16"], "--lookup-max-tokens"),
        (["--max-draft-tokens", "16"], "--max-draft-tokens"),  # lookahead's is --lookup-max-tokens
        (["--method", "lookahead", "--draft-model", "x"], "--draft-model"),
        (["--temperature", "0.7"], "--temperature"),
        (["--sample", "--temperature", "0"], "--temperature"),
        (["--sample", "--top-p", "1.5"], "--top-p"),
        (["--sample", "--top-k", "-1"], "--top-k"),
        (["--max-new-tokens", "100000"], "--max-new-tokens"),  # beyond the model's context
        (["--packed-weights"], "--packed-weights"),  # float64 weights cannot be packed
    ],
)
def test_bad_options_are_argparse_errors_naming_the_option(
    tiny_folder, capsys, extra, option
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["generate", "--model", str(tiny_folder), "--dtype", "float64", *extra, PROMPT])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: lookahead generate" in err
    assert f"argument {option}" in err


@pytest.mark.parametrize("argv", [["generate", "--model", "m", PROMPT], ["chat", "--model", "m"],
                                  ["demo"], ["serve"], ["bench"], ["tune"]])
def test_every_command_loads_the_dtype_this_cpu_prefers_unless_told(monkeypatch, argv) -> None:
    monkeypatch.setattr(lookahead.models.registry, "preferred_dtype", lambda: torch.float64)
    parser = build_parser()
    # "auto" is kept for load_model: a GGUF model loads quantized, another in the CPU's dtype.
    dtype = parser.parse_args(argv).dtype
    assert dtype == "auto"
    assert lookahead.models.registry.resolve_dtype(dtype) == torch.float64
    assert parser.parse_args([*argv, "--dtype", "bf16"]).dtype == "bfloat16"


@pytest.mark.skipif(cpu_packing_problem() is not None, reason="this CPU cannot pack bf16")
def test_generate_on_packed_weights_prints_what_plain_weights_print(tiny_folder, capsys) -> None:
    argv = ["generate", "--model", str(tiny_folder), "--dtype", "bfloat16", "--max-new-tokens",
            "24", PROMPT]
    code, plain, _ = run_cli([*argv, "--no-packed-weights"], capsys)
    code_packed, packed, _ = run_cli([*argv, "--packed-weights"], capsys)
    code_default, default, _ = run_cli(argv, capsys)
    assert code == code_packed == code_default == 0
    assert plain.strip() and packed == plain == default


def test_generate_packs_float32_only_when_asked_and_prints_the_same(tiny_folder, capsys,
                                                                    monkeypatch) -> None:
    packed_models = []
    pack = lookahead.kernels.packing.pack_weights
    monkeypatch.setattr(lookahead.kernels.packing, "pack_weights",
                        lambda model, *kernel: packed_models.append(model) or pack(model, *kernel))
    argv = ["generate", "--model", str(tiny_folder), "--dtype", "float32", "--max-new-tokens",
            "24", PROMPT]
    code_default, default, _ = run_cli(argv, capsys)
    assert packed_models == []  # float32 sums would change: not by default
    code_packed, packed, _ = run_cli([*argv, "--packed-weights"], capsys)
    assert len(packed_models) == 1 and lookahead.kernels.packing.is_packed(packed_models[0])
    assert code_default == code_packed == 0
    assert default.strip() and packed == default


def test_max_step_tokens_reaches_generate_and_bench_and_not_plain_decoding() -> None:
    generate = ["generate", "--model", "m", "--max-step-tokens", "5"]
    args = build_parser().parse_args([*generate, "x"])
    assert method_options(args)["max_step_tokens"] == 5
    args = build_parser().parse_args([*generate, "--method", "autoregressive", "x"])
    with pytest.raises(UsageError, match="--max-step-tokens"):
        method_options(args)
    args = build_parser().parse_args(["bench", "--max-step-tokens", "5", "--shape", "2x5x4"])
    options = config_from_args(args).options
    assert options.max_step_tokens == 5
    assert _our_options("lookahead", options)["max_step_tokens"] == 5
    assert "max_step_tokens" not in _our_options("autoregressive", options)


def test_copy_length_flags_reach_the_method_options() -> None:
    from lookahead.cli.main import build_parser
    from lookahead.cli.options import method_options

    argv = ["generate", "--model", "m", "--lookup-tokens", "4", "--lookup-max-tokens", "0", "hi"]
    assert method_options(build_parser().parse_args(argv)) == {
        "lookup_tokens": 4, "lookup_max_tokens": 0, "window": "auto"}
    argv = ["serve", "--method", "draft", "--draft-model", "d", "--lookup-tokens", "0"]
    assert method_options(build_parser().parse_args(argv))["lookup_tokens"] == 0
    argv = ["chat", "--model", "m", "--method", "prompt_lookup", "--max-draft-tokens", "40"]
    assert method_options(build_parser().parse_args(argv)) == {"max_draft_tokens": 40}


def test_serve_memory_needs_a_method_that_copies(tiny_folder, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "--model", str(tiny_folder), "--method", "autoregressive", "--memory"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --memory" in err and "lookahead or prompt_lookup" in err


@pytest.mark.parametrize("command", [["generate", PROMPT], ["chat"], ["serve"]])
@pytest.mark.parametrize("argv, message", [
    (["--method", "autoregressive", "--datastore", "stdlib"], "lookahead or prompt_lookup"),
    (["--method", "lookahead", "--datastore", "/no/such/corpus"], "expected 'stdlib', 'python' or a file"),
])
def test_datastore_is_checked_before_loading(capsys, monkeypatch, command, argv, message) -> None:
    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before --datastore was checked")

    monkeypatch.setattr("lookahead.cli.loading.load_model", no_loading)
    with pytest.raises(SystemExit) as info:
        main([command[0], "--model", "some-model", *argv, *command[1:]])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --datastore" in err and message in err


@pytest.mark.parametrize("method", ["lookahead", "prompt_lookup"])
def test_generate_copies_from_a_datastore_file_and_prints_the_same_text(
        tiny_folder, capsys, monkeypatch, tmp_path, method) -> None:
    """A corpus holding the answer: the same text in fewer steps."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the tokens' cache
    monkeypatch.setenv("HOME", str(tmp_path))
    argv = ["generate", "--model", str(tiny_folder), "--dtype", "float64", "--method", method,
            "--stats", "--max-new-tokens", "24", PROMPT]
    code, plain, plain_err = run_cli(argv, capsys)
    assert code == 0
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(f"{PROMPT} {plain.strip()}\n" * 2)
    code, helped, helped_err = run_cli([*argv[:-1], "--datastore", str(corpus), PROMPT], capsys)
    assert code == 0
    assert helped == plain
    steps = [json.loads(err.strip().splitlines()[-1])["steps"] for err in (plain_err, helped_err)]
    assert steps[1] < steps[0]


def test_serve_answers_then_stops_on_sigterm(tiny_folder, tiny) -> None:
    """``lookahead serve`` end to end: the engine on this (the main) thread, HTTP on another;
    SIGTERM ends it with status 0, as Ctrl+C does."""
    model, tokenizer = tiny
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    ids = tokenizer("user : hello", return_tensors="pt")["input_ids"]
    want = lookahead.generate(model, ids, 8, "autoregressive").new_tokens[0].tolist()
    got = {}

    def client() -> None:
        try:
            deadline = time.monotonic() + 60
            while "health" not in got and time.monotonic() < deadline:
                try:
                    got["health"] = json.load(urllib.request.urlopen(url + "/health"))
                except OSError:
                    time.sleep(0.05)
            body = {"model": str(tiny_folder), "prompt": ids[0].tolist(), "max_tokens": 8,
                    "temperature": 0}
            request = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                             {"Content-Type": "application/json"})
            got["answer"] = json.load(urllib.request.urlopen(request, timeout=60))
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    handler = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    argv = ["serve", "--model", str(tiny_folder), "--dtype", "float64", "--no-warmup",
            "--port", url.rsplit(":", 1)[1]]
    assert main(argv) == 0
    thread.join(10)
    assert got["health"]["status"] == "ok"
    choice = got["answer"]["choices"][0]
    assert got["answer"]["usage"]["completion_tokens"] == 8
    assert choice["text"] == Detokenizer(tokenizer, ids[0].tolist()).push(want, final=True)
    assert signal.getsignal(signal.SIGTERM) is handler  # put back


@pytest.mark.parametrize("model", ["/no/such/folder", "no-such-model"])
def test_unknown_model_is_an_error_naming_model(capsys, model) -> None:
    with pytest.raises(SystemExit) as info:
        main(["generate", "--model", model, "x"])
    assert info.value.code == 2
    assert "argument --model" in capsys.readouterr().err


def test_generate_needs_a_model_and_a_prompt(tiny_folder, capsys) -> None:
    for argv in (["generate", "x"], ["generate", "--model", str(tiny_folder)]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
    assert "--model" in capsys.readouterr().err


def test_empty_prompt_is_an_error(tiny_folder, capsys, monkeypatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with pytest.raises(SystemExit) as info:
        main(["generate", "--model", str(tiny_folder), "-"])
    assert info.value.code == 2
    assert "argument PROMPT" in capsys.readouterr().err


def test_every_subcommand_is_registered() -> None:
    from lookahead.cli.main import build_parser

    choices = build_parser()._subparsers._group_actions[0].choices
    assert {"demo", "generate", "chat", "install-model"} <= set(choices)


def test_install_model_rejects_an_unknown_name(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["install-model", "gpt-5"])
    assert info.value.code == 2
    assert "argument NAME" in capsys.readouterr().err


# ----------------------------------------------------------------------------- streamed text


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE with no merges: every UTF-8 byte is one token, so "é" takes two."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    backend = Tokenizer(tokenizer_models.BPE({c: i for i, c in enumerate(sorted(alphabet))}, []))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


@pytest.mark.parametrize("chunk", [1, 2, 3, 5])
def test_streamed_text_prints_multibyte_characters_whole(chunk) -> None:
    tokenizer = byte_tokenizer()
    text = "naïve café: 日本語 ✓ ok 🙂!"
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text.encode())  # really one token per byte
    delta = Detokenizer(tokenizer)
    pieces = [delta.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    pieces.append(delta.finish())
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)


def test_streamed_text_word_level_keeps_the_spaces() -> None:
    words = word_tokenizer(CHAT_WORDS, unk_token=None, bos_token=None)  # only </s> is special
    ids = words("hello world </s> again")["input_ids"]
    delta = Detokenizer(words)
    text = "".join(delta.push([i]) for i in ids) + delta.finish()
    assert text == words.decode(ids, skip_special_tokens=True) == "hello world again"
    assert delta.tokens == ids
    # With the prompt's tail as context, the first word gets its space after the prompt.
    delta = Detokenizer(words, prompt=words("one two")["input_ids"])
    text = "".join(delta.push([i]) for i in ids) + delta.finish()
    assert text == " hello world again"
    assert delta.tokens == ids


# ----------------------------------------------------------------------------- demo


@pytest.mark.slow
def test_demo_on_the_bundled_model_prints_identical(capsys) -> None:
    from lookahead.models.gguf import find_gguf
    from lookahead.models.registry import ModelNotAvailableError, get_model_spec

    try:
        find_gguf(get_model_spec("smollm2-135m"))
    except ModelNotAvailableError as error:
        pytest.skip(str(error))
    code, out, _ = run_cli(["demo", "--max-new-tokens", "32"], capsys)
    assert code == 0
    assert "identical" in out
    assert "DIFFERENT" not in out
    assert "speed-up" in out and "tokens/step" in out


def test_version_names_lookahead_torch_and_transformers(capsys) -> None:
    import importlib.metadata

    import transformers

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"lookahead {importlib.metadata.version('lookahead-exact')} ")
    assert f"torch {torch.__version__}" in line
    assert f"transformers {transformers.__version__}" in line
