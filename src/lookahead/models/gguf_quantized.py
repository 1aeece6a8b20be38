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

import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from lookahead.models.gguf_tensors import (
    DequantisingLinear,
    GgufFile,
    GgufTensor,
    QuantEmbedding,
    read_gguf,
)

__all__ = ["DequantisingLinear", "LinearFactory", "QuantEmbedding", "load_gguf_quantized",
           "load_quantized_model", "read_gguf"]

logger = logging.getLogger(__name__)

# (raw uint8 [out, row_bytes], ggml type, in_features, bias [out] or None) -> a module mapping
# [..., in_features] to [..., out_features].
LinearFactory = Callable[[torch.Tensor, int, int, "torch.Tensor | None"], nn.Module]


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


def load_quantized_model(
    name_or_path: str | os.PathLike[str],
    linear_factory: LinearFactory,
    dtype: torch.dtype = torch.bfloat16,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    supported_qtypes: Collection[int] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """:func:`load_gguf_quantized` for a bundled model name (see ``lookahead.models``) or a
    ``.gguf`` path, its config and tokenizer cached under
    ``<cache_dir>/models/<name>/gguf-meta`` (``cache_dir``: default
    ``lookahead.models.default_cache_dir()``)."""
    from lookahead.models.gguf import find_gguf
    from lookahead.models.registry import (bundled_names, cache_root, get_model_spec,
                                           is_bundled)

    root = cache_root(cache_dir)
    name = os.fspath(name_or_path)
    bundled = is_bundled(name)
    if bundled:
        spec = get_model_spec(name)
        path, key, eos = find_gguf(spec, cache_dir=root), name, spec.eos_token_ids
    else:
        path, eos = Path(name).expanduser(), ()
        if path.suffix != ".gguf":
            raise ValueError(f"name_or_path must be a bundled model "
                             f"({bundled_names()}) or a .gguf file, got {name!r}")
        key = _file_key(path)
    model, tokenizer = load_gguf_quantized(
        path, linear_factory, dtype, meta_cache=root / "models" / key / "gguf-meta",
        eos_token_ids=eos, supported_qtypes=supported_qtypes)
    if bundled:
        model.name_or_path = name  # as lookahead.models names it: tuned profiles key on it
    return model, tokenizer


def _file_key(path: Path) -> str:
    """A cache folder name for a GGUF file: its stem and a hash of path, size and mtime, so a
    changed file gets a fresh entry."""
    if not path.is_file():
        raise FileNotFoundError(f"name_or_path: no such file: {path}")
    resolved = path.resolve()
    stat = resolved.stat()
    fingerprint = f"{resolved}|{stat.st_size}|{stat.st_mtime_ns}".encode()
    return f"{path.stem}-{hashlib.sha256(fingerprint).hexdigest()[:12]}"


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
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
    )

    processor = TENSOR_PROCESSORS.get(gguf.architecture, TensorProcessor)(
        config=model.config.to_dict())
    name_map = _name_map(model, processor, gguf.architecture)
    context = {"tensor_key_mapping": name_map,
               "parsed_parameters": {"config": {}, "tensors": {}}}
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
    tied = _place_tied_output(model, placed, linear_factory, dtype, supported_qtypes)
    _warn_dequantised([*placed.weights.values(), *tied], dtype, supported_qtypes)
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


def _warn_dequantised(weights: list[GgufTensor], dtype: torch.dtype,
                      supported_qtypes: Collection[int] | None) -> None:
    """One warning for the linears of types ``linear_factory`` does not take, which were
    de-quantised into float weights: several times the memory and the time a token."""
    if supported_qtypes is None:
        return
    left = Counter(GGMLQuantizationType(t.qtype).name for t in weights
                   if t.qtype not in supported_qtypes)
    if left:
        names = ", ".join(sorted(left))
        logger.warning("%d tensors of types %s de-quantised to %s (no integer kernel for "
                       "them)", sum(left.values()), names, str(dtype).removeprefix("torch."))


def _place_embedding(model: PreTrainedModel, placed: _Placed, dtype: torch.dtype) -> None:
    if placed.embedding is None:
        raise ValueError("the GGUF file holds no token embedding for the model")
    module_path, tensor = placed.embedding
    # Gemma's embedding multiplies its rows by sqrt(hidden size) (its ``embed_scale``).
    scale = getattr(model.get_submodule(module_path), "embed_scale", None)
    _replace(model, module_path, QuantEmbedding(_raw(tensor), tensor.qtype, tensor.shape[1],
                                                dtype, scale=scale))


def _place_tied_output(model: PreTrainedModel, placed: _Placed, linear_factory: LinearFactory,
                       dtype: torch.dtype, supported_qtypes: Collection[int] | None
                       ) -> list[GgufTensor]:
    """A model whose output layer is the embedding (no ``output.weight`` in the file) gets a
    linear on the embedding's raw rows: the same bytes, not a copy. Returns the tensor so
    placed ([] when the file has its own output layer)."""
    output = model.get_output_embeddings()
    if not isinstance(output, nn.Linear) or output.weight.device.type != "meta":
        return []
    if not getattr(model.config, "tie_word_embeddings", False) or placed.embedding is None:
        raise ValueError("the GGUF file has no output layer and the model ties none")
    _, tensor = placed.embedding
    model.set_output_embeddings(_make_linear(tensor, None, linear_factory, dtype,
                                             supported_qtypes))
    return [tensor]


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
