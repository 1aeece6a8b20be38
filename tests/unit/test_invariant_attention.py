"""lookahead.kernels.invariant_attention: SDPA's values, and each row's bits whatever else is
in the pass (rows, cache length, gaps, padding, other batch rows)."""

from __future__ import annotations

import pytest
import torch
from lookahead.kernels.grouped_attention import grouped_sdpa
from lookahead.kernels.quant_linear import best_isa
from lookahead.kernels.invariant_attention import (
    ATTENTION_NAME,
    invariant_attention,
    load_attention_kernel,
    invariant_attention_problem,
    rows_are_independent,
    use_invariant_attention,
)

MIN = torch.finfo(torch.float32).min


class Layer(torch.nn.Module):
    """What an attention function reads of its module."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def causal_mask(rows: int, keys: int) -> torch.Tensor:
    """Additive [1, 1, rows, keys]: row t sees the keys up to keys - rows + t."""
    allowed = torch.ones(rows, keys, dtype=torch.bool).tril(keys - rows)
    return torch.zeros(1, 1, rows, keys).masked_fill(~allowed, MIN)


def tensors(batch=1, heads=6, kv_heads=2, rows=5, keys=37, dim=24, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, heads, rows, dim, generator=generator),
            torch.randn(batch, kv_heads, keys, dim, generator=generator),
            torch.randn(batch, kv_heads, keys, dim, generator=generator))


@pytest.mark.parametrize("dim", [16, 24, 64])
def test_it_computes_what_sdpa_computes(dim) -> None:
    query, key, value = tensors(batch=2, dim=dim)
    mask = causal_mask(5, 37)
    layer = Layer(groups=3)
    ours, _ = invariant_attention(layer, query, key, value, mask)
    theirs, _ = grouped_sdpa(layer, query, key, value, mask)
    assert ours.shape == theirs.shape == (2, 5, 6, dim)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    # No mask and several rows: causal, as SDPA takes it.
    causal, _ = invariant_attention(layer, query, key, value, None)
    assert torch.equal(causal, ours)


def test_a_row_gets_the_bits_of_its_own_pass() -> None:
    """k rows in one pass == k passes of one row, each over its own prefix of the cache."""
    query, key, value = tensors(rows=7, keys=40)
    layer = Layer(groups=3)
    together, _ = invariant_attention(layer, query, key, value, causal_mask(7, 40))
    for t in range(7):
        seen = 40 - 7 + t + 1
        alone, _ = invariant_attention(layer, query[:, :, t:t + 1].contiguous(),
                                       key[:, :, :seen].contiguous(),
                                       value[:, :, :seen].contiguous(), None)
        assert torch.equal(alone[:, 0], together[:, t]), t


@pytest.mark.parametrize("seed", range(4))
def test_rows_with_their_own_masks_get_the_bits_of_their_own_pass(seed) -> None:
    """Rows that see a common prefix of the cache, then keys of their own (a tree of
    candidates), share the prefix's value loads in the kernel: each row gets its bits alone."""
    rows, keys = 6, 50
    query, key, value = tensors(rows=rows, keys=keys, dim=40, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    allowed = torch.rand(1, 1, rows, keys, generator=generator) > 0.4
    common = int(torch.randint(0, keys, (1,), generator=generator))
    allowed[..., :common] = True
    allowed[..., seed, common // 2] = False  # one row with a gap inside the common prefix
    layer = Layer(groups=3)
    together, _ = invariant_attention(layer, query, key, value, allowed)
    for t in range(rows):
        alone, _ = invariant_attention(layer, query[:, :, t:t + 1].contiguous(), key, value,
                                       allowed[:, :, t:t + 1])
        assert torch.equal(alone[:, 0], together[:, t]), t


def test_strided_views_are_read_as_their_contiguous_copies() -> None:
    """A cache's keys and values are views of buffers with spare columns, and the query a
    transposed projection: the kernel reads them in place and gets the copies' bits."""
    query, key, value = tensors(batch=2, rows=3, keys=29, dim=32)
    layer = Layer(groups=3)
    copies, _ = invariant_attention(layer, query, key, value, causal_mask(3, 29))
    spare = torch.full((2, 2, 64, 32), float("nan"))  # a read past S would show
    key_buffer, value_buffer = torch.cat([key, spare], dim=2), torch.cat([value, spare], dim=2)
    query_t = query.transpose(1, 2).contiguous().transpose(1, 2)  # [B, H, T, D], strided
    assert not query_t.is_contiguous() and not key_buffer[:, :, :29].is_contiguous()
    views, _ = invariant_attention(layer, query_t, key_buffer[:, :, :29],
                                   value_buffer[:, :, :29], causal_mask(3, 29))
    assert torch.equal(views, copies)


def test_masked_keys_gaps_and_other_batch_rows_change_no_bit() -> None:
    query, key, value = tensors(rows=4, keys=30)
    layer = Layer(groups=3)
    mask = causal_mask(4, 30)
    alone, _ = invariant_attention(layer, query, key, value, mask)
    # A gap of 9 masked keys (holding huge values) in the middle of the cache.
    gap = torch.full((1, 2, 9, 24), 1e4)
    key_gap = torch.cat([key[:, :, :11], gap, key[:, :, 11:]], dim=2)
    value_gap = torch.cat([value[:, :, :11], -gap, value[:, :, 11:]], dim=2)
    mask_gap = torch.cat([mask[..., :11], torch.full((1, 1, 4, 9), MIN), mask[..., 11:]], -1)
    gapped, _ = invariant_attention(layer, query, key_gap, value_gap, mask_gap)
    assert torch.equal(gapped, alone)
    # The same row beside another, longer one in a batch: padded on the left, bool mask.
    other_q, other_k, other_v = tensors(rows=4, keys=45, seed=1)
    pad = 15
    keys = torch.cat([torch.zeros(1, 2, pad, 24), key], dim=2)
    values = torch.cat([torch.zeros(1, 2, pad, 24), value], dim=2)
    allowed = torch.cat([torch.zeros(1, 1, 4, pad, dtype=torch.bool), mask == 0], dim=-1)
    batch_mask = torch.cat([allowed, causal_mask(4, 45) == 0])
    both, _ = invariant_attention(layer, torch.cat([query, other_q]), torch.cat([keys, other_k]),
                                  torch.cat([values, other_v]), batch_mask)
    assert torch.equal(both[:1], alone)


@pytest.mark.parametrize("first_gap", [0, 1, 15, 16, 17, 33, 200])
def test_a_gap_anywhere_in_a_long_cache_changes_no_bit(first_gap) -> None:
    """The kernel finds a row's leading run of seen keys 16 at a time: a gap starting at any
    key, bool or additive, must still give the bits of the cache without it."""
    query, key, value = tensors(rows=3, keys=240, dim=64, seed=first_gap)
    layer = Layer(groups=3)
    alone, _ = invariant_attention(layer, query, key, value, causal_mask(3, 240))
    width = 5
    gap = torch.full((1, 2, width, 64), 1e4)
    key_gap = torch.cat([key[:, :, :first_gap], gap,
                         key[:, :, first_gap:]], dim=2)
    value_gap = torch.cat([value[:, :, :first_gap], -gap, value[:, :, first_gap:]], dim=2)
    allowed = torch.cat([causal_mask(3, 240)[..., :first_gap] == 0,
                         torch.zeros(1, 1, 3, width, dtype=torch.bool),
                         causal_mask(3, 240)[..., first_gap:] == 0], dim=-1)
    for mask in (allowed, torch.zeros(allowed.shape).masked_fill(~allowed, MIN)):
        gapped, _ = invariant_attention(layer, query, key_gap, value_gap, mask)
        assert torch.equal(gapped, alone)


@pytest.mark.skipif(best_isa() != "avx512vnni", reason="the AVX-512 build needs AVX-512")
def test_the_avx2_build_gives_the_avx512_builds_bits() -> None:
    """Both builds fuse the same multiply-adds and sum in the same order: a text must not
    depend on which of them ran it."""
    wide, narrow = load_attention_kernel("avx512vnni"), load_attention_kernel("avx2")
    for dim, keys in ((24, 37), (64, 300), (128, 50)):
        query, key, value = tensors(rows=5, keys=keys, dim=dim)
        allowed = causal_mask(5, keys)[:, 0] == 0
        allowed[0, 2, 7] = False
        for mask in (torch.empty(0, dtype=torch.bool), allowed):
            a = wide.attend(query, key, value, mask, True, dim ** -0.5)
            b = narrow.attend(query, key, value, mask, True, dim ** -0.5)
            assert torch.equal(a, b), (dim, keys, mask.dtype)
    with pytest.raises(ValueError, match="isa"):
        load_attention_kernel("sse2")


def test_causal_rows_before_the_first_key_see_nothing() -> None:
    """Causal without a mask, 5 query rows on 3 keys: rows 0 and 1 come before every key."""
    query, key, value = tensors(rows=5, keys=3)
    out = load_attention_kernel().attend(query, key, value, torch.empty(0, dtype=torch.bool),
                                         True, 24 ** -0.5)
    assert torch.equal(out[:, :2], torch.zeros(1, 2, 6, 24))
    for t in range(2, 5):
        seen = t - 1
        alone = load_attention_kernel().attend(query[:, :, t:t + 1].contiguous(),
                                               key[:, :, :seen].contiguous(),
                                               value[:, :, :seen].contiguous(),
                                               torch.empty(0, dtype=torch.bool), False,
                                               24 ** -0.5)
        assert torch.equal(out[:, t], alone[:, 0]), t


def test_a_row_that_sees_nothing_gets_zeros_and_others_fall_back() -> None:
    query, key, value = tensors(rows=2, keys=8)
    layer = Layer(groups=3)
    mask = torch.zeros(1, 1, 2, 8, dtype=torch.bool)
    mask[0, 0, 1, :3] = True
    out, _ = invariant_attention(layer, query, key, value, mask)
    assert torch.equal(out[0, 0], torch.zeros(6, 24)) and out[0, 1].abs().sum() > 0
    # A bias is not a mask, and float64 is not this kernel's: both go to SDPA, and agree.
    bias = torch.randn(1, 1, 2, 8)
    for args in ((query, key, value, bias),
                 (query.double(), key.double(), value.double(), causal_mask(2, 8).double())):
        ours, _ = invariant_attention(layer, *args)
        theirs, _ = grouped_sdpa(layer, *args)
        assert torch.equal(ours, theirs)


def test_a_model_switches_to_it_only_in_float32_on_the_cpu(fresh_lm) -> None:
    model = fresh_lm("llama")  # float64
    assert "float32" in invariant_attention_problem(model)
    assert use_invariant_attention(model) is False
    model = model.float()
    assert invariant_attention_problem(model) is None
    assert use_invariant_attention(model) is True
    assert model.config._attn_implementation == ATTENTION_NAME
    # Float linear layers: their sums may depend on the rows beside them.
    assert rows_are_independent(model) is False
