"""The ``llamacpp`` benchmark method (``lookahead.bench.llamacpp``).

The parser reads a ``llama-completion`` run's output saved in ``tests/fixtures`` (captured
once from the real binary, build of llama-cpp-python 0.3.36's llama.cpp). The engines run on
a tiny float32 GGUF written here, where llama.cpp's greedy tokens must be HF's; those tests
skip, saying why, where neither llama-cpp-python nor a binary is installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType
from hub_cache import add_repo, use_hub_cache
from tiny_gguf import write_tiny_gguf
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
from transformers.convert_slow_tokenizer import bytes_to_unicode

from lookahead.bench import llamacpp
from lookahead.bench.runner import BenchConfig
from lookahead.cli.bench import config_from_args
from lookahead.cli.main import build_parser
from lookahead.models.registry import ModelNotAvailableError

FIXTURES = Path(__file__).parent.parent / "fixtures"
BYTES = {char: byte for byte, char in bytes_to_unicode().items()}  # byte-level BPE spelling
Q = GGMLQuantizationType


def test_parse_timings_reads_the_binary_output() -> None:
    output = (FIXTURES / "llama-completion-stderr.txt").read_text()
    timings = llamacpp.parse_timings(output)
    # The fixture's "prompt eval time = 12183.42 ms / 39 tokens" and "eval time = 28401.69 ms
    # / 23 runs" lines, found among its other timing lines (load, sampling, total).
    assert (timings.prompt_ms, timings.prompt_tokens) == (12183.42, 39)
    assert (timings.eval_ms, timings.eval_runs) == (28401.69, 23)
    assert timings.seconds == pytest.approx((12183.42 + 28401.69) / 1000)


def test_parse_timings_reads_the_older_prefix_and_refuses_output_without_timings() -> None:
    older = ("llama_perf_context_print: prompt eval time =      45.50 ms /    10 tokens\n"
             "llama_perf_context_print:        eval time =     900.25 ms /    31 runs\n")
    assert llamacpp.parse_timings(older) == llamacpp.Timings(45.5, 10, 900.25, 31)
    with pytest.raises(ValueError, match="no timings"):
        llamacpp.parse_timings("error: failed to load model\n")


def test_answer_tokens_cut_to_the_tokens_made_and_end_where_it_stopped() -> None:
    class Words:
        def __call__(self, text, add_special_tokens):
            return {"input_ids": [len(word) for word in text.split()]}

    engine = llamacpp.BinaryEngine(Path("llama-completion"), Path("m.gguf"), Words(), [99], 2)
    stdout = (FIXTURES / "llama-completion-stdout.txt").read_text()
    assert stdout.startswith("```python\ndef add_numbers")
    full = llamacpp.Timings(1.0, 39, 1.0, 4)  # 5 tokens made, of at most 5
    assert engine.answer_tokens(stdout, full, 5) == [9, 3, 17, 6, 6]  # word lengths
    stopped = llamacpp.Timings(1.0, 39, 1.0, 2)  # 3 made, the last the end of the text
    assert engine.answer_tokens(stdout, stopped, 5) == [9, 3, 99]


def test_binary_command_asks_for_plain_greedy_completion(tmp_path) -> None:
    command = llamacpp.binary_command(Path("/x/llama-completion"), tmp_path / "m.gguf",
                                      "a\\nb", 7, 3)
    assert command[0] == "/x/llama-completion"
    flags = dict(zip(command[1::2], command[2::2], strict=False))
    assert flags["-p"] == "a\\nb" and flags["-n"] == "7" and flags["-t"] == flags["-tb"] == "3"
    assert flags["--temp"] == "0" and flags["--top-k"] == "1"
    assert {"-no-cnv", "--no-escape", "--no-display-prompt"} <= set(command)
    assert "-ctk" not in command
    exact = llamacpp.binary_command(Path("llama-completion"), tmp_path, "a", 7, 3, True)
    assert exact[-4:] == ["-ctk", "f32", "-ctv", "f32"]


def test_find_binary_takes_a_file_or_its_folder_and_names_a_bad_path(tmp_path) -> None:
    binary = tmp_path / "llama-completion"
    binary.write_text("")
    assert llamacpp.find_binary(str(binary)) == binary
    assert llamacpp.find_binary(str(tmp_path)) == binary
    with pytest.raises(FileNotFoundError, match="--llamacpp-bin"):
        llamacpp.find_binary(str(tmp_path / "absent"))


def test_bench_arguments_name_the_method_and_the_binary(tmp_path) -> None:
    args = build_parser().parse_args(
        ["bench", "--model", "smollm2-135m", "--methods", "hf,llamacpp", "--llamacpp-bin",
         str(tmp_path), "--shape", "2x5x4"])
    config = config_from_args(args)
    assert config.run_methods == ("hf", "llamacpp")
    assert config.options.llamacpp_bin == str(tmp_path)
    assert "llamacpp" not in BenchConfig().run_methods  # only when named
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--methods", "llama.cpp"])


def test_gguf_of_refuses_a_model_that_is_no_gguf(tmp_path) -> None:
    with pytest.raises(ValueError, match="GGUF"):
        llamacpp.gguf_of(str(tmp_path), None)
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    assert llamacpp.gguf_of(str(path), None) == path


@pytest.fixture()
def hub_repo(tmp_path, monkeypatch) -> Path:
    """``owner/repo-GGUF`` in a hub cache laid out here (huggingface_hub offline): three
    quantizations, and ``owner/checkpoint``, a transformers checkpoint. Returns the GGUF
    repository's snapshot folder."""
    cache = use_hub_cache(monkeypatch, tmp_path / "hub")
    add_repo(cache, "owner/checkpoint", {"config.json": b"{}", "model.safetensors": b"weights"})
    files = {name: b"GGUF " + name.encode()  # the lookup reads no file: distinct bytes do
             for name in ("model-Q4_K_M.gguf", "model-Q5_K_M.gguf", "sub/model-Q8_0.gguf")}
    return add_repo(cache, "owner/repo-GGUF", files)


@pytest.mark.parametrize(("name", "file"), [
    ("owner/repo-GGUF", "model-Q4_K_M.gguf"),  # a bare repository id: its Q4_K_M file
    ("owner/repo-GGUF:q5_k_m", "model-Q5_K_M.gguf"),
    ("owner/repo-GGUF/sub/model-Q8_0.gguf", "sub/model-Q8_0.gguf"),
])
def test_gguf_of_finds_a_hub_name_in_the_hub_cache_offline(hub_repo, name, file) -> None:
    found = llamacpp.gguf_of(name, None, "--draft-model")
    assert found == hub_repo / file
    assert found.read_bytes() == b"GGUF " + file.encode()


def test_gguf_of_names_the_flag_and_what_it_takes_for_a_bad_name(hub_repo) -> None:
    with pytest.raises(ValueError, match=r"--draft-model must be .*hub name.*'plain-word'"):
        llamacpp.gguf_of("plain-word", None, "--draft-model")
    with pytest.raises(ValueError, match="--model must be .*'owner/checkpoint' is a trans"):
        llamacpp.gguf_of("owner/checkpoint", None)
    with pytest.raises(ValueError, match="--model: .*no .gguf file carries Q3_K.*model-Q4_K_M"):
        llamacpp.gguf_of("owner/repo-GGUF:Q3_K", None)
    with pytest.raises(ModelNotAvailableError, match="hf download owner/absent"):
        llamacpp.gguf_of("owner/absent:Q8_0", None)


def test_gguf_of_takes_a_local_folder_for_a_path_not_a_hub_name(hub_repo, tmp_path,
                                                                monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "owner" / "repo-GGUF").mkdir(parents=True)
    with pytest.raises(ValueError, match="got 'owner/repo-GGUF'"):
        llamacpp.gguf_of("owner/repo-GGUF", None)


def test_decode_rate_leaves_out_the_first_token() -> None:
    runs = [{"new_tokens": 11, "seconds": 3.0, "time_to_first_token": 1.0},
            {"new_tokens": 1, "seconds": 0.5, "time_to_first_token": 0.5}]
    assert llamacpp.decode_rate(runs) == pytest.approx(10 / 2.0)


def test_comparison_table_names_llamacpps_fastest_mode_and_our_lead() -> None:
    from lookahead.bench.report import summarise

    def record(dataset, method, seconds, first):
        return {"dataset": dataset, "prompt": "p0", "method": method, "dtype": "quantized",
                "prompt_tokens": 5, "tokens": [1] * 11, "new_tokens": 11, "seconds": seconds,
                "time_to_first_token": first, "steps": 11, "stats": None}

    # 11 tokens each: hf 11 tok/s, llama.cpp plain 22, its n-grams 44, lookahead 55.
    timed = {"hf": (1.0, 0.5), "llamacpp_server": (0.5, 0.25), "llamacpp_ngram": (0.25, 0.05),
             "lookahead": (0.2, 0.1)}
    records = [record(d, m, *times) for d in ("code", "chat") for m, times in timed.items()]
    table = llamacpp.comparison_table(summarise({}, records))
    assert table.count("| vs llama.cpp best (llamacpp_ngram) |") == 3  # code, chat, all
    assert "| lookahead | quantized | 55.0 | 100.0 | 100 | 1/1 | 1.25x |" in table
    assert "| llamacpp_server | quantized | 22.0 | 40.0 | 250 | 1/1 | 0.50x |" in table
    assert ("llama.cpp best: llamacpp_ngram, 44.0 tok/s (decode only 50.0); fastest of ours: "
            "lookahead (quantized), 55.0 tok/s (decode only 100.0), 1.25x llama.cpp best"
            ) in table
    # over both data sets ("all"): twice the tokens in twice the time
    assert "| lookahead | quantized | 55.0 | 100.0 | 100 | 2/2 | 1.25x |" in table
    alone = [r for r in records if r["method"] != "llamacpp_ngram"]
    assert "llama.cpp best: llamacpp_server" in llamacpp.comparison_table(summarise({}, alone))
    assert llamacpp.fastest([], llamacpp.LLAMACPP_METHODS) is None


# ----------------------------------------------------------------------------- real engines


def _hf_greedy(path: Path, ids: torch.Tensor, new: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True)).eval()
    model.generation_config.eos_token_id = None  # the engines here stop at no token either
    out = model.generate(ids, max_new_tokens=new, do_sample=False,
                         attention_mask=torch.ones_like(ids), pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


def _engines(path: Path):
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    found = []
    if llamacpp.have_bindings():
        found.append(llamacpp.BindingsEngine(path, [], 1, f32_cache=True))
    binary = llamacpp.find_binary(None)
    if binary is not None:
        found.append(llamacpp.BinaryEngine(binary, path, tokenizer, [], 1, f32_cache=True))
    if not found:
        pytest.skip("neither llama-cpp-python nor a llama-completion binary on PATH")
    return found, tokenizer


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_llamacpp_greedy_equals_hf_greedy_on_a_float32_gguf(tmp_path, arch) -> None:
    tiny_f32 = write_tiny_gguf(tmp_path / "tiny.gguf", arch, (Q.F32,), hidden=64, seed=3)
    engines, tokenizer = _engines(tiny_f32)
    # Text that tokenizes alike in both: the binary reads the prompt as text.
    ids = tokenizer("in the tree the hat the heat", return_tensors="pt").input_ids
    want = _hf_greedy(tiny_f32, ids, 12)
    for engine in engines:
        measured = engine.measure(ids, 12)
        if engine.name == "binary":  # text in, bytes out: compare the bytes
            spelled = engine.tokenizer.convert_ids_to_tokens(want)
            assert engine.last_output.startswith(bytes(BYTES[c] for t in spelled for c in t))
        else:
            assert measured.tokens == want
        assert measured.new_tokens == 12 and measured.steps == 12
        assert 0 < measured.time_to_first_token <= measured.seconds
