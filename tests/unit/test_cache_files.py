"""The cache's write discipline: manifests, stale temporaries, kernel build locks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lookahead import cache_files


def _entry(folder: Path) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text('{"a": 1}')
    (folder / "weights.bin").write_bytes(os.urandom(3 * (1 << 20) + 17))
    (folder / "sub").mkdir()
    (folder / "sub" / "x.txt").write_text("x")
    cache_files.write_manifest(folder)
    return folder


def test_a_whole_entry_passes_both_checks(tmp_path):
    folder = _entry(tmp_path / "e")
    assert cache_files.check_manifest(folder) is None
    assert cache_files.check_manifest(folder, full=True) is None


def test_an_entry_without_a_manifest_is_incomplete(tmp_path):
    folder = _entry(tmp_path / "e")
    (folder / cache_files.MANIFEST).unlink()
    assert "no manifest.json" in cache_files.check_manifest(folder)


@pytest.mark.parametrize("damage", ["truncate", "delete", "flip_end", "flip_middle", "garble"])
def test_a_damaged_entry_is_named(tmp_path, damage):
    folder = _entry(tmp_path / "e")
    weights = folder / "weights.bin"
    data = bytearray(weights.read_bytes())
    if damage == "truncate":
        weights.write_bytes(data[: len(data) // 2])
    elif damage == "delete":
        weights.unlink()
    elif damage == "garble":
        (folder / cache_files.MANIFEST).write_text("{not json")
    else:
        at = len(data) - 5 if damage == "flip_end" else len(data) // 2
        data[at] ^= 0xFF
        weights.write_bytes(bytes(data))
    problem = cache_files.check_manifest(folder, full=True)
    assert problem is not None
    if damage != "garble":
        assert "weights.bin" in problem
    quick = cache_files.check_manifest(folder)
    # The quick check reads only the ends: a flipped byte in the middle needs full=True.
    assert (quick is None) == (damage == "flip_middle")


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_temporaries_of_dead_writers_are_removed_and_live_ones_kept(tmp_path):
    target = tmp_path / "model"
    live = cache_files.temporary_name(target)
    live.mkdir()
    dead = tmp_path / f".model.{_dead_pid()}.abcd1234.tmp"
    dead.mkdir()
    (dead / "big.bin").write_bytes(b"0" * 1000)
    old = tmp_path / ".model.q1w2e3.tmp"  # an older version's name: no process id
    old.write_bytes(b"x")
    week_ago = time.time() - 7 * 24 * 3600
    os.utime(old, (week_ago, week_ago))
    young = tmp_path / ".other.r4t5y6.tmp"
    young.write_bytes(b"x")
    removed = cache_files.remove_stale_temporaries(tmp_path)
    assert sorted(removed) == sorted([dead, old])
    assert live.exists() and young.exists() and not dead.exists() and not old.exists()


def test_two_temporary_names_for_one_target_differ(tmp_path):
    names = {cache_files.temporary_name(tmp_path / "p.json") for _ in range(50)}
    assert len(names) == 50
    assert all(f".{os.getpid()}." in name.name for name in names)


def test_a_leftover_build_lock_is_cleared_under_our_lock(tmp_path):
    (tmp_path / "lock").write_text("")
    with cache_files.exclusive_lock(tmp_path / "lookahead.lock"):
        assert cache_files.clear_stale_build_lock(tmp_path) is True
    assert not (tmp_path / "lock").exists()
    assert cache_files.clear_stale_build_lock(tmp_path) is False


def test_the_flock_is_released_when_its_holder_is_killed(tmp_path):
    lock = tmp_path / "lookahead.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from lookahead import cache_files\n"
         f"with cache_files.exclusive_lock(Path({str(lock)!r})):\n"
         "    print('held', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        holder.kill()
        holder.wait(timeout=30)
        with cache_files.exclusive_lock(lock):  # would block forever on a stale lock
            pass
    finally:
        holder.kill()


def test_an_assembled_gguf_with_another_hash_is_refused(tmp_path):
    import dataclasses

    from lookahead.models.gguf import _check_pinned_hash
    from lookahead.models.registry import ModelNotAvailableError, get_model_spec

    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + os.urandom(100))
    spec = dataclasses.replace(get_model_spec("qwen2.5-coder-0.5b"),
                               sha256=cache_files.sha256_of(path))
    _check_pinned_hash(spec, path)  # the pinned hash: accepted
    with pytest.raises(ModelNotAvailableError, match="SHA-256 .* not the pinned"):
        _check_pinned_hash(dataclasses.replace(spec, sha256="0" * 64), path)
