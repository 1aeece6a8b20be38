"""``--model`` takes a GGUF named on the hub: the commands run it from the hub cache."""

from __future__ import annotations

from pathlib import Path

import pytest
from hub_cache import add_repo, use_hub_cache
from tiny_gguf import Q, write_tiny_gguf

from lookahead.cli.main import main

PROMPT = "the theme in the"


@pytest.fixture()
def hub_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``owner/tiny-GGUF`` with a Q4_K_M and a Q8_0 file (different weights), offline."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # lookahead's own cache
    cache = use_hub_cache(monkeypatch, tmp_path / "hub")
    files = {name: write_tiny_gguf(tmp_path / f"{seed}.gguf", "llama", (Q.Q8_0, Q.Q4_0),
                                   seed=seed)
             for seed, name in enumerate(("tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf"))}
    return add_repo(cache, "owner/tiny-GGUF", files)


def generate(model: str, capsys) -> tuple[int, str, str]:
    code = main(["generate", "--model", model, "--dequantize", "--dtype", "float32",
                 "--method", "autoregressive", "--max-new-tokens", "8", PROMPT])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_generate_runs_a_hub_gguf_as_its_cached_file(hub_repo: Path, capsys) -> None:
    code, by_name, _ = generate("owner/tiny-GGUF:Q8_0", capsys)
    assert code == 0 and by_name.strip()
    assert generate(str(hub_repo / "tiny-Q8_0.gguf"), capsys)[1] == by_name
    code, by_default, _ = generate("owner/tiny-GGUF", capsys)  # the Q4_K_M file
    assert code == 0 and by_default == generate(str(hub_repo / "tiny-Q4_K_M.gguf"), capsys)[1]


def test_a_hub_model_missing_offline_is_one_error_line(hub_repo: Path, capsys) -> None:
    code, out, err = generate("owner/absent-GGUF:Q4_K_M", capsys)
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lookahead generate: error: model "
                                                   "'owner/absent-GGUF:Q4_K_M'")
    assert "hf download owner/absent-GGUF" in lines[0]


def test_no_single_file_of_the_tag_is_a_usage_error_listing_the_files(hub_repo: Path,
                                                                       capsys) -> None:
    with pytest.raises(SystemExit) as info:
        generate("owner/tiny-GGUF:Q5_K_M", capsys)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --model" in err and "no .gguf file carries Q5_K_M" in err
    assert "tiny-Q4_K_M.gguf, tiny-Q8_0.gguf" in err
