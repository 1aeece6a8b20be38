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
