"""``grouped_sdpa`` computes what transformers' SDPA attention computes, without ``repeat_kv``."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import lookahead
from lookahead.kernels.grouped_attention import ATTENTION_NAME, _foldable, grouped_sdpa


class Attention(torch.nn.Module):
    """What the attention functions read from the module."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def inputs(batch, heads, groups, length, past, generator, bool_mask):
    """query [B, H, T, D], key/value [B, H/G, S, D], a random mask [B, 1, T, S] in which every
    row sees at least its own column."""
    dim, kv_heads, columns = 8, heads // groups, past + length
    query = torch.randn(batch, heads, length, dim, generator=generator, dtype=torch.float64)
    key = torch.randn(batch, kv_heads, columns, dim, generator=generator, dtype=torch.float64)
    value = torch.randn(batch, kv_heads, columns, dim, generator=generator, dtype=torch.float64)
    allowed = torch.rand(batch, 1, length, columns, generator=generator) < 0.6
    allowed[:, :, torch.arange(length), past + torch.arange(length)] = True
    if bool_mask:
        return query, key, value, allowed
    mask = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, -1e30)
    return query, key, value, mask


@pytest.mark.parametrize("bool_mask", [False, True])
@pytest.mark.parametrize("heads,groups", [(6, 3), (4, 2), (8, 8), (4, 1)])
@pytest.mark.parametrize("length", [1, 2, 5])
def test_grouped_sdpa_equals_transformers_sdpa(heads, groups, length, bool_mask):
    generator = torch.Generator().manual_seed(heads * 100 + groups * 10 + length)
    query, key, value, mask = inputs(3, heads, groups, length, 7, generator, bool_mask)
    module = Attention(groups)
    ours, _ = grouped_sdpa(module, query, key, value, mask, scaling=0.3)
    theirs, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    assert ours.shape == (3, length, heads, 8)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_only_several_grouped_tokens_under_a_plain_mask_are_folded():
    mask = torch.zeros(2, 1, 3, 9)
    assert _foldable(3, 3, mask, 0.0, {"sliding_window": 8})
    assert not _foldable(1, 3, mask, 0.0, {})  # no groups
    assert not _foldable(3, 1, mask, 0.0, {})  # one token: transformers folds it already
    assert not _foldable(3, 3, None, 0.0, {})  # causal flag, no mask
    assert not _foldable(3, 3, torch.zeros(2, 4, 3, 9), 0.0, {})  # a mask per head
    assert not _foldable(3, 3, mask, 0.1, {})  # dropout
    assert not _foldable(3, 3, mask, 0.0, {"softcap": 30.0})  # extra terms


def test_use_grouped_attention_switches_sdpa_models_only(fresh_lm):
    model = fresh_lm("llama", attn="sdpa")
    assert lookahead.use_grouped_attention(model)
    assert model.config._attn_implementation == ATTENTION_NAME
    assert lookahead.use_grouped_attention(model)  # again: nothing changes
    eager = fresh_lm("llama", attn="eager")
    assert not lookahead.use_grouped_attention(eager)
    assert eager.config._attn_implementation == "eager"


def test_a_grouped_model_gives_transformers_logits_for_a_masked_step(fresh_lm):
    """A forward pass of several tokens under a tree-shaped 4D mask, as our steps run."""
    stock = fresh_lm("qwen2", attn="sdpa")
    grouped = fresh_lm("qwen2", attn="grouped")
    ids = torch.tensor([[5, 9, 2, 7, 7, 1]])
    allowed = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    allowed[4, 3] = False  # token 4 branches off after token 2
    mask = torch.zeros(1, 1, 6, 6, dtype=torch.float64).masked_fill(~allowed, -1e30)
    positions = torch.tensor([[0, 1, 2, 3, 3, 4]])
    with torch.no_grad():
        want = stock(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        got = grouped(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
