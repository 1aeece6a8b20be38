"""Greedy exactness where positions matter: sliding windows shorter than the text, Phi-3's
longrope (factors chosen by the sequence's length), GPT-2's learned positions up to the end
of the context, and a prefill padded to a longer length (as the server does)."""

from __future__ import annotations

import pytest
import torch
import transformers
from tiny import METHOD_CASES, first_difference, reference, run

from lookahead.request import make_decoder
from lookahead.cache import cache_length

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    "family, attn, overrides",
    [
        ("gemma2", "eager", {}),
        ("gemma3", "sdpa", {}),
        ("mistral", "sdpa", {}),
        ("qwen2", "sdpa", {"use_sliding_window": True, "max_window_layers": 1}),
        ("phi3", "sdpa", {}),
    ],
)
def test_sliding_window_beyond_its_length(tiny_lm, family, attn, overrides):
    """sliding_window=8 while prompt + output spans ~40 positions: the window's mask matters
    (the output differs from the same weights with a wide window), and every method still
    reproduces ``model.generate``."""
    model = tiny_lm(family, seed=2, attn=attn, sliding_window=8, **overrides)
    wide = tiny_lm(family, seed=2, attn=attn, sliding_window=4096, **overrides)
    other = tiny_lm(family, seed=3, attn=attn, sliding_window=8, **overrides)
    drafts = {"self": model, "other": other}
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6]])
    ref = reference(model, ids, 28)
    assert ids.shape[1] + 28 > model.config.sliding_window
    assert ref.tolist() != reference(wide, ids, 28).tolist(), "the window changes nothing here"
    for method_case in METHOD_CASES:
        result = run(model, ids, 28, method_case, drafts)
        assert result.sequences.tolist() == ref.tolist(), method_case
    # A multi-token step happens once the text is longer than the window.
    result = run(model, ids, 28, "lookahead", drafts)
    stats = result.stats
    produced = 1
    late_accepts = 0
    for accepted in stats.accepted_per_step[1:]:
        if ids.shape[1] + produced > model.config.sliding_window and accepted > 0:
            late_accepts += 1
        produced += accepted + 1
    assert late_accepts > 0


LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "short_factor": [1.0, 1.0, 1.0, 1.0],
    "long_factor": [4.0, 8.0, 16.0, 32.0],
}


def longrope_phi3(fresh_lm, original: int):
    """Phi-3 with longrope: short factors while the sequence fits in ``original`` positions,
    long ones beyond (as Phi-3-mini-128k / Phi-3.5-mini). Its q/k weights are scaled up so
    that attention is sharp and the choice of factors changes the argmax."""
    model = fresh_lm(
        "phi3",
        seed=0,
        rope_parameters={**LONGROPE, "original_max_position_embeddings": original},
        original_max_position_embeddings=original,
        max_position_embeddings=4 * original,
    )
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    qk_rows = (config.num_attention_heads + config.num_key_value_heads) * head_dim
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.qkv_proj.weight[:qk_rows].mul_(6.0)
    return model


@pytest.mark.parametrize(
    "method_case", ["autoregressive", "lookahead", "prompt_lookup", "draft-self"]
)
def test_longrope_crossing_the_original_context(fresh_lm, method_case):
    """The text grows from 20 to 60 positions across original_max_position_embeddings=32.
    ``model.generate`` switches to the long factors when the *sequence* passes 32 and then
    recomputes the whole cache with them (Phi3ForCausalLM.prepare_inputs_for_generation);
    every method must reproduce that output."""
    model = longrope_phi3(fresh_lm, original=32)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10] * 3 + [5, 6]])
    ref = reference(model, ids, 40)
    never_long = reference(longrope_phi3(fresh_lm, original=1000), ids, 40)
    assert ref.tolist() != never_long.tolist(), "the factors change nothing here"
    result = run(model, ids, 40, method_case, {"self": model})
    assert result.sequences.tolist() == ref.tolist(), first_difference(result.sequences, ref)


@pytest.mark.parametrize(
    "method_case", ["autoregressive", "lookahead", "lookahead-w3n3g2", "prompt_lookup"]
)
def test_longrope_text_within_the_original_context(fresh_lm, method_case):
    """Prompt + output = 32 positions = original_max_position_embeddings: ``model.generate``
    never leaves the short factors, so neither may any method (no step may feed a position
    beyond the text's final length)."""
    model = longrope_phi3(fresh_lm, original=32)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10] * 3 + [5, 6]])
    ref = reference(model, ids, 12)
    result = run(model, ids, 12, method_case, {})
    assert result.sequences.tolist() == ref.tolist(), first_difference(result.sequences, ref)


@pytest.mark.parametrize(
    "method_case",
    ["autoregressive", "lookahead", "lookahead-w1n2g1", "prompt_lookup", "draft-self"],
)
def test_learned_positions_up_to_the_end_of_the_context(method_case):
    """GPT-2 has one learned embedding per position (n_positions=40). A request that fills
    the context exactly (20 + 20 tokens) is valid and must decode like ``model.generate``."""
    config = transformers.GPT2Config(
        vocab_size=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=40,
        bos_token_id=None,
        eos_token_id=None,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).to(torch.float64).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = model.generation_config.pad_token_id = None
    ids = torch.tensor([[5, 6, 7, 8, 9, 10] * 3 + [5, 6]])
    ref = reference(model, ids, 20)
    result = run(model, ids, 20, method_case, {"self": model})
    assert result.sequences.tolist() == ref.tolist(), first_difference(result.sequences, ref)


@pytest.mark.parametrize("method_case", ["autoregressive", "lookahead"])
def test_padded_prefill_decodes_as_the_plain_prompt(tiny_lm, method_case):
    """The server prefills prompts right-padded to a few lengths; the padding's entries must
    leave the text unchanged and the cache holding exactly the prompt."""
    model = tiny_lm("llama", seed=0)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10] * 3 + [5, 6]])
    decoder = make_decoder(model, ids, 24, method_case.split("-")[0])
    first = decoder.prefill(length=37)
    assert cache_length(decoder.cache) == ids.shape[1] and decoder.stats.forward_tokens_per_step == [37]
    while not decoder.finished:
        decoder._step()
    ref = reference(model, ids, 24)
    assert first == decoder.new_tokens[:1]
    assert [ids[0].tolist() + decoder.new_tokens] == ref.tolist()


def test_padded_prefill_stays_within_the_original_rope_context(fresh_lm):
    """Padding a 20-token prompt to 48 would cross a longrope model's switch at 32 and rotate
    the prompt with the long factors; the padding stops at the switch instead."""
    model = longrope_phi3(fresh_lm, original=32)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10] * 3 + [5, 6]])
    decoder = make_decoder(model, ids, 12, "autoregressive")
    decoder.prefill(length=48)
    assert decoder.stats.forward_tokens_per_step == [32]
    while not decoder.finished:
        decoder._step()
    assert [ids[0].tolist() + decoder.new_tokens] == reference(model, ids, 12).tolist()
