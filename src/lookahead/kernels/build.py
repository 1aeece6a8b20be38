"""Compiling the C++ kernels on first use, safe against a build that was killed half-way.

PyTorch's extension builder (``torch.utils.cpp_extension.load``) compiles a kernel once and
caches it, keyed by its sources. While it compiles it keeps a plain ``lock`` file in the build
folder, and a second process waits for that file to go, forever. A first compile interrupted by
Ctrl-C (or ``kill -9``) leaves the file, and every later load would hang. So every build of ours
runs under an ``flock`` (released by the kernel when its holder dies); holding it, a ``lock`` file
can only be such a leftover, and it is removed with a warning (:mod:`lookahead.cache_files`).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from types import ModuleType

from lookahead import cache_files

logger = logging.getLogger(__name__)


def build_folder(name: str) -> Path:
    """The folder where PyTorch builds and caches the extension ``name``."""
    from torch.utils import cpp_extension  # imported here: it is slow, and only builds need it

    # The same private helper `cpp_extension.load` calls when no build_directory is given.
    return Path(cpp_extension._get_build_directory(name, verbose=False))


def compile_kernel(name: str, sources: list[Path], cflags: list[str],
                   headers: tuple[Path, ...] = ()) -> ModuleType:
    """Compile (first time) or load the extension ``name`` from ``sources`` with OpenMP.

    ``headers``: files the sources include. PyTorch's builder decides whether to rebuild from
    the sources and flags alone, so a hash of the headers goes into the flags (as a macro
    that nothing reads): a changed header rebuilds the kernel instead of loading a stale one.

    Raises:
        RuntimeError / OSError / ImportError: the build failed (no compiler, say).
    """
    from torch.utils import cpp_extension

    if headers:
        digest = hashlib.sha256(b"".join(Path(h).read_bytes() for h in headers)).hexdigest()
        cflags = [*cflags, f"-DLOOKAHEAD_HEADERS_SHA256_{digest[:16]}"]
    folder = build_folder(name)
    with cache_files.exclusive_lock(folder / "lookahead.lock"):
        cache_files.clear_stale_build_lock(folder)
        return cpp_extension.load(
            name=name, sources=[str(source) for source in sources],
            extra_cflags=[*cflags, "-fopenmp"], extra_ldflags=["-fopenmp"],
            build_directory=str(folder), verbose=False,
        )
