"""Few shapes of forward passes, because every new one costs memory for as long as the server runs.

On a CPU, PyTorch runs bf16 and fp32 matmuls through oneDNN, which compiles kernels for each
number of rows (tokens) a linear layer sees and keeps them in its primitive cache (1024 entries).
On SmolLM2-135M every new forward length kept about 3 MiB for good (40 lengths: +125 MiB
after ``malloc_trim``), while a new cache length at a fixed number of tokens kept nothing. A
server that prefilled each prompt at its own length would so grow by up to ~450 MiB, and never
come back to the memory it had when idle. Hence:

* prompts are prefilled right-padded to one of a few lengths (``prefill_length``: four per
  doubling, so at most 25 % more prompt tokens, and the padding's cache entries are dropped);
* a batched step feeds at most ``step_token_budget`` tokens in all, so step shapes are few;
* ``warm_up`` runs every step size and every prefill length up to a limit once at start: the
  kernels are compiled, and the memory kept, before the first request rather than during it.
"""

from __future__ import annotations

import logging
import time

import torch

from lookahead.attention import decoding_attention

logger = logging.getLogger(__name__)


def prefill_length(tokens: int) -> int:
    """The padded prefill length of a prompt of ``tokens`` tokens: a multiple of 8 up to 64,
    then four lengths per doubling (80, 96, 112, 128, 160, 192, 224, 256, 320, ...)."""
    if tokens <= 64:
        return max(8, -(-tokens // 8) * 8)
    step = 1 << (tokens.bit_length() - 3)
    return -(-tokens // step) * step


def prefill_lengths(limit: int) -> list[int]:
    """Every padded prefill length up to that of a ``limit``-token prompt, shortest first."""
    lengths, tokens = [], 1
    while tokens <= limit:
        lengths.append(prefill_length(tokens))
        tokens = lengths[-1] + 1
    return lengths


@torch.inference_mode()
def warm_up(model, step_tokens: int, prompt_tokens: int) -> None:
    """One forward pass of every step size up to ``step_tokens`` (all its logits kept, as a
    step keeps them) and of every prefill length up to ``prompt_tokens`` (last logits only)."""
    started = time.perf_counter()
    device = model.device
    lengths = prefill_lengths(prompt_tokens)
    with decoding_attention(device):  # the kernels the engine's passes will use
        for tokens in range(1, step_tokens + 1):
            model(input_ids=torch.zeros(1, tokens, dtype=torch.long, device=device),
                  use_cache=False)
        for tokens in lengths:
            model(input_ids=torch.zeros(1, tokens, dtype=torch.long, device=device),
                  use_cache=False, logits_to_keep=1)
    logger.info("compiled the kernels of %d step sizes and %d prefill lengths in %.1f s",
                step_tokens, len(lengths), time.perf_counter() - started)
