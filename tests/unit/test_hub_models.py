"""GGUF models named on the Hugging Face hub, read from a hub cache laid out here, offline.

Each test builds ``models--owner--repo/{blobs,refs/main,snapshots/<commit>/...}`` as
huggingface_hub writes it (``hub_cache.add_repo``), points huggingface_hub at it and turns its
offline mode on, so that nothing touches the network.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants
import pytest
import torch
from hub_cache import add_repo, use_hub_cache
from tiny_gguf import Q, write_tiny_gguf

from lookahead.models.hub import HubName, parse_hub_name, pick_gguf, resolve_hub_name
from lookahead.models.load import is_gguf_source, load_model
from lookahead.models.registry import ModelNotAvailableError

QUANTS = ("model-Q4_K_M.gguf", "model-Q5_K_M.gguf", "sub/model-Q8_0.gguf")


@pytest.fixture()
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty hub cache, huggingface_hub pointed at it and offline."""
    return use_hub_cache(monkeypatch, tmp_path / "hub")


@pytest.fixture()
def gguf_repo(hub_cache: Path, tmp_path: Path) -> Path:
    """``owner/repo-GGUF``: three quantizations (different weights each) and a README."""
    files: dict[str, Path | bytes] = {"README.md": b"# a GGUF repository\n"}
    for seed, name in enumerate(QUANTS):
        files[name] = write_tiny_gguf(tmp_path / f"seed{seed}.gguf", "llama", (Q.Q8_0, Q.Q4_0),
                                      seed=seed)
    return add_repo(hub_cache, "owner/repo-GGUF", files)


@pytest.mark.parametrize(("text", "expected"), [
    ("owner/repo", HubName("owner/repo")),
    ("owner/repo:Q5_K_M", HubName("owner/repo", quant="Q5_K_M")),
    ("owner/repo/sub/file.gguf", HubName("owner/repo", filename="sub/file.gguf")),
    ("owner/repo/README.md", None),  # a file of the repository that is no GGUF
    ("owner/repo:", None),
    ("owner/../repo.gguf", None),
    ("plain-word", None),
])
def test_hub_names_are_parsed(text, expected) -> None:
    assert parse_hub_name(text) == expected
    assert expected is None or str(expected) == text


def test_a_bare_repository_id_picks_its_q4_k_m_file(gguf_repo: Path) -> None:
    found = resolve_hub_name(HubName("owner/repo-GGUF"))
    assert found.gguf == gguf_repo / "model-Q4_K_M.gguf"
    assert found.local_files_only  # offline: read from the cache alone


@pytest.mark.parametrize("tag", ["Q5_K_M", "q5_k_m"])
def test_a_quant_tag_picks_its_file_in_any_case(gguf_repo: Path, tag: str) -> None:
    found = resolve_hub_name(parse_hub_name(f"owner/repo-GGUF:{tag}"))
    assert found.gguf == gguf_repo / "model-Q5_K_M.gguf"
    # The tag matches in a subfolder too.
    assert resolve_hub_name(parse_hub_name("owner/repo-GGUF:Q8_0")).gguf == (
        gguf_repo / "sub" / "model-Q8_0.gguf")


def test_a_file_path_in_the_repository_names_that_file(gguf_repo: Path) -> None:
    found = resolve_hub_name(parse_hub_name("owner/repo-GGUF/sub/model-Q8_0.gguf"))
    assert found.gguf == gguf_repo / "sub" / "model-Q8_0.gguf"
    assert found.gguf.read_bytes()[:4] == b"GGUF"


def test_load_model_loads_the_file_the_hub_name_picks(gguf_repo: Path, tmp_path: Path) -> None:
    cache = tmp_path / "lookahead"
    model, tokenizer = load_model("owner/repo-GGUF:Q5_K_M", "float32", cache_dir=cache,
                                  quantized=False)
    direct, _ = load_model(str(gguf_repo / "model-Q5_K_M.gguf"), "float32", cache_dir=cache,
                           quantized=False)
    other, _ = load_model("owner/repo-GGUF", "float32", cache_dir=cache, quantized=False)
    weights = model.get_input_embeddings().weight
    assert torch.equal(weights, direct.get_input_embeddings().weight)
    assert not torch.equal(weights, other.get_input_embeddings().weight)  # the Q4_K_M file
    assert model.name_or_path == "owner/repo-GGUF:Q5_K_M"  # tuned profiles key on this name
    assert tokenizer("the")["input_ids"]


def test_hub_names_of_gguf_files_load_quantized_by_default(gguf_repo: Path,
                                                           hub_cache: Path) -> None:
    add_repo(hub_cache, "owner/checkpoint", {"config.json": b"{}", "model.safetensors": b"x"})
    assert is_gguf_source("owner/repo-GGUF")
    assert is_gguf_source("owner/repo-GGUF:Q5_K_M")
    assert not is_gguf_source("owner/checkpoint")  # transformers loads it
    assert resolve_hub_name(HubName("owner/checkpoint")).gguf is None


def test_several_q4_k_m_files_are_refused_with_the_list(hub_cache: Path) -> None:
    split = {f"big-Q4_K_M-0000{i}-of-00002.gguf": b"GGUF" + bytes([i]) for i in (1, 2)}
    add_repo(hub_cache, "owner/big-GGUF", {**split, "big-Q8_0.gguf": b"GGUF8"})
    with pytest.raises(ValueError) as info:
        load_model("owner/big-GGUF")
    message = str(info.value)
    assert "several files carry Q4_K_M" in message and "llama-gguf-split --merge" in message
    assert all(name in message for name in (*split, "big-Q8_0.gguf"))
    assert "owner/big-GGUF:TAG" in message and "owner/big-GGUF/FILE.gguf" in message


def test_a_missing_tag_is_refused_with_the_list(gguf_repo: Path) -> None:
    # Q4_K is a tag of its own: it must not pick the Q4_K_M file.
    with pytest.raises(ValueError, match="no .gguf file carries Q4_K.*model-Q4_K_M.gguf"):
        resolve_hub_name(parse_hub_name("owner/repo-GGUF:Q4_K"))


def test_pick_gguf_reads_the_file_list() -> None:
    name = HubName("o/r")
    assert pick_gguf(name, ["a-Q4_K_M.gguf", "a-IQ4_K_M.gguf", "a-Q4_K_S.gguf"]) == "a-Q4_K_M.gguf"
    assert pick_gguf(name, ["config.json", "model.safetensors", "x-Q4_K_M.gguf"]) is None
    assert pick_gguf(name, ["config.json", "x-Q4_K_M.gguf"]) == "x-Q4_K_M.gguf"  # no weights
    q8 = HubName("o/r", quant="Q8_0")
    assert pick_gguf(q8, ["w_Q8_0.gguf", "w_Q8_0_L.gguf"]) == "w_Q8_0.gguf"
    with pytest.raises(ValueError, match="has no .gguf file"):
        pick_gguf(HubName("o/r", quant="Q8_0"), ["config.json"])


def test_a_model_missing_offline_says_what_to_do(hub_cache: Path) -> None:
    with pytest.raises(ModelNotAvailableError) as info:
        load_model("owner/absent-GGUF:Q4_K_M")
    message = str(info.value)
    assert "owner/absent-GGUF:Q4_K_M" in message
    assert "Run once online" in message and "hf download owner/absent-GGUF" in message
    assert "local path" in message


def test_a_file_missing_from_a_cached_repository_says_what_to_do(gguf_repo: Path) -> None:
    with pytest.raises(ModelNotAvailableError, match="hf download owner/repo-GGUF other.gguf"):
        load_model("owner/repo-GGUF/other.gguf")


def test_an_unreachable_hub_leaves_the_cache(gguf_repo: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline mode off but no network: the listing fails, the cached file serves, and the
    download is not tried again (it would wait through the hub's retries)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

    def unreachable(*args, **kwargs):
        raise OSError("[Errno -2] Name or service not known")

    download = huggingface_hub.hf_hub_download

    def cached_only(*args, **kwargs):
        assert kwargs["local_files_only"] is True
        return download(*args, **kwargs)

    monkeypatch.setattr(huggingface_hub, "list_repo_files", unreachable)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", cached_only)
    found = resolve_hub_name(HubName("owner/repo-GGUF"))
    assert found.gguf == gguf_repo / "model-Q4_K_M.gguf" and found.local_files_only
    with pytest.raises(ModelNotAvailableError, match="Name or service not known"):
        resolve_hub_name(HubName("owner/absent-GGUF"))


def test_local_files_only_reads_the_cache_when_online(gguf_repo: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With offline mode off, local_files_only=True still never asks the hub."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

    def no_network(*args, **kwargs):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(huggingface_hub, "list_repo_files", no_network)
    found = resolve_hub_name(HubName("owner/repo-GGUF"), local_files_only=True)
    assert found.gguf == gguf_repo / "model-Q4_K_M.gguf"


def test_a_local_file_wins_over_a_hub_name(gguf_repo: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    local = tmp_path / "owner" / "repo-GGUF" / "model.gguf"
    local.parent.mkdir(parents=True)
    shutil.copyfile(gguf_repo / "model-Q4_K_M.gguf", local)
    monkeypatch.chdir(tmp_path)
    assert is_gguf_source("owner/repo-GGUF/model.gguf")  # not in the hub repository
    # The repository has no model.gguf: asking the hub would fail.
    model, _ = load_model("owner/repo-GGUF/model.gguf", "float32", cache_dir=tmp_path / "c",
                          quantized=False)
    assert type(model).__name__ == "LlamaForCausalLM"
