"""A Hugging Face hub cache laid out in a test's folder, and huggingface_hub pointed at it.

A plain helper module (as ``tiny.py``): ``from hub_cache import add_repo, use_hub_cache``.

``add_repo(cache, "owner/repo", {"file.gguf": path_or_bytes})`` writes
``models--owner--repo/{blobs,refs/main,snapshots/<commit>/...}`` as huggingface_hub does;
``use_hub_cache(monkeypatch, cache)`` points huggingface_hub at ``cache`` with its offline
mode on, so that nothing touches the network.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def add_repo(cache: Path, repo_id: str, files: dict[str, Path | bytes]) -> Path:
    """Lay out ``repo_id``'s snapshot in ``cache``: each file a link to a blob named by its
    hash, refs/main naming the commit. Returns the snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    for name, content in files.items():
        data = content.read_bytes() if isinstance(content, Path) else content
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../" * (name.count("/") + 2)) / "blobs" / blob.name)
    return snapshot


def use_hub_cache(monkeypatch, cache: Path) -> Path:
    """Point huggingface_hub at ``cache``, offline: the environment for child processes, and
    its constants, which it reads once when it is imported."""
    import huggingface_hub.constants

    cache.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache
