"""A kernel build killed half-way leaves PyTorch's lock file; the next load must not hang."""

from __future__ import annotations

import subprocess
import sys

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
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: seen.append(kw["extra_cflags"]))
    monkeypatch.setattr(build, "build_folder", lambda name: tmp_path / name)
    header = tmp_path / "helper.h"
    for text in ("#define A 1\n", "#define A 1\n", "#define A 2\n"):
        header.write_text(text)
        build.compile_kernel("probe", [tmp_path / "probe.cpp"], ["-O3"], headers=(header,))
    build.compile_kernel("probe", [tmp_path / "probe.cpp"], ["-O3"])
    assert seen[0] == seen[1] != seen[2] and seen[3] == ["-O3", "-fopenmp"]
    assert all(flag.startswith("-DLOOKAHEAD_HEADERS_SHA256_") for flag in (seen[0][1], seen[2][1]))
