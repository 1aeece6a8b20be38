"""Files the library writes under its cache, written so that a killed write cannot leave rot.

Three things live in the cache: model folders (GGUF files assembled from part packages, weights
de-quantised once), tuned profiles, and PyTorch's build folders of the compiled kernels. Each
write here follows one pattern:

1. write into a temporary sibling whose name carries the writer's process id
   (``.<name>.<pid>.<random>.tmp``), so a leftover from a killed process can be told from a
   write still in progress and removed (:func:`remove_stale_temporaries`; they are 0.3-3 GB);
2. write a manifest last (``manifest.json``: each file's size and SHA-256), then rename the
   folder into place: an entry without a manifest, or whose files disagree with it, is
   incomplete or corrupt, and is rebuilt with a warning (:func:`check_manifest`);
3. bundled GGUF files are checked against pinned SHA-256 hashes after assembly
   (:func:`sha256_of`).

A load checks every file's size and the hash of its first and last MiB (:func:`check_manifest`),
which finds truncated and overwritten files in milliseconds; ``full=True`` hashes everything.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
_SAMPLE = 1 << 20  # bytes hashed at each end of a file by the quick check
_CHUNK = 8 << 20
_LEGACY_AGE = 24 * 3600  # seconds


def temporary_name(target: Path) -> Path:
    """A sibling of ``target`` to write into: ``.<name>.<pid>.<random>.tmp``.

    The process id lets :func:`remove_stale_temporaries` tell a killed writer's leftover from
    a write still in progress; the random part keeps two writers of one process apart.
    """
    return target.parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def safe_name(text: str, default: str) -> str:
    """``text`` as a file name's part: runs of characters other than letters, digits, ".",
    "_" and "-" become "_" ("Intel(R) Xeon(R)" -> "Intel_R_Xeon_R"); ``default`` if none
    is left."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_.") or default


def write_json(path: Path, record: dict) -> None:
    """Write ``record`` as JSON to ``path`` atomically (a temporary, then renamed: a killed
    write leaves no half a file), making its folder if need be.

    Raises:
        OSError: the folder or file cannot be written (a read-only cache, a full disk).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


def _writer_pid(path: Path) -> int | None:
    """The process id in a name made by :func:`temporary_name`, or None for another name."""
    parts = path.name.split(".")
    if len(parts) < 5 or parts[0] != "" or parts[-1] != "tmp":
        return None
    try:
        return int(parts[-3])
    except ValueError:
        return None


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as error:
        return error.errno == errno.EPERM  # exists, owned by another user
    return True


def _is_stale(path: Path) -> bool:
    """A temporary whose writer is gone: its process has ended, or, for a name without a
    process id (written by an older version), it is over a day old."""
    pid = _writer_pid(path)
    if pid is not None:
        return not _is_alive(pid)
    return time.time() - path.stat().st_mtime > _LEGACY_AGE


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Remove the temporaries (``.*.tmp``) in ``folder`` whose writer is gone; returns them.

    Temporaries of live processes (a concurrent write) are left alone.
    """
    if not folder.is_dir():
        return []
    removed = []
    for path in folder.glob(".*.tmp"):
        if not _is_stale(path):
            continue
        logger.warning("removing %s, left by a write that was killed", path)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def sha256_of(path: Path) -> str:
    """The SHA-256 of a whole file, hex."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _ends_hash(path: Path, size: int) -> str:
    """SHA-256 of a file's first and last MiB (the whole file when it is smaller)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        digest.update(handle.read(_SAMPLE))
        if size > 2 * _SAMPLE:
            handle.seek(size - _SAMPLE)
        digest.update(handle.read())
    return digest.hexdigest()


def write_manifest(folder: Path) -> Path:
    """Write ``folder/manifest.json`` listing every other file's size and hashes; call it last.

    Written through a temporary and renamed, so a manifest is either whole or absent.
    """
    entries = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        size = path.stat().st_size
        entries[path.relative_to(folder).as_posix()] = {
            "size": size, "sha256": sha256_of(path), "ends_sha256": _ends_hash(path, size),
        }
    target = folder / MANIFEST
    tmp = temporary_name(target)
    tmp.write_text(json.dumps({"files": entries}, indent=1))
    os.replace(tmp, target)
    return target


def check_manifest(folder: Path, *, full: bool = False) -> str | None:
    """Why ``folder`` is not a whole cache entry, or None when it is.

    Every file listed must exist with its size and the hash of its ends (``full=True``: the
    hash of the whole file). Files not listed are ignored.
    """
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        entries = manifest["files"]
    except FileNotFoundError:
        return f"{folder} has no {MANIFEST} (an interrupted or older write)"
    except (ValueError, KeyError, TypeError):
        return f"{folder / MANIFEST} is unreadable"
    for name, entry in entries.items():
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        size = path.stat().st_size
        if size != entry["size"]:
            return f"{path} has {size} bytes where {entry['size']} were written"
        if full and sha256_of(path) != entry["sha256"]:
            return f"{path} does not match its SHA-256"
        if not full and _ends_hash(path, size) != entry["ends_sha256"]:
            return f"{path} does not match its SHA-256 (first and last MiB)"
    return None


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an ``flock`` on ``path`` (created if needed) for the block.

    The kernel releases it when the holder dies, so unlike a lock *file* it never goes stale.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def clear_stale_build_lock(build_dir: Path) -> bool:
    """Remove PyTorch's ``lock`` file in a kernel's build folder; call it holding
    :func:`exclusive_lock` on ``build_dir / "lookahead.lock"``.

    PyTorch's extension builder marks a build in progress with a plain ``lock`` file and waits,
    forever, for it to go. A build killed half-way (Ctrl-C during the first compile) leaves it.
    Every build of ours runs under our ``flock``, so while we hold it, a ``lock`` file is such a
    leftover. Returns whether one was removed.
    """
    lock = build_dir / "lock"
    if not lock.exists():
        return False
    logger.warning("removing %s, left by a kernel build that was killed; rebuilding", lock)
    lock.unlink(missing_ok=True)
    return True
