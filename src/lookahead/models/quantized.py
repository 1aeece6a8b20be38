"""GGUF models on the quantized path: linear layers kept as GGUF blocks (``QuantLinear``).

This is what :func:`lookahead.models.load.load_model` does for a GGUF model (a bundled name
or a ``.gguf`` path) on the CPU unless told to de-quantise: the linear layers keep the file's
4-8 bit blocks and run on the integer kernel of :mod:`lookahead.kernels.quant_linear`, so a
1.5B Q4_K_M model reads about 0.75 GiB of weights a token where bfloat16 reads 3.1 GB; the
norms, the embedding rows looked up and the attention run in ``dtype`` (float32 by default).

Building a ``QuantLinear`` repacks the file's blocks for the kernel (about half a minute for
a 1.5B model, in numpy). The packed records are saved once per file under
``<cache_dir>/models/<key>/quantized/`` with a manifest (:mod:`lookahead.cache_files`), in
the order the loader builds the layers, each with its type and shape; a later load reads
them back instead (a few seconds), and a cache that does not match is rebuilt with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import BinaryIO

import torch
from safetensors.torch import save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lookahead import cache_files
from lookahead.kernels.huge_pages import Arena
from lookahead.kernels.quant_linear import QuantLinear, supported_qtypes
from lookahead.models.gguf_quantized import load_quantized_model

logger = logging.getLogger(__name__)

_RECORDS, _LAYOUT = "records.safetensors", "layout.json"


class _Recording:
    """A linear factory that builds ``QuantLinear`` layers and remembers, in call order,
    each one's records and (qtype, in_features, out_features)."""

    def __init__(self) -> None:
        self.layers: list[QuantLinear] = []

    def __call__(self, raw, qtype, in_features, bias) -> QuantLinear:
        layer = QuantLinear(raw, qtype, in_features, bias)
        self.layers.append(layer)
        return layer


class _Replaying:
    """A linear factory that takes each layer's records from a saved cache, in call order,
    into one huge-page arena; a layer whose type or shape differs from the saved one raises
    ``_StaleCache``.

    The records are read from the file into the arena, not mapped: a mapped file counts in
    the process's resident memory while it is open, and with the arena beside it a 1.5B model
    peaked at 2.4 GB instead of 1.5.
    """

    def __init__(self, file: BinaryIO, layout: list[list[int]]) -> None:
        self.file, self.layout, self.calls = file, layout, 0
        self.entries, self.data_start = _safetensors_header(file)
        self.arena = Arena(Arena.size_of((entry["shape"], torch.uint8)
                                         for entry in self.entries.values()))

    def __call__(self, raw, qtype, in_features, bias) -> QuantLinear:
        index = self.calls
        self.calls += 1
        shape = [int(qtype), int(in_features), int(raw.shape[0])]
        entry = self.entries.get(f"{index:04d}")
        if index >= len(self.layout) or self.layout[index] != shape or entry is None:
            raise _StaleCache(f"layer {index} is {shape}, the cache holds another")
        begin, end = entry["data_offsets"]
        records = self.arena.place(end - begin)
        self.file.seek(self.data_start + begin)
        if self.file.readinto(records.numpy()) != end - begin:
            raise _StaleCache(f"layer {index}'s records are cut short")
        return QuantLinear(raw, qtype, in_features, bias,
                           records=records.view(entry["shape"]))


def _safetensors_header(file: BinaryIO) -> tuple[dict, int]:
    """A safetensors file's tensors ({name: {"dtype", "shape", "data_offsets"}}) and where
    their data starts: the format is an 8-byte little-endian header length, the JSON header,
    then the data."""
    length = int.from_bytes(file.read(8), "little")
    header = json.loads(file.read(length))
    header.pop("__metadata__", None)
    if any(entry.get("dtype") != "U8" for entry in header.values()):
        raise _StaleCache("the cache holds records that are not uint8")
    return header, 8 + length


class _StaleCache(Exception):
    pass


def load_quantized(name_or_path: str | os.PathLike[str], dtype: torch.dtype, root: Path,
                   key: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A bundled name or ``.gguf`` path with ``QuantLinear`` layers (records cached under
    ``root/models/key/quantized``); ``dtype``: the compute dtype of everything else."""
    folder = root / "models" / key / "quantized"
    if folder.is_dir() and cache_files.check_manifest(folder) is None:
        layout = json.loads((folder / _LAYOUT).read_text())
        try:
            with open(folder / _RECORDS, "rb") as records:
                replay = _Replaying(records, layout)
                model, tokenizer = _load(name_or_path, replay, dtype, root)
            if replay.calls == len(replay.layout):
                return model, tokenizer
            problem = f"the model has {replay.calls} layers, the cache {len(replay.layout)}"
        except _StaleCache as error:
            problem = str(error)
        logger.warning("the packed weights in %s do not match the model (%s); packing again",
                       folder, problem)
    elif folder.exists():
        logger.warning("the packed weights in %s are incomplete (%s); packing again",
                       folder, cache_files.check_manifest(folder))
    recording = _Recording()
    model, tokenizer = _load(name_or_path, recording, dtype, root)
    _write_cache(folder, recording.layers)
    _move_to_arena(recording.layers)
    return model, tokenizer


def _move_to_arena(layers: list[QuantLinear]) -> None:
    """Move the layers' records into one huge-page arena, one layer at a time (each old copy
    is freed as its layer lets go of it)."""
    arena = Arena(Arena.size_of((layer.records.shape, layer.records.dtype) for layer in layers))
    for layer in layers:
        layer.records = arena.take(layer.records)


def _load(name_or_path, factory, dtype, root):
    return load_quantized_model(name_or_path, factory, dtype, cache_dir=root,
                                supported_qtypes=supported_qtypes())


def _write_cache(folder: Path, layers: list[QuantLinear]) -> None:
    """Save the layers' records and layout into ``folder``: a temporary first, the manifest
    last, then renamed into place."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    cache_files.remove_stale_temporaries(folder.parent)
    tmp = cache_files.temporary_name(folder)
    tmp.mkdir()
    try:
        save_file({f"{i:04d}": layer.records for i, layer in enumerate(layers)}, tmp / _RECORDS)
        layout = [[layer.qtype, layer.in_features, layer.out_features] for layer in layers]
        (tmp / _LAYOUT).write_text(json.dumps(layout))
        cache_files.write_manifest(tmp)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except OSError as error:  # a read-only or full cache: the model is loaded all the same
        logger.warning("could not cache the packed weights in %s (%s)", folder, error)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
