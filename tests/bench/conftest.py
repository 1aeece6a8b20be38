"""The tiny model, prompt file and cache folder the bench and tune tests run on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiny import BENCH_PROMPTS, BENCH_WORDS, save_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """A saved tiny Llama with a word-level tokenizer, a JSONL prompt file, a cache folder."""
    root = tmp_path_factory.mktemp("bench")
    save_tiny_model(root / "model", BENCH_WORDS, max_positions=256)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in BENCH_PROMPTS))
    return dict(model=root / "model", prompts=prompts, cache=root / "cache", out=root / "out")
