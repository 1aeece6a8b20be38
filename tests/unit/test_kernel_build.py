"""A kernel build killed half-way leaves PyTorch's lock file; the next load must not hang."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
import time

import pytest

_LOAD = ("import logging, sys; logging.basicConfig(level=logging.WARNING)\n"
         "from lookahead.kernels.stream_linear import load_stream_kernel\n"
         "load_stream_kernel(); print('loaded')\n")


def test_a_leftover_build_lock_is_removed_and_the_kernel_loads():
    torch = pytest.importorskip("torch")
    if not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        pytest.skip("the stream kernel needs AVX-512")
    from lookahead.kernels.build import build_folder

    folder = build_folder("lookahead_stream_linear")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lock").write_text("")  # what a killed first compile leaves behind
    # Without the fix PyTorch waits for the lock forever: the timeout turns that into a failure.
    done = subprocess.run([sys.executable, "-c", _LOAD], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("loaded")
    assert "left by a kernel build that was killed" in done.stderr
    assert not (folder / "lock").exists()


def test_a_changed_header_changes_the_build_flags(tmp_path, monkeypatch):
    """PyTorch rebuilds on changed sources or flags only: a header's hash rides in the flags."""
    from torch.utils import cpp_extension

    from lookahead.kernels import build

    seen = []
    monkeypatch.setattr(cpp_extension, "load",
                        lambda **kw: seen.append(kw["extra_cflags"]) or kw["name"])
    monkeypatch.setattr(build, "build_folder", lambda name: tmp_path / name)
    header = tmp_path / "helper.h"
    (tmp_path / "probe.cpp").write_text('#include "helper.h"\n')
    for text in ("#define A 1\n", "#define A 1\n", "#define A 2\n"):
        header.write_text(text)
        build.compile_kernel("probe", [tmp_path / "probe.cpp"], ["-O3"], headers=(header,))
    build.compile_kernel("probe", [tmp_path / "probe.cpp"], ["-O3"])
    # The same flags twice: built once in this process. Without headers of its own, a kernel
    # still rebuilds when the header every kernel includes changes.
    assert len(seen) == 3 and seen[0] != seen[1] and seen[2][::2] == ["-O3", "-fopenmp"]
    hashes = [flags[1] for flags in seen]
    assert all(flag.startswith("-DLOOKAHEAD_HEADERS_SHA256_") for flag in hashes)
    common = hashlib.sha256(build.COMMON_HEADER.read_bytes()).hexdigest()[:16]
    assert hashes[2] == f"-DLOOKAHEAD_HEADERS_SHA256_{common}" and len(set(hashes)) == 3


def test_a_failed_build_is_tried_once_per_process(tmp_path, monkeypatch, caplog):
    """A model asks for its kernel once per layer: a failed build must not run every time."""
    from torch.utils import cpp_extension

    from lookahead.kernels import build

    calls = []

    def no_compiler(**kwargs):
        calls.append(kwargs["name"])
        raise RuntimeError("Error building extension 'probe': c++: not found")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    monkeypatch.setattr(build, "build_folder", lambda name: tmp_path / name)
    (tmp_path / "probe.cpp").write_text("int f();\n")
    for _ in range(3):
        with pytest.raises(RuntimeError, match="could not be built: .*c\\+\\+: not found"):
            build.compile_kernel("lookahead_probe", [tmp_path / "probe.cpp"], ["-O3"])
    assert calls == ["lookahead_probe"]
    assert [r.getMessage() for r in caplog.records].count(
        "the probe kernel cannot be built here (Error building extension 'probe': c++: not "
        "found); not trying again in this process") == 1


def test_the_first_compile_is_announced_and_a_later_load_is_not(tmp_path, monkeypatch, caplog):
    from torch.utils import cpp_extension

    from lookahead.kernels import build

    monkeypatch.setattr(cpp_extension, "load", lambda **kwargs: kwargs["name"])
    monkeypatch.setattr(build, "build_folder", lambda name: tmp_path / name)
    source = tmp_path / "probe.cpp"

    def announced(text: str) -> bool:
        """Build once, as a fresh process would (the per-process memory forgotten)."""
        source.write_text(text)
        build._build_once.cache_clear()
        caplog.clear()
        with caplog.at_level("WARNING", logger="lookahead.kernels.build"):
            assert build.compile_kernel("lookahead_probe", [source], ["-O3"]) == "lookahead_probe"
        return any("compiling the probe kernel once" in r.getMessage() and "s on 2 cores" in
                   r.getMessage() for r in caplog.records)

    assert announced("int f();\n")  # first time: compiled
    assert not announced("int f();\n")  # the same sources: loaded
    assert announced("int g();\n")  # changed sources: compiled again


def test_waiting_for_another_process_s_compile_is_announced(tmp_path, monkeypatch, caplog):
    import fcntl

    from torch.utils import cpp_extension

    from lookahead.kernels import build

    released = threading.Event()
    built_after_release = []

    def load(**kwargs):
        built_after_release.append(released.is_set())
        return kwargs["name"]

    monkeypatch.setattr(cpp_extension, "load", load)
    monkeypatch.setattr(build, "build_folder", lambda name: tmp_path / name)
    source = tmp_path / "probe.cpp"
    source.write_text("int f();\n")
    lock = tmp_path / "lookahead_waiter" / "lookahead.lock"
    lock.parent.mkdir()

    def another_process() -> None:  # flock is per open file: another handle stands for one
        with lock.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            held.set()
            time.sleep(0.5)
            fcntl.flock(handle, fcntl.LOCK_UN)
            released.set()

    held = threading.Event()
    holder = threading.Thread(target=another_process)
    holder.start()
    held.wait(10)
    with caplog.at_level("WARNING", logger="lookahead.kernels.build"):
        build.compile_kernel("lookahead_waiter", [source], ["-O3"])
    holder.join(10)
    assert built_after_release == [True]  # it waited for the holder
    assert any("another process is compiling the waiter kernel" in r.getMessage()
               for r in caplog.records)
