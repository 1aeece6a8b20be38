"""GGUF tensors as stored: the file's tensor table, and modules that work on raw rows.

:func:`read_gguf` maps a GGUF file and lists its tensors without parsing the metadata (a
150k-token vocabulary takes ``gguf.GGUFReader`` 20 s; this, a tenth of a second). Each
tensor's data is ``uint8 [rows, row_bytes]``: a row of a matrix is a run of quantization
blocks along the input dimension, so rows can be picked and reordered without de-quantising.

:class:`QuantEmbedding` de-quantises the rows a lookup needs; :class:`DequantisingLinear` is
a linear layer that de-quantises its rows at each call (the reference and fallback for a
quantized linear kernel).
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize
from torch import nn

_MAGIC = b"GGUF"
# Byte widths of the GGUF metadata value types (8 string and 9 array are read apart).
_SCALAR_WIDTH = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_SCALAR_FORMAT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                  11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# Rows of a matrix de-quantised at a time (by DequantisingLinear): bounds its float copy.
_CHUNK_ELEMENTS = 1 << 20


# ----------------------------------------------------------------------------- the tensor table


@dataclass(frozen=True)
class GgufTensor:
    """One tensor of a GGUF file.

    Attributes:
        name: the GGUF name, e.g. ``"blk.0.attn_q.weight"``.
        qtype: its ``gguf.GGMLQuantizationType`` value (0 F32, 1 F16, 2 Q4_0, 8 Q8_0, 12 Q4_K...).
        shape: the de-quantised shape in torch order, e.g. ``(out_features, in_features)``.
        data: ``uint8 [rows, row_bytes]``, the stored bytes of each row (a view of the mapped
            file; for a 1-D tensor one row).
    """

    name: str
    qtype: int
    shape: tuple[int, ...]
    data: np.ndarray

    def dequantised(self) -> np.ndarray:
        """The values as float32, in ``shape``."""
        return dequantize(self.data, GGMLQuantizationType(self.qtype)).reshape(self.shape)


@dataclass(frozen=True)
class GgufFile:
    """A GGUF file's architecture (``general.architecture``, e.g. ``"llama"``) and tensors."""

    path: Path
    architecture: str
    tensors: dict[str, GgufTensor]


def read_gguf(path: str | os.PathLike[str]) -> GgufFile:
    """The architecture and every tensor of the GGUF file at ``path``, reading no tensor data.

    The metadata is skipped rather than parsed (``gguf.GGUFReader`` parses every token string
    of the vocabulary and takes 20 s for a 150k-token one), so this takes a fraction of a
    second. The file is mapped copy-on-write: the arrays are writable (as torch wants) and the
    pages stay shared with the page cache until something writes to them, which nothing here
    does.
    """
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as m:
        architecture, table, start = _read_header(m, path)
    blob = np.memmap(path, dtype=np.uint8, mode="c")
    tensors = {name: GgufTensor(name, qtype, shape, _rows(blob, start + offset, qtype, shape, path))
               for name, qtype, shape, offset in table}
    return GgufFile(Path(path), architecture, tensors)


def _read_header(blob: mmap.mmap, path) -> tuple[str, list[tuple], int]:
    """(architecture, [(name, qtype, shape, offset)], where the tensor data starts)."""
    if len(blob) < 24 or blob[:4] != _MAGIC:
        raise ValueError(f"{path} is not a GGUF file (starts with {blob[:4]!r})")
    version, tensor_count, kv_count = struct.unpack_from("<IQQ", blob, 4)
    if version < 2:
        raise ValueError(f"{path}: GGUF version {version} is not supported (2 or later)")
    pos, scalars = 24, {}
    for _ in range(kv_count):
        key, pos = _read_string(blob, pos)
        (value_type,) = struct.unpack_from("<I", blob, pos)
        scalars[key], pos = _read_value(blob, pos + 4, value_type)
    table = []
    for _ in range(tensor_count):
        name, pos = _read_string(blob, pos)
        (dims,) = struct.unpack_from("<I", blob, pos)
        shape = struct.unpack_from(f"<{dims}Q", blob, pos + 4)
        qtype, offset = struct.unpack_from("<IQ", blob, pos + 4 + 8 * dims)
        pos += 4 + 8 * dims + 12
        table.append((name, qtype, tuple(reversed(shape)), offset))  # ggml lists dims inner first
    alignment = int(scalars.get("general.alignment") or 32)
    start = (pos + alignment - 1) // alignment * alignment
    return str(scalars.get("general.architecture", "")), table, start


def _rows(blob: np.ndarray, start: int, qtype: int, shape: tuple[int, ...], path) -> np.ndarray:
    """The bytes of a tensor as ``uint8 [rows, row_bytes]``."""
    if qtype not in GGML_QUANT_SIZES:
        raise ValueError(f"{path} holds a tensor of unknown ggml type {qtype}")
    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    columns = shape[-1]
    if columns % block:
        raise ValueError(f"{path}: a row of {columns} values is not whole {block}-value blocks")
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    row_bytes = columns // block * block_bytes
    return blob[start:start + rows * row_bytes].reshape(rows, row_bytes)


def _read_string(blob: mmap.mmap, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", blob, pos)
    return blob[pos + 8:pos + 8 + length].decode("utf-8", "replace"), pos + 8 + length


def _skip_strings(blob: mmap.mmap, pos: int, count: int) -> int:
    """The position after ``count`` strings (a vocabulary: read only their lengths)."""
    unpack = struct.Struct("<Q").unpack_from
    for _ in range(count):
        pos += 8 + unpack(blob, pos)[0]
    return pos


def _read_value(blob: mmap.mmap, pos: int, value_type: int) -> tuple[object, int]:
    """A metadata value and the position after it; an array is skipped (returned as None)."""
    if value_type == _STRING:
        return _read_string(blob, pos)
    if value_type == _ARRAY:
        element_type, count = struct.unpack_from("<IQ", blob, pos)
        pos += 12
        if element_type in _SCALAR_WIDTH:
            return None, pos + count * _SCALAR_WIDTH[element_type]
        if element_type == _STRING:
            return None, _skip_strings(blob, pos, count)
        for _ in range(count):
            _, pos = _read_value(blob, pos, element_type)
        return None, pos
    if value_type not in _SCALAR_WIDTH:
        raise ValueError(f"GGUF metadata value of unknown type {value_type} at byte {pos}")
    (value,) = struct.unpack_from("<" + _SCALAR_FORMAT[value_type], blob, pos)
    return value, pos + _SCALAR_WIDTH[value_type]


# ----------------------------------------------------------------------------- modules


def _raw_to_float(raw: torch.Tensor, qtype: int, columns: int) -> torch.Tensor:
    """De-quantise rows: ``uint8 [n, row_bytes]`` -> ``float32 [n, columns]``."""
    values = dequantize(raw.numpy(), GGMLQuantizationType(qtype))
    return torch.from_numpy(values.reshape(raw.shape[0], columns))


class QuantEmbedding(nn.Module):
    """A token embedding kept in its GGUF rows: a lookup de-quantises only the rows it needs.

    ``raw``: ``uint8 [vocab, row_bytes]``; ``qtype``: the ggml type; ``dim``: values a row;
    ``dtype``: the dtype of the embeddings returned. A lookup of ``ids [...]`` returns
    ``[..., dim]``. The raw rows can be shared with a tied output layer.

    The last ``cached_rows`` rows looked up stay de-quantised (float32; 6 KB a row of 1536):
    gguf's numpy de-quantisation cost about 0.35 ms a decoding step of the 1.5B model, where
    a text's tokens repeat. 0 keeps none.
    """

    def __init__(self, raw: torch.Tensor, qtype: int, dim: int, dtype: torch.dtype,
                 cached_rows: int = 2048, scale: torch.Tensor | float | None = None) -> None:
        super().__init__()
        # A factor every row is multiplied by (Gemma's sqrt(hidden size)); None: none.
        self.scale = None if scale is None else float(torch.as_tensor(scale).float())
        if raw.dtype != torch.uint8 or raw.dim() != 2:
            raise ValueError(f"raw must be uint8 [rows, row_bytes], got {raw.dtype} "
                             f"{list(raw.shape)}")
        if isinstance(cached_rows, bool) or not isinstance(cached_rows, int) or cached_rows < 0:
            raise ValueError(f"cached_rows must be an int >= 0, got {cached_rows!r}")
        self.register_buffer("raw", raw, persistent=False)
        self.qtype = int(qtype)
        self.num_embeddings, self.embedding_dim = raw.shape[0], int(dim)
        self.dtype = dtype
        self.cached_rows = cached_rows
        self._rows: OrderedDict[int, torch.Tensor] = OrderedDict()  # id -> float32 [dim]
        self._lock = threading.Lock()  # a server's threads may share the model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids.reshape(-1).to(torch.long).cpu().tolist()
        with self._lock:
            rows = torch.stack(self._lookup(ids)) if ids else torch.empty(0, self.embedding_dim)
        rows = rows.to(device=input_ids.device, dtype=self.dtype)
        if self.scale is not None:  # in the embedding's dtype, as transformers scales it
            rows = rows * torch.tensor(self.scale, dtype=self.dtype)
        return rows.reshape(*input_ids.shape, self.embedding_dim)

    def _lookup(self, ids: list[int]) -> list[torch.Tensor]:
        """The float32 rows [dim] of ``ids``, de-quantising those not kept."""
        missing = [token for token in dict.fromkeys(ids) if token not in self._rows]
        fresh = {}
        if missing:
            # Indexing, not index_select: for a few rows of this wide uint8 table index_select
            # took about 320 us a call against 9 (torch 2.13, 2 threads).
            values = _raw_to_float(self.raw[torch.tensor(missing)], self.qtype,
                                   self.embedding_dim)
            fresh = dict(zip(missing, values))
        rows = [fresh[token] if token in fresh else self._rows[token] for token in ids]
        if self.cached_rows:
            for token, row in fresh.items():
                self._rows[token] = row.clone()  # not a view that keeps the whole batch
            for token in ids:
                self._rows.move_to_end(token)
            while len(self._rows) > self.cached_rows:
                self._rows.popitem(last=False)
        return rows

    def __getstate__(self) -> dict:  # copy.deepcopy and pickle: a lock is not copied
        return {key: value for key, value in self.__dict__.items() if key != "_lock"}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._lock = threading.Lock()

    def extra_repr(self) -> str:
        name = GGMLQuantizationType(self.qtype).name
        return (f"{self.num_embeddings}, {self.embedding_dim}, {name}, dtype={self.dtype}, "
                f"cached_rows={self.cached_rows}")


class DequantisingLinear(nn.Module):
    """A linear layer on GGUF rows that de-quantises them at every call, a few rows at a time.

    The reference (and fallback) ``linear_factory``: slow, but exact to the file and small in
    memory (no float copy of the whole matrix exists). ``raw``: ``uint8 [out, row_bytes]``;
    ``bias``: ``[out]`` or None. ``forward``: ``[..., in_features]`` -> ``[..., out]``, summed
    in the input's dtype as ``nn.Linear`` would.
    """

    def __init__(self, raw: torch.Tensor, qtype: int, in_features: int,
                 bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.register_buffer("raw", raw, persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        self.qtype = int(qtype)
        self.in_features, self.out_features = int(in_features), raw.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        step = max(1, _CHUNK_ELEMENTS // self.in_features)
        parts = []
        for start in range(0, self.out_features, step):
            weight = _raw_to_float(self.raw[start:start + step], self.qtype, self.in_features)
            bias = None if self.bias is None else self.bias[start:start + step].to(x.dtype)
            parts.append(nn.functional.linear(x, weight.to(device=x.device, dtype=x.dtype), bias))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def extra_repr(self) -> str:
        name = GGMLQuantizationType(self.qtype).name
        return f"in_features={self.in_features}, out_features={self.out_features}, {name}"
