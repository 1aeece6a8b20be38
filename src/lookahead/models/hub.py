"""GGUF files named by their Hugging Face hub repository, fetched through ``huggingface_hub``.

Three spellings name a GGUF file on the hub::

    owner/repo                  the repository's Q4_K_M file (a GGUF repository: .gguf files
                                and no transformers weights; else a transformers checkpoint)
    owner/repo:Q5_K_M           the file whose name carries that quantization tag (any case)
    owner/repo/sub/file.gguf    that file of the repository

The file is downloaded once into the hub's own cache (``HF_HUB_CACHE``, with its progress
bars) and read from there afterwards. Offline -- ``HF_HUB_OFFLINE=1``, which huggingface_hub
reads, or a hub that cannot be reached -- a file already in that cache is used; a missing one
is a :class:`ModelNotAvailableError` that says what to run. ``local_files_only=True`` looks in
the cache alone.

Example::

    found = resolve_hub_name(parse_hub_name("bartowski/SmolLM2-135M-Instruct-GGUF:Q8_0"))
    found.gguf   # Path(".../snapshots/<commit>/SmolLM2-135M-Instruct-Q8_0.gguf")
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from lookahead.models.registry import ModelNotAvailableError

logger = logging.getLogger(__name__)

DEFAULT_QUANT = "Q4_K_M"

# A hub name part: letters, digits, "-", "_", "."; a tag the same without "."; a file path in
# the repository ends in .gguf.
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_NAME = re.compile(rf"(?P<repo>{_PART}/{_PART})"
                   rf"(?::(?P<quant>[A-Za-z0-9][A-Za-z0-9_-]*)|/(?P<file>(?:{_PART}/)*{_PART}))?")
# Weights of a transformers checkpoint: a repository with them is loaded by transformers (a
# config.json alone does not count: some GGUF repositories carry one for reference).
_CHECKPOINT = re.compile(r"(\.safetensors|(^|/)pytorch_model[^/]*\.bin)$")
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)  # llama.cpp's split files
_SHOWN = 20  # files listed in an error message


@dataclass(frozen=True)
class HubName:
    """A GGUF named on the hub: ``repo_id``, with a quantization tag or a file path, or neither
    (the default tag, :data:`DEFAULT_QUANT`, in a GGUF repository)."""

    repo_id: str
    quant: str | None = None
    filename: str | None = None

    def __str__(self) -> str:
        if self.filename:
            return f"{self.repo_id}/{self.filename}"
        return f"{self.repo_id}:{self.quant}" if self.quant else self.repo_id


def parse_hub_name(text: str) -> HubName | None:
    """``owner/repo``, ``owner/repo:TAG`` or ``owner/repo/path/file.gguf`` as a HubName; None
    for anything else (a path that is not a .gguf file under a repository, a plain word)."""
    match = _NAME.fullmatch(text)
    if match is None or ".." in text:
        return None
    filename = match["file"]
    if filename is not None and not filename.lower().endswith(".gguf"):
        return None
    return HubName(match["repo"], match["quant"], filename)


@dataclass(frozen=True)
class HubModel:
    """What a hub name resolves to: ``gguf``, the local path of its GGUF file (in the hub
    cache), or None for a transformers checkpoint; ``local_files_only``: the hub could not be
    asked, so the checkpoint is read from the cache alone."""

    gguf: Path | None
    local_files_only: bool


def resolve_hub_name(name: HubName, *, local_files_only: bool = False) -> HubModel:
    """The GGUF file ``name`` names, downloaded into the hub cache first where it is not there
    yet (a bare id of a checkpoint repository resolves to ``gguf=None``).

    Raises:
        ValueError: no single file carries the tag (none, or several such as split files):
            the message lists the repository's .gguf files and how to pick one.
        ModelNotAvailableError: the file is neither on a reachable hub nor in the cache.
    """
    filename, offline = name.filename, local_files_only
    if filename is None:
        files, offline = _repo_files(name, local_files_only)
        filename = pick_gguf(name, files, from_cache=offline)
        if filename is None:
            return HubModel(None, offline)
    return HubModel(_download(name, filename, local_files_only=offline), offline)


def names_gguf(name: HubName, *, local_files_only: bool = False) -> bool:
    """Whether ``name`` names a GGUF file: a tag or a file path does; for a bare repository id
    the hub (else the cache) is asked for its files. Nothing is downloaded."""
    if name.quant or name.filename:
        return True
    try:
        files, from_cache = _repo_files(name, local_files_only)
        return pick_gguf(name, files, from_cache=from_cache) is not None
    except ValueError:  # .gguf files, but none picked: a GGUF repository all the same
        return True
    except ModelNotAvailableError:  # nowhere to be found: loading it will say so
        return False


def pick_gguf(name: HubName, files: list[str], *, from_cache: bool = False) -> str | None:
    """The file of ``files`` (paths in ``name.repo_id``) that ``name`` picks: the one .gguf
    whose path carries the tag; None for a bare id of a repository with checkpoint weights.
    ``from_cache``: ``files`` are those in the local cache (the message then says so)."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf"))
    if name.quant is None and (not ggufs or any(_CHECKPOINT.search(f) for f in files)):
        return None
    quant = name.quant or DEFAULT_QUANT
    # The tag as a whole word: Q4_K matches neither Q4_K_M nor IQ4_K.
    tag = re.compile(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9]|_[A-Za-z0-9])",
                     re.IGNORECASE)
    matches = [f for f in ggufs if tag.search(f)]
    if len(matches) == 1:
        return matches[0]
    raise ValueError(_ambiguity_message(name, quant, ggufs, matches, from_cache))


def _ambiguity_message(name: HubName, quant: str, ggufs: list[str], matches: list[str],
                       from_cache: bool) -> str:
    where = " in the local hub cache (only files downloaded before)" if from_cache else ""
    if not ggufs:
        return f"{name}: {name.repo_id} has no .gguf file{where}"
    found = f"several files carry {quant}" if matches else f"no .gguf file carries {quant}"
    shown = ", ".join(ggufs[:_SHOWN])
    if len(ggufs) > _SHOWN:
        shown += f" and {len(ggufs) - _SHOWN} more"
    if any(_SPLIT.search(f) for f in matches):
        found += (" (split files: merge them into one with llama.cpp's "
                  "`llama-gguf-split --merge`, then pass that file's path)")
    return (f"{name}: {found}. The .gguf files of {name.repo_id}{where}: {shown}. Pick one "
            f"with {name.repo_id}:TAG (e.g. {name.repo_id}:Q5_K_M) or {name.repo_id}/FILE.gguf")


def _repo_files(name: HubName, local_files_only: bool) -> tuple[list[str], bool]:
    """The repository's file paths, from the hub, else from the local cache; and whether they
    came from the cache (then only cached files may be loaded: the hub is not asked again)."""
    from huggingface_hub import list_repo_files

    problem = "local_files_only=True"
    if not local_files_only:
        try:
            return list_repo_files(name.repo_id), False
        except ValueError as error:  # HFValidationError: not a repository id
            raise ValueError(f"{name.repo_id!r} is not a hub repository id ({error})") from None
        # Offline mode, no network, an unknown or gated repository, the hub down: whatever it
        # is, a copy in the cache still serves, and without one the error below says it.
        except Exception as error:  # the hub's errors vary with its version and transport
            problem = f"{type(error).__name__}: {_first_line(error)}"
            logger.info("could not list %s on the hub (%s); looking in the local cache",
                        name.repo_id, problem)
    files = _cached_files(name.repo_id)
    if files is None:
        raise ModelNotAvailableError(_not_available(name, problem, None))
    return files, True


def _cached_files(repo_id: str) -> list[str] | None:
    """The files of ``repo_id``'s cached snapshot (the one ``main`` points to, else the
    latest) as paths in the repository; None when the cache holds no snapshot of it."""
    from huggingface_hub import constants, scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:  # the folder hf_hub_download reads (scan_cache_dir's default is fixed at its import)
        cache = scan_cache_dir(constants.HF_HUB_CACHE)
    except CacheNotFound:
        return None
    repos = [r for r in cache.repos if r.repo_id == repo_id and r.repo_type == "model"]
    revisions = [revision for repo in repos for revision in repo.revisions]
    if not revisions:
        return None
    main = [revision for revision in revisions if "main" in revision.refs]
    revision = (main or sorted(revisions, key=lambda r: r.last_modified))[-1]
    return sorted(str(f.file_path.relative_to(revision.snapshot_path)) for f in revision.files)


def _download(name: HubName, filename: str, *, local_files_only: bool) -> Path:
    """``hf_hub_download`` of one file (the hub's progress bar; from the cache offline)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    try:
        return Path(hf_hub_download(name.repo_id, filename, local_files_only=local_files_only))
    except LocalEntryNotFoundError as error:
        problem = "local_files_only=True" if local_files_only else _first_line(error)
        raise ModelNotAvailableError(_not_available(name, problem, filename)) from None
    except (EntryNotFoundError, RepositoryNotFoundError) as error:
        raise ModelNotAvailableError(
            f"{name}: the hub has no {filename} in {name.repo_id} ({_first_line(error)})"
        ) from None


def _not_available(name: HubName, problem: str, filename: str | None) -> str:
    download = f"hf download {name.repo_id}" + (f" {filename}" if filename else "")
    return (f"model {str(name)!r} is not in the local Hugging Face cache and the hub cannot be "
            f"asked ({problem}). Run once online, or download it first (`{download}`), or "
            "pass a local path (a .gguf file or a folder with a config.json)")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
