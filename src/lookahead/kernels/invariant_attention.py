"""Row-invariant attention: each query row computed alike whatever else is in the pass.

A pass of k tokens then gives, row by row, the bits of k passes of one token, and a row of a
batch the bits of the same sequence alone, provided the rest of the model is row-invariant
too. On the quantized path it is: the linears quantize and sum each row on its own
(``quant_linear``), and norms and activations work row by row. So there every method's greedy
text equals autoregressive decoding, and a server's greedy answer does not depend on the
requests beside it. PyTorch's attention is not row-invariant (``csrc/invariant_attention.cpp``
says why); this one is, at the cost of a plainer kernel.

``invariant_attention`` has transformers' attention-function signature and is added through
``AttentionInterface``; ``use_invariant_attention(model)`` switches a float32 model to it. What
it does not cover -- another dtype, dropout, a per-head mask, extra terms (soft-capping,
sinks, position bias) -- goes to ``grouped_attention.grouped_sdpa`` unchanged, and
``invariant_attention_problem`` says why a model cannot use it at all.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from types import ModuleType

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from lookahead.kernels.build import compile_kernel
from lookahead.kernels.grouped_attention import grouped_sdpa
from lookahead.kernels.quant_linear import ISA_FLAGS, QuantLinear, best_isa

logger = logging.getLogger(__name__)

ATTENTION_NAME = "lookahead_invariant"
SOURCE = Path(__file__).parent / "csrc" / "invariant_attention.cpp"
EXP_APPROX = Path(__file__).parent / "csrc" / "exp_approx.h"
# Keyword arguments that change what attention computes; with any of them set, fall back.
_EXTRA_TERMS = ("position_bias", "softcap", "s_aux", "sinks")


@functools.cache  # the build is per process anyway: a loaded extension stays imported
def load_attention_kernel(isa: str | None = None) -> ModuleType:
    """Compile (first time) or load ``csrc/invariant_attention.cpp``, in the AVX-512 or the
    AVX2 build (``isa``; None: :func:`quant_linear.best_isa`); both give the same bits, as
    every float operation in it is elementwise or in a fixed order.

    Raises:
        RuntimeError / OSError / ImportError: the build failed (no compiler, say), or the CPU
        has neither AVX-512 nor AVX2.
        ValueError: for an ``isa`` not in ``ISA_FLAGS``.
    """
    isa = best_isa() if isa is None else isa
    if isa not in ISA_FLAGS:
        raise ValueError(f"isa: expected one of {sorted(ISA_FLAGS)}, got {isa!r}")
    logger.info("loading the row-invariant attention kernel (compiled on first use)")
    # -ffp-contract=off: the compiler fuses no multiply-add itself; the source writes out the
    # ones it wants (-mfma: AVX2's), so every lane and remainder rounds alike.
    return compile_kernel(f"lookahead_invariant_attention_{isa}", [SOURCE],
                          ["-O3", "-ffp-contract=off", *ISA_FLAGS[isa], "-mfma"],
                          headers=(EXP_APPROX,))


def invariant_attention_problem(model) -> str | None:
    """Why ``model`` cannot run on the row-invariant attention, or None when it can."""
    if model.device.type != "cpu":
        return f"the row-invariant attention runs on the CPU; the model is on {model.device}"
    if model.dtype != torch.float32:
        return f"the row-invariant attention is float32; the model is {model.dtype}"
    if getattr(model.config, "_attn_implementation", None) not in (
            "sdpa", "lookahead_sdpa", ATTENTION_NAME):
        return f"the model runs {model.config._attn_implementation!r} attention, not SDPA"
    try:
        load_attention_kernel()
    except (RuntimeError, OSError, ImportError) as error:
        return f"the row-invariant attention kernel cannot be built here ({error})"
    return None


def use_invariant_attention(model) -> bool:
    """Switch ``model`` to ``invariant_attention``; True if it did, False (logged) where
    :func:`invariant_attention_problem` finds a reason not to."""
    problem = invariant_attention_problem(model)
    if problem is not None:
        logger.info("attention left as it is: %s", problem)
        return False
    AttentionInterface.register(ATTENTION_NAME, invariant_attention)
    # The masks transformers builds for calls we do not make (``model.generate``): SDPA's.
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    model.set_attn_implementation(ATTENTION_NAME)
    return True


def rows_are_independent(model) -> bool:
    """Whether each row of ``model``'s forward pass gets the bits it would get alone: every
    linear layer kept as GGUF blocks on the integer kernel (no float ``nn.Linear``, whose
    sums may be blocked by the number of rows) and the attention ``invariant_attention``.
    Then rows of a batch may share a pass without changing a token."""
    if getattr(model.config, "_attn_implementation", None) != ATTENTION_NAME:
        return False
    kinds = {type(module) for module in model.modules()}
    return QuantLinear in kinds and torch.nn.Linear not in kinds


def invariant_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Transformers' attention-function signature: query [B, H, T, D], key and value
    [B, H_kv, S, D], mask [B or 1, 1, T, >= S] (bool, or additive: 0 where allowed) or None
    (causal for T > 1 as SDPA takes it) -> output [B, T, H, D] (and no attention weights)."""
    mask = None
    if (query.dtype == torch.float32 and query.device.type == "cpu" and dropout == 0.0
            and not any(kwargs.get(name) is not None for name in _EXTRA_TERMS)):
        mask = _mask_rows(attention_mask, query, key)
    out = None
    if mask is not None:
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        causal = (attention_mask is None and query.shape[2] > 1 and (
            is_causal if is_causal is not None else getattr(module, "is_causal", True)))
        out = load_attention_kernel().attend(_last_contiguous(query), _last_contiguous(key),
                                             _last_contiguous(value), mask, bool(causal),
                                             float(scale))
    if out is None:  # not this kernel's call, or a mask that is a bias: SDPA adds it
        return grouped_sdpa(module, query, key, value, attention_mask, dropout=dropout,
                            scaling=scaling, is_causal=is_causal, **kwargs)
    return out, None


def _mask_rows(mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor
               ) -> torch.Tensor | None:
    """The mask [B or 1, 1, T, >= S] as the kernel reads it, [B or 1, T, >= S] (a view where
    it can), an empty tensor for no mask, or None for a mask this kernel does not take (per
    head, or neither bool nor float32). The kernel tells a bias from a mask itself."""
    if mask is None:
        return torch.empty(0, dtype=torch.bool)
    batch, _, rows, _ = query.shape
    if (mask.dim() != 4 or mask.shape[0] not in (1, batch) or mask.shape[1] != 1
            or mask.shape[2] != rows or mask.shape[3] < key.shape[2]
            or mask.dtype not in (torch.bool, torch.float32)):
        return None
    return _last_contiguous(mask[:, 0])


def _last_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself where its last dimension is contiguous (the kernel reads the other
    strides as they are), else a contiguous copy."""
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()
