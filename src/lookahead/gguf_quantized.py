"""Build a transformers model from a GGUF file with its linear layers left quantized.

The usual GGUF path (``lookahead.models``) de-quantises every tensor into float weights. Here
the model is built empty (parameters on the meta device) and filled from the memory-mapped
file instead:

* every ``nn.Linear`` whose weight the file holds becomes ``linear_factory(raw, qtype,
  in_features, bias)``, where ``raw`` is the tensor's rows as stored (``uint8 [out_features,
  row_bytes]``, a view of the mapped file, never de-quantised here);
* the token embedding becomes a :class:`QuantEmbedding`, which de-quantises only the rows
  a forward pass looks up; a model with a tied output layer (no ``output.weight`` in the
  file) gets its ``lm_head`` from the same raw rows, so no float copy of the vocabulary
  table exists;
* everything else (norms, biases) is de-quantised into ``dtype``: a few kilobytes a layer.

Llama GGUFs store the q/k projection rows interleaved for llama.cpp's rotary embedding;
transformers un-permutes them (``LlamaTensorProcessor``). A quantized block runs along a row
(the input dimension), so the same permutation applies to the raw rows unchanged.

Reading the file's tensor table takes milliseconds (:func:`read_gguf`); building the
config and, above all, the tokenizer from the GGUF metadata takes tens of seconds for a
150k-token vocabulary, so both are saved once into ``meta_cache`` and read from there later.

Example::

    model, tokenizer = load_gguf_quantized(path, DequantisingLinear, torch.bfloat16,
                                           meta_cache=Path("~/.cache/x").expanduser())
"""

from __future__ import annotations

import logging
import mmap
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

logger = logging.getLogger(__name__)

# (raw uint8 [out, row_bytes], ggml type, in_features, bias [out] or None) -> a module mapping
# [..., in_features] to [..., out_features].
LinearFactory = Callable[[torch.Tensor, int, int, "torch.Tensor | None"], nn.Module]

_MAGIC = b"GGUF"
# Byte widths of the GGUF metadata value types (8 string and 9 array are read apart).
_SCALAR_WIDTH = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_SCALAR_FORMAT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                  11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# Rows of a matrix de-quantised at a time (by DequantisingLinear): bounds its float copy.
_CHUNK_ELEMENTS = 1 << 22


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
    """

    def __init__(self, raw: torch.Tensor, qtype: int, dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        if raw.dtype != torch.uint8 or raw.dim() != 2:
            raise ValueError(f"raw must be uint8 [rows, row_bytes], got {raw.dtype} "
                             f"{list(raw.shape)}")
        self.register_buffer("raw", raw, persistent=False)
        self.qtype = int(qtype)
        self.num_embeddings, self.embedding_dim = raw.shape[0], int(dim)
        self.dtype = dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        flat = input_ids.reshape(-1).to(torch.long).cpu()
        rows = _raw_to_float(self.raw.index_select(0, flat), self.qtype, self.embedding_dim)
        rows = rows.to(device=input_ids.device, dtype=self.dtype)
        return rows.reshape(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        name = GGMLQuantizationType(self.qtype).name
        return f"{self.num_embeddings}, {self.embedding_dim}, {name}, dtype={self.dtype}"


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


# ----------------------------------------------------------------------------- the loader


def load_gguf_quantized(
    gguf_path: str | os.PathLike[str],
    linear_factory: LinearFactory,
    dtype: torch.dtype = torch.bfloat16,
    *,
    meta_cache: str | os.PathLike[str] | None = None,
    eos_token_ids: tuple[int, ...] = (),
    supported_qtypes: Collection[int] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM (eval mode) and its tokenizer from a GGUF file, linear layers quantized.

    Args:
        gguf_path: the ``.gguf`` file.
        linear_factory: ``(raw uint8 [out, row_bytes], qtype, in_features, bias [out] | None)
            -> module`` for each linear layer (``raw`` is a view of the mapped file: keep it,
            or copy what you need from it).
        dtype: the compute dtype: of the embeddings, norms and biases.
        meta_cache: a folder to keep the config and tokenizer in (they take tens of seconds
            to build from the GGUF metadata); None builds them every time.
        eos_token_ids: end-of-sequence ids for the generation config; empty keeps the file's.
        supported_qtypes: the ggml types ``linear_factory`` takes; a linear of another type
            becomes an ``nn.Linear`` de-quantised into ``dtype``. None: every type.

    Raises:
        FileNotFoundError: no file at ``gguf_path``.
        ValueError: not a GGUF file, or tensors this loader cannot place.
    """
    started = time.perf_counter()
    path = Path(gguf_path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"gguf_path: no such file: {path}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    gguf = read_gguf(path)
    config, tokenizer = _config_and_tokenizer(path, meta_cache)
    model = _empty_model(config, dtype)
    if eos_token_ids:
        model.generation_config.eos_token_id = list(eos_token_ids)
    _fill(model, gguf, linear_factory, dtype, supported_qtypes)
    # Named by the file, not by the folder its config came from (the meta cache).
    model.name_or_path = model.config.name_or_path = str(path)
    model.eval()
    logger.info("loaded %s with quantized linears in %.2f s", path, time.perf_counter() - started)
    return model, tokenizer


def _config_and_tokenizer(path: Path, meta_cache) -> tuple[object, PreTrainedTokenizerBase]:
    """The config and tokenizer the GGUF metadata describes, from ``meta_cache`` if saved."""
    folder = Path(meta_cache).expanduser() if meta_cache is not None else None
    if folder is not None and (folder / "config.json").is_file():
        return AutoConfig.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    started = time.perf_counter()
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    logger.info("read the config and tokenizer of %s in %.1f s", path,
                time.perf_counter() - started)
    if folder is not None:
        _save_meta(config, tokenizer, folder)
    return config, tokenizer


def _save_meta(config, tokenizer: PreTrainedTokenizerBase, folder: Path) -> None:
    """Write config and tokenizer to a temporary sibling of ``folder``, then rename it into
    place, so that an interrupted write leaves no half-written folder (config.json marks a
    whole one); a folder another process finished first is kept."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    try:
        tokenizer.save_pretrained(tmp)
        config.save_pretrained(tmp)  # config.json last: it marks the folder complete
        if folder.exists() and not (folder / "config.json").is_file():
            shutil.rmtree(folder)
        try:
            os.replace(tmp, folder)
        except OSError:
            if not (folder / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _empty_model(config, dtype: torch.dtype) -> PreTrainedModel:
    """The model with its parameters on the meta device (no memory) and its buffers (the
    rotary frequencies) computed as usual on the CPU."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config = GenerationConfig.from_model_config(config)
    return model


@dataclass
class _Placed:
    """Where the file's tensors go: linear weights and biases by module path, the embedding."""

    weights: dict[str, GgufTensor]
    biases: dict[str, torch.Tensor]
    embedding: tuple[str, GgufTensor] | None = None


def _fill(model: PreTrainedModel, gguf: GgufFile, linear_factory: LinearFactory,
          dtype: torch.dtype, supported_qtypes: Collection[int] | None) -> None:
    """Put every tensor of ``gguf`` into ``model``: linears from ``linear_factory``, the
    embedding as a :class:`QuantEmbedding`, the rest de-quantised into ``dtype``."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    processor = TENSOR_PROCESSORS.get(gguf.architecture, TensorProcessor)(
        config=model.config.to_dict())
    name_map = _name_map(model, processor, gguf.architecture)
    context = dict(tensor_key_mapping=name_map, parsed_parameters={"config": {}, "tensors": {}})
    placed = _Placed({}, {})
    for name, tensor in gguf.tensors.items():
        target = name_map.get(name)
        if target is None:
            logger.debug("%s: no parameter of the model takes it; skipped", name)
            continue
        module_path, _, attribute = target.rpartition(".")
        module = model.get_submodule(module_path)
        if isinstance(module, nn.Linear) and attribute == "weight":
            placed.weights[module_path] = _permuted(processor, tensor, context)
        elif module is model.get_input_embeddings() and attribute == "weight":
            placed.embedding = (module_path, _permuted(processor, tensor, context))
        else:
            value = _dense(processor, tensor, context, dtype)
            if isinstance(module, nn.Linear) and attribute == "bias":
                placed.biases[module_path] = value
            else:
                _set_tensor(module, attribute, value, target)
    _place_embedding(model, placed, dtype)
    for module_path, tensor in placed.weights.items():
        linear = _make_linear(tensor, placed.biases.get(module_path), linear_factory, dtype,
                              supported_qtypes)
        _replace(model, module_path, linear)
    _place_tied_output(model, placed, linear_factory, dtype, supported_qtypes)
    _check_nothing_on_meta(model, gguf.path)
    model.requires_grad_(False)


def _name_map(model: PreTrainedModel, processor, architecture: str) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, as transformers'
    ``get_gguf_hf_weights_map`` gives it. That function builds gguf's name table once per
    submodule (16 s for SmolLM2's 397); this builds it once, and tries each parameter name
    whole, then without its leading parts, as that function's walk over submodules does."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next((key for key, value in MODEL_ARCH_NAMES.items() if value == architecture), None)
    if arch is None:
        raise ValueError(f"the GGUF architecture {architecture!r} is unknown to the gguf package")
    table = get_tensor_name_map(arch, model.config.num_hidden_layers)
    names = [processor.preprocess_name(name) for name in model.state_dict()]
    mapping: dict[str, str] = {}
    for strip in range(max((name.count(".") for name in names), default=0)):
        for name in names:
            stem, dot, suffix = name.rpartition(".")
            if suffix not in ("weight", "bias"):
                stem, dot, suffix = name, "", ""
            parts = stem.split(".")
            if strip >= len(parts):
                continue
            gguf_name = table.get_name(".".join(parts[strip:]))
            if gguf_name is not None:
                mapping.setdefault(gguf_name + dot + suffix, name)
    return mapping


def _permuted(processor, tensor: GgufTensor, context: dict) -> GgufTensor:
    """``tensor`` with its rows reordered as transformers' processor reorders the
    de-quantised matrix (the Llama q/k un-interleaving), found by processing the row indices;
    a processor that does anything but reorder rows is refused."""
    rows = tensor.data.shape[0]
    if len(tensor.shape) != 2 or rows != tensor.shape[0]:
        raise ValueError(f"{tensor.name}: expected a matrix, got shape {tensor.shape}")
    probe = processor.process(weights=np.arange(rows, dtype=np.int64).reshape(rows, 1),
                              name=tensor.name, **context)
    order = np.asarray(probe.weights).reshape(-1)
    if probe.name != tensor.name or order.shape != (rows,) or not np.array_equal(
            np.sort(order), np.arange(rows)):
        raise ValueError(f"{tensor.name}: transformers transforms this tensor in a way other "
                         "than reordering its rows; it cannot be kept quantized")
    if np.array_equal(order, np.arange(rows)):
        return tensor
    return GgufTensor(tensor.name, tensor.qtype, tensor.shape, tensor.data[order])


def _dense(processor, tensor: GgufTensor, context: dict, dtype: torch.dtype) -> torch.Tensor:
    """A small tensor (norm, bias) de-quantised and processed as transformers does."""
    result = processor.process(weights=tensor.dequantised(), name=tensor.name, **context)
    return torch.from_numpy(np.ascontiguousarray(result.weights)).to(dtype)


def _set_tensor(module: nn.Module, attribute: str, value: torch.Tensor, target: str) -> None:
    current = getattr(module, attribute, None)
    if not isinstance(current, torch.Tensor) or tuple(current.shape) != tuple(value.shape):
        shape = None if current is None else tuple(current.shape)
        raise ValueError(f"{target}: the file gives shape {tuple(value.shape)}, the model "
                         f"expects {shape}")
    if attribute in module._parameters:
        module._parameters[attribute] = nn.Parameter(value, requires_grad=False)
    else:
        module._buffers[attribute] = value


def _raw(tensor: GgufTensor) -> torch.Tensor:
    return torch.from_numpy(tensor.data)


def _make_linear(tensor: GgufTensor, bias: torch.Tensor | None, linear_factory: LinearFactory,
                 dtype: torch.dtype, supported_qtypes: Collection[int] | None) -> nn.Module:
    out_features, in_features = tensor.shape
    if supported_qtypes is None or tensor.qtype in supported_qtypes:
        return linear_factory(_raw(tensor), tensor.qtype, in_features, bias)
    linear = nn.Linear(in_features, out_features, bias=bias is not None, dtype=dtype)
    linear.weight = nn.Parameter(torch.from_numpy(tensor.dequantised()).to(dtype),
                                 requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias, requires_grad=False)
    return linear


def _place_embedding(model: PreTrainedModel, placed: _Placed, dtype: torch.dtype) -> None:
    if placed.embedding is None:
        raise ValueError("the GGUF file holds no token embedding for the model")
    module_path, tensor = placed.embedding
    _replace(model, module_path, QuantEmbedding(_raw(tensor), tensor.qtype, tensor.shape[1],
                                                dtype))


def _place_tied_output(model: PreTrainedModel, placed: _Placed, linear_factory: LinearFactory,
                       dtype: torch.dtype, supported_qtypes: Collection[int] | None) -> None:
    """A model whose output layer is the embedding (no ``output.weight`` in the file) gets a
    linear on the embedding's raw rows: the same bytes, not a copy."""
    output = model.get_output_embeddings()
    if not isinstance(output, nn.Linear) or output.weight.device.type != "meta":
        return
    if not getattr(model.config, "tie_word_embeddings", False) or placed.embedding is None:
        raise ValueError("the GGUF file has no output layer and the model ties none")
    _, tensor = placed.embedding
    model.set_output_embeddings(_make_linear(tensor, None, linear_factory, dtype,
                                             supported_qtypes))


def _replace(model: nn.Module, module_path: str, new: nn.Module) -> None:
    parent_path, _, child = module_path.rpartition(".")
    setattr(model.get_submodule(parent_path), child, new)


def _check_nothing_on_meta(model: nn.Module, path: Path) -> None:
    missing = [name for name, tensor in (*model.named_parameters(), *model.named_buffers())
               if tensor.device.type == "meta"]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5
                                          else "")
        raise ValueError(f"{path} holds no tensor for {shown}")
