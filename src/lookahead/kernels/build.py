"""Compiling the C++ kernels on first use, safe against a build that was killed half-way.

PyTorch's extension builder (``torch.utils.cpp_extension.load``) compiles a kernel once and
caches it, keyed by its sources. While it compiles it keeps a plain ``lock`` file in the build
folder, and a second process waits for that file to go, forever. A first compile interrupted by
Ctrl-C (or ``kill -9``) leaves the file, and every later load would hang. So every build of ours
runs under an ``flock`` (released by the kernel when its holder dies); holding it, a ``lock`` file
can only be such a leftover, and it is removed with a warning (:mod:`lookahead.cache_files`).

A first compile takes 15 to 30 s (longer on a busy machine) and PyTorch's builder says nothing
meanwhile, so it is announced with a warning: a stamp file in the build folder records what was
last built there (sources, flags, torch version); when it differs, the build compiles. Each
build is tried once per process (``functools.cache`` on :func:`_build_once`, keyed by name,
folder, sources and flags): a failed one is remembered and raised again for every later caller
-- a model asks for its kernel once per layer -- instead of starting the compiler each time.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import logging
import os
from pathlib import Path
from types import ModuleType

from lookahead import cache_files

logger = logging.getLogger(__name__)

# What a first compile of one kernel takes: quant_linear, row_ops and invariant_attention
# (AVX-512 builds) took 27, 13 and 13 s with 2 cores (Intel Xeon, g++ 12, an idle machine;
# aten_light.h's note); a first quantized load compiles all three.
_FIRST_COMPILE = "about 15-30 s on 2 cores"
_STAMP = "lookahead.built"
# What every kernel includes from PyTorch, in place of <torch/extension.h> (why: in the file)
COMMON_HEADER = Path(__file__).parent / "csrc" / "aten_light.h"


def build_folder(name: str) -> Path:
    """The folder where PyTorch builds and caches the extension ``name``."""
    from torch.utils import cpp_extension  # imported here: it is slow, and only builds need it

    # The same private helper `cpp_extension.load` calls when no build_directory is given.
    return Path(cpp_extension._get_build_directory(name, verbose=False))


def compile_kernel(name: str, sources: list[Path], cflags: list[str],
                   headers: tuple[Path, ...] = ()) -> ModuleType:
    """Compile (first time) or load the extension ``name`` from ``sources`` with OpenMP.

    ``headers``: files the sources include (``COMMON_HEADER`` always). PyTorch's builder
    decides whether to rebuild from the sources and flags alone, so a hash of the headers goes
    into the flags (as a macro that nothing reads): a changed header rebuilds the kernel
    instead of loading a stale one.

    A build is tried once per process: a later call with the same arguments returns the
    loaded module, or raises again the error of the failed build without compiling again.

    Raises:
        RuntimeError: the build failed (no compiler, say), now or earlier in this process;
            its cause is the builder's own error.
    """
    headers = (*headers, COMMON_HEADER)
    digest = hashlib.sha256(b"".join(Path(h).read_bytes() for h in headers)).hexdigest()
    cflags = [*cflags, f"-DLOOKAHEAD_HEADERS_SHA256_{digest[:16]}"]
    outcome = _build_once(name, build_folder(name), tuple(str(s) for s in sources),
                          tuple(cflags))
    if outcome.error is not None:
        raise RuntimeError(f"the kernel {name} could not be built: {outcome.error}"
                           ) from outcome.error
    assert outcome.module is not None
    return outcome.module


@dataclasses.dataclass(frozen=True)
class _Outcome:
    """What one build gave: the loaded module, or the error it failed with."""

    module: ModuleType | None = None
    error: BaseException | None = None


@functools.cache  # once per process: a loaded extension stays imported, a failed one stays failed
def _build_once(name: str, folder: Path, sources: tuple[str, ...], cflags: tuple[str, ...]
                ) -> _Outcome:
    """Build or load ``name`` in ``folder``; the outcome, failures included."""
    from torch.utils import cpp_extension

    try:
        _say_if_another_builds(folder / "lookahead.lock", name)
        with cache_files.exclusive_lock(folder / "lookahead.lock"):
            cache_files.clear_stale_build_lock(folder)
            stamp = _stamp_of(sources, cflags)
            if _read_stamp(folder) != stamp:
                logger.warning("compiling the %s kernel once for this machine (%s); later runs "
                               "load it at once", name.removeprefix("lookahead_"),
                               _FIRST_COMPILE)
            module = cpp_extension.load(
                name=name, sources=list(sources),
                extra_cflags=[*cflags, "-fopenmp"], extra_ldflags=["-fopenmp"],
                build_directory=str(folder), verbose=False,
            )
            _write_stamp(folder, stamp)
    except (RuntimeError, OSError, ImportError) as error:
        logger.warning("the %s kernel cannot be built here (%s); not trying again in this "
                       "process", name.removeprefix("lookahead_"), error)
        return _Outcome(error=error)
    return _Outcome(module=module)


def _say_if_another_builds(lock: Path, name: str) -> None:
    """Warn when another process holds the build lock: this one waits, silently otherwise,
    for that compile to end."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.warning("another process is compiling the %s kernel; waiting for it (%s)",
                           name.removeprefix("lookahead_"), _FIRST_COMPILE)
        else:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _stamp_of(sources: tuple[str, ...], cflags: tuple[str, ...]) -> str:
    """What decides a rebuild: the sources' bytes, the flags and torch's version."""
    import torch

    digest = hashlib.sha256(torch.__version__.encode())
    for source in sources:
        digest.update(Path(source).read_bytes())
    digest.update("\0".join(cflags).encode())
    return digest.hexdigest()


def _read_stamp(folder: Path) -> str | None:
    try:
        return (folder / _STAMP).read_text().strip()
    except OSError:
        return None


def _write_stamp(folder: Path, stamp: str) -> None:
    """Record what ``folder`` now holds (a read-only folder only costs a second announcement)."""
    try:
        tmp = cache_files.temporary_name(folder / _STAMP)
        tmp.write_text(stamp + "\n")
        os.replace(tmp, folder / _STAMP)
    except OSError as error:
        logger.debug("could not write the build stamp in %s (%s)", folder, error)
