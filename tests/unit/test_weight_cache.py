"""The real weight cache survives a killed write and a corrupted entry (bundled SmolLM2)."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lookahead.models.gguf import model_cache_dir
from lookahead.models.registry import ModelNotAvailableError, get_model_spec

pytestmark = pytest.mark.slow

_LOAD = ("import sys, torch, lookahead\n"
         "lookahead.load_model('smollm2-135m', torch.float32, cache_dir=sys.argv[1])\n")


@pytest.fixture(scope="module")
def smollm2_gguf():
    from lookahead.models.gguf import find_gguf
    try:
        return find_gguf(get_model_spec("smollm2-135m"))
    except ModelNotAvailableError as error:
        pytest.skip(str(error))


def _kill_during_write(root: Path) -> None:
    """Start a first load into ``root`` and kill -9 it once its temporary entry appears."""
    folder = model_cache_dir(root, "smollm2-135m", __import__("torch").float32).parent
    child = subprocess.Popen([sys.executable, "-c", _LOAD, str(root)])
    try:
        deadline = time.monotonic() + 600
        while not list(folder.glob(".*.tmp")):
            assert child.poll() is None, "the load finished before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()


def test_a_load_killed_while_writing_is_rebuilt_and_its_temporary_removed(
        smollm2_gguf, tmp_path, caplog):
    import torch

    import lookahead

    _kill_during_write(tmp_path)
    entry = model_cache_dir(tmp_path, "smollm2-135m", torch.float32)
    leftovers = list(entry.parent.glob(".*.tmp"))
    assert leftovers, "the killed write left no temporary to clean up"
    assert not (entry / "manifest.json").exists()
    with caplog.at_level(logging.WARNING, logger="lookahead"):
        model, tokenizer = lookahead.load_model("smollm2-135m", torch.float32, cache_dir=tmp_path)
    assert not any(path.exists() for path in leftovers)
    assert (entry / "manifest.json").is_file()
    assert any("killed" in record.getMessage() for record in caplog.records)
    ids = tokenizer("def add(a, b):", return_tensors="pt").input_ids
    assert model(ids).logits.isfinite().all()


def test_a_truncated_cached_file_is_rebuilt_with_a_warning(smollm2_gguf, tmp_path, caplog):
    import torch

    import lookahead

    lookahead.load_model("smollm2-135m", torch.float32, cache_dir=tmp_path)
    entry = model_cache_dir(tmp_path, "smollm2-135m", torch.float32)
    weights = entry / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as handle:
        handle.truncate(size // 3)
    with caplog.at_level(logging.WARNING, logger="lookahead"):
        model, _ = lookahead.load_model("smollm2-135m", torch.float32, cache_dir=tmp_path)
    assert weights.stat().st_size == size
    warnings = [r.getMessage() for r in caplog.records if "not usable" in r.getMessage()]
    assert len(warnings) == 1 and "model.safetensors" in warnings[0]
