"""The tokens, position ids and 4D attention mask of one decoding step.

A step feeds the model, in one forward pass::

    [ x0 | candidate tree (C - 1 tokens) | lookahead branch (B tokens) ]

``x0`` is the last accepted token (not yet in the KV cache). The candidate tree merges the
proposals that start after ``x0`` into a trie rooted at ``x0``. The lookahead branch is the
Jacobi window of lookahead decoding (empty for the other methods). In the trie two candidates
sharing a prefix cost their shared tokens once. Every token sees the whole cached prefix; inside the step it sees
``x0``, and then only its own branch ancestors (window) or its own trie ancestors (candidates).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


class TokenTree:
    """A trie of candidate continuations rooted at ``x0`` (node 0).

    Example: candidates ``[[5, 6, 7], [5, 8]]`` give nodes ``x0, 5, 6, 7, 8`` with parents
    ``-1, 0, 1, 2, 1`` and depths ``0, 1, 2, 3, 2``: the shared ``5`` is fed once.

    ``source[i]`` is ``(candidate index, offset)`` of the first candidate that created node i,
    which lets a draft model's proposal probabilities follow their tokens.
    """

    def __init__(self, root_token: int, candidates: list[list[int]] = ()) -> None:
        self.tokens: list[int] = [root_token]
        self.parents: list[int] = [-1]
        self.depths: list[int] = [0]
        self.children: list[dict[int, int]] = [{}]
        self.source: list[tuple[int, int]] = [(-1, -1)]
        for index, candidate in enumerate(candidates):
            self._insert(index, candidate)

    def _insert(self, index: int, candidate: list[int]) -> None:
        node = 0
        for offset, token in enumerate(candidate):
            child = self.children[node].get(token)
            if child is None:
                child = len(self.tokens)
                self.tokens.append(token)
                self.parents.append(node)
                self.depths.append(self.depths[node] + 1)
                self.children.append({})
                self.source.append((index, offset))
                self.children[node][token] = child
            node = child

    def __len__(self) -> int:
        return len(self.tokens)

    def is_chain(self) -> bool:
        """True when every node has at most one child (a single candidate)."""
        return all(len(c) <= 1 for c in self.children)

    def ancestors(self) -> np.ndarray:
        """Bool [n, n]: ``a[i, j]`` is True when node j is node i or one of its ancestors."""
        n = len(self.tokens)
        anc = np.zeros((n, n), dtype=bool)
        for i in range(n):  # parents come before their children
            if self.parents[i] >= 0:
                anc[i] = anc[self.parents[i]]
            anc[i, i] = True
        return anc


@dataclass(frozen=True)
class Branch:
    """Extra tokens a proposer feeds beside the candidates (the lookahead window).

    tokens: [B] token ids. depths: [B] position offsets from ``x0`` (each >= 1).
    visible: bool [B, B], ``visible[i, j]`` when branch token i attends to branch token j.
    logit_rows: indices into ``tokens`` whose next-token logits the proposer wants back.
    """

    tokens: torch.Tensor
    depths: torch.Tensor
    visible: torch.Tensor
    logit_rows: torch.Tensor


@dataclass(frozen=True)
class StepLayout:
    """Where everything sits in the step's input of length T = C + B.

    Rows ``0 .. C-1`` are the candidate tree (row 0 is x0, then the trie in insertion order,
    so the first candidate's tokens are contiguous and accepting them is a plain cache crop);
    rows ``C .. C+B-1`` are the branch.
    input_ids, position_ids: [1, T]. visible: bool [T, T], or None when the step is a plain
    causal chain (then the model builds its own mask). logit_rows: [C + R] rows whose logits
    the step needs: the tree's, then the branch's requested ones.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    visible: torch.Tensor | None
    tree_size: int
    logit_rows: torch.Tensor


def layout_step(tree: TokenTree, branch: Branch | None, position: int) -> StepLayout:
    """Lay out ``[tree (x0 first) | branch]`` with ``x0`` at absolute ``position``."""
    n_tree = len(tree)
    tokens = torch.tensor(tree.tokens, dtype=torch.long)
    depths = torch.tensor(tree.depths, dtype=torch.long)
    logit_rows = torch.arange(n_tree)
    if branch is not None:
        tokens = torch.cat([tokens, branch.tokens])
        depths = torch.cat([depths, branch.depths])
        logit_rows = torch.cat([logit_rows, branch.logit_rows + n_tree])
    visible = None
    if branch is not None or not tree.is_chain():
        visible = _visibility(tree, branch)
    return StepLayout(
        input_ids=tokens.unsqueeze(0),
        position_ids=(depths + position).unsqueeze(0),
        visible=visible,
        tree_size=n_tree,
        logit_rows=logit_rows,
    )


def _visibility(tree: TokenTree, branch: Branch | None) -> torch.Tensor:
    """Bool [T, T] visibility inside the step (everything sees x0 at column 0)."""
    n_tree = len(tree)
    size = n_tree + (0 if branch is None else len(branch.tokens))
    vis = np.zeros((size, size), dtype=bool)
    vis[:n_tree, :n_tree] = tree.ancestors()
    if branch is not None:
        vis[n_tree:, 0] = True
        vis[n_tree:, n_tree:] = branch.visible.numpy()
    return torch.from_numpy(vis)


def attention_mask(
    config, visible: torch.Tensor, past_len: int, position_ids: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The 4D additive mask [1, 1, T, past_len + T] the model's public forward accepts.

    The cached prefix holds positions ``0 .. past_len - 1`` in order, so it is visible to all.
    """
    t = visible.shape[0]
    allowed = torch.ones(1, t, past_len + t, dtype=torch.bool)
    allowed[0, :, past_len:] = visible
    key_positions = torch.cat([torch.arange(past_len), position_ids[0]]).unsqueeze(0)
    return batched_attention_mask(config, allowed, position_ids, key_positions, dtype)


def batched_attention_mask(
    config,
    allowed: torch.Tensor,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor | dict[str, torch.Tensor]:
    """Bool [B, T, K] (query may see key) -> additive [B, 1, T, K].

    Models with sliding-window layers get the window applied by position (query_positions
    [B, T], key_positions [B, K]); those that name their layer types (Gemma 2/3, Qwen 2/3)
    take one mask per type.
    """
    full = _additive(allowed, dtype)
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if window is None or (layer_types is not None and "sliding_attention" not in layer_types):
        return full
    near = query_positions.unsqueeze(2) - key_positions.unsqueeze(1) < window
    windowed = _additive(allowed & near, dtype)
    if layer_types is None:
        return windowed
    return {"full_attention": full, "sliding_attention": windowed}


def decoding_attention(device: torch.device) -> contextlib.AbstractContextManager:
    """The context for a decoding forward pass on ``device``: on CUDA, scaled-dot-product
    attention through whichever of FlashAttention, the memory-efficient kernel and the math
    one are enabled, but not cuDNN's; elsewhere nothing.

    cuDNN attention builds a plan for every new shape, and a decoding step meets a new cache
    length every time: on an H200 with a 7B Llama in bfloat16, a pass at a cache length seen
    for the first time took 63 ms against 35 without it, and HF ``generate`` 101 ms a token
    against 25 (``docs/results/2026-11-26-h200/gpu-step-cost``). The flags go back on exit.
    """
    if device.type != "cuda":
        return contextlib.nullcontext()
    backends = [backend for backend, enabled in (
        (SDPBackend.FLASH_ATTENTION, torch.backends.cuda.flash_sdp_enabled()),
        (SDPBackend.EFFICIENT_ATTENTION, torch.backends.cuda.mem_efficient_sdp_enabled()),
        (SDPBackend.MATH, torch.backends.cuda.math_sdp_enabled()),
    ) if enabled]
    return sdpa_kernel(backends) if backends else contextlib.nullcontext()


def mask_to(mask: torch.Tensor | dict[str, torch.Tensor], device) -> torch.Tensor | dict:
    """Move a mask, or a dict of masks per layer type (``batched_attention_mask``), to
    ``device``."""
    if isinstance(mask, dict):
        return {kind: m.to(device) for kind, m in mask.items()}
    return mask.to(device)


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool [B, T, K] -> additive float [B, 1, T, K]: 0 where allowed, the dtype's min elsewhere."""
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.unsqueeze(1)
