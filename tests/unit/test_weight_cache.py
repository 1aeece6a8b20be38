"""The weight cache survives a killed write and a corrupted entry.

The model is a tiny GGUF file (``tiny_gguf``) loaded by path in float32: a ``.gguf`` path
goes through the same cache as a bundled model (``is_complete_cache``, then
``dequantise_to_cache`` into ``<cache_dir>/models/<key>/float32``), in about a second.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_gguf import Q, write_tiny_gguf

import lookahead
from lookahead.models.gguf import gguf_cache_key, model_cache_dir

# The weights of the tiny model in float32 are some 360 KB, its configs about 1 KB each:
# a child allowed files of at most this many bytes is killed writing the weights.
_FILE_SIZE_LIMIT = 64 * 1024

# The child lets the kernel kill it (SIGXFSZ, whose default action ends the process; Python
# ignores it otherwise) when a write would grow a file past the limit: no handler, no
# ``finally`` runs, as under kill -9, and it happens at the same point on every run. (No core
# file is written for it.)
_LOAD = ("import resource, signal, sys, torch, lookahead\n"
         "signal.signal(signal.SIGXFSZ, signal.SIG_DFL)\n"
         "resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
         "resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), resource.RLIM_INFINITY))\n"
         "lookahead.load_model(sys.argv[1], torch.float32, cache_dir=sys.argv[2])\n")


@pytest.fixture()
def tiny_gguf(tmp_path: Path) -> Path:
    return write_tiny_gguf(tmp_path / "tiny.gguf", "llama", (Q.Q8_0, Q.Q4_0))


def _entry(gguf: Path, root: Path) -> Path:
    return model_cache_dir(root, gguf_cache_key(gguf), torch.float32)


def _kill_during_write(gguf: Path, root: Path) -> None:
    """A first load of ``gguf`` into ``root``, killed by the kernel while writing the weights
    (``-B``: no bytecode files, which the limit would stop too)."""
    child = subprocess.run([sys.executable, "-B", "-c", _LOAD, str(gguf), str(root),
                            str(_FILE_SIZE_LIMIT)], cwd=root.parent, timeout=600)
    assert child.returncode == -signal.SIGXFSZ, (
        f"the load was not killed writing its files (exit status {child.returncode})")


def test_a_load_killed_while_writing_is_rebuilt_and_its_temporary_removed(
        tiny_gguf, tmp_path, caplog):
    root = tmp_path / "cache"
    _kill_during_write(tiny_gguf, root)
    entry = _entry(tiny_gguf, root)
    leftovers = list(entry.parent.glob(".*.tmp"))
    assert leftovers, "the killed write left no temporary to clean up"
    assert not entry.exists()
    assert not any((path / "manifest.json").exists() for path in leftovers)
    with caplog.at_level(logging.WARNING, logger="lookahead"):
        model, tokenizer = lookahead.load_model(str(tiny_gguf), torch.float32, cache_dir=root)
    assert not any(path.exists() for path in leftovers)
    assert (entry / "manifest.json").is_file()
    assert (entry / "model.safetensors").stat().st_size > _FILE_SIZE_LIMIT
    assert any("killed" in record.getMessage() for record in caplog.records)
    ids = tokenizer("def add(a, b):", return_tensors="pt").input_ids
    assert model(ids).logits.isfinite().all()


def test_a_truncated_cached_file_is_rebuilt_with_a_warning(tiny_gguf, tmp_path, caplog):
    root = tmp_path / "cache"
    first, _ = lookahead.load_model(str(tiny_gguf), torch.float32, cache_dir=root)
    # Copies: the loaded weights map the file, which is about to be cut short under them.
    loaded = {name: tensor.clone() for name, tensor in first.state_dict().items()}
    del first
    weights = _entry(tiny_gguf, root) / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as handle:
        handle.truncate(size // 3)
    with caplog.at_level(logging.WARNING, logger="lookahead"):
        model, _ = lookahead.load_model(str(tiny_gguf), torch.float32, cache_dir=root)
    assert weights.stat().st_size == size
    warnings = [r.getMessage() for r in caplog.records if "not usable" in r.getMessage()]
    assert len(warnings) == 1 and "model.safetensors" in warnings[0]
    rebuilt = model.state_dict()
    assert rebuilt.keys() == loaded.keys()
    assert all(torch.equal(rebuilt[name], loaded[name]) for name in loaded)
