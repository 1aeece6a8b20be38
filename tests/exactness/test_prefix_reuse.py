"""A prompt that continues an earlier text reuses that text's KV entries and prefills only the
rest: on the quantized path the logits are bit for bit those of a fresh prefill of the whole
prompt, whether the entries came from a prefill or from speculative decoding steps, and the
texts are the same with the prefix cache on or off."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from tiny import reference, tiny_llama
from tiny_gguf import write_tiny_gguf

import lookahead
from lookahead.cache import cache_keyword, new_cache
from lookahead.prefix_cache import CachedPrefix, PrefixCache, entries_of

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = torch.tensor([[256, 3, 70, 71, 72, 3, 70, 71, 72, 3, 70, 71, 9, 100, 101, 102]])


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prefix")
    path = write_tiny_gguf(folder / "qwen2.gguf", "qwen2", (Q.Q4_K, Q.Q6_K), hidden=256)
    model, _ = lookahead.load_model(path, cache_dir=folder / "cache")
    model.generation_config.eos_token_id = None
    return model


def _last_logits(model, ids: torch.Tensor, cache) -> torch.Tensor:
    with torch.inference_mode():
        return model(ids, **{cache_keyword(model): cache}).logits[0, -1]


@pytest.mark.parametrize("method", ["autoregressive", "lookahead", "prompt_lookup"])
def test_a_reused_prefix_gives_the_logits_of_a_fresh_prefill_bit_for_bit(quantized, method):
    """The entries of an earlier text -- its prompt prefilled, then 30 tokens decoded by
    ``method`` in steps of several tokens -- continue a longer prompt: its last logits equal
    those of a fresh prefill of the whole prompt."""
    model = quantized
    first = lookahead.generate(model, PROMPT, 30, method=method)
    prefix = CachedPrefix.from_cache(first.past_key_values)
    assert prefix.length == first.sequences.shape[1] - 1
    longer = torch.cat([first.sequences, torch.tensor([[5, 70, 71, 72]])], dim=1)
    fresh = _last_logits(model, longer, new_cache())
    reused = _last_logits(model, longer[:, prefix.length:], prefix.to_cache())
    assert torch.equal(fresh, reused)


def test_generate_continues_from_an_earlier_calls_cache(quantized):
    model = quantized
    first = lookahead.generate(model, PROMPT, 12, method="lookahead")
    longer = torch.cat([first.sequences, torch.tensor([[5, 70, 71]])], dim=1)
    alone = lookahead.generate(model, longer, 20, method="lookahead")
    again = lookahead.generate(model, longer, 20, method="lookahead",
                               past_key_values=first.past_key_values)
    assert torch.equal(again.sequences, alone.sequences)
    assert again.stats.cached_prompt_tokens == first.sequences.shape[1] - 1
    assert again.stats.forward_tokens_per_step[0] == 4  # the prefill ran the new tokens only


def test_a_filled_cache_through_custom_generate_and_bad_caches():
    model = tiny_llama(32, eos=None).double()
    ids = torch.tensor([[3, 4, 5, 3, 4, 5, 3]])
    first = lookahead.generate(model, ids, 8, method="autoregressive")
    longer = torch.cat([first.sequences, torch.tensor([[6, 7]])], dim=1)
    out = model.generate(longer, attention_mask=torch.ones_like(longer), max_new_tokens=10,
                         do_sample=False, custom_generate=lookahead.custom_generate,
                         **{cache_keyword(model): first.past_key_values})
    assert torch.equal(out, reference(model, longer, 10))
    with pytest.raises(ValueError, match="holds 14 positions: it must hold fewer than "
                       "input_ids' 10 tokens"):
        lookahead.generate(model, first.sequences[:, :10], 4,
                           past_key_values=first.past_key_values)
    with pytest.raises(ValueError, match="one unpadded sequence"):
        lookahead.generate(model, torch.cat([longer, longer]), 4,
                           past_key_values=first.past_key_values)


def test_a_conversation_is_the_same_with_the_prefix_cache_on_and_off(quantized):
    """Five turns of one text growing by an answer and a question, twice: prefilled whole at
    every turn, and continued from a ``PrefixCache`` that also holds another conversation and
    is too small for both (so entries are evicted on the way)."""
    model = quantized
    questions = [[3, 70, 71, 72, 9], [100, 101, 102], [5, 6, 7, 70], [71, 72], [9, 9, 100]]
    per_text = sum(k.numel() * 4 * 2 for k, _ in entries_of(
        lookahead.generate(model, PROMPT, 1).past_key_values)) // PROMPT.shape[1]
    prefixes = PrefixCache(per_text * 130)  # room for about one conversation, not two
    texts = {"on": [], "off": []}
    for mode in ("on", "off"):
        for other in (False, True):  # the other conversation runs turn by turn in between
            text = PROMPT[0].tolist() if not other else [257, *PROMPT[0, 1:].tolist()]
            for question in questions:
                ids = torch.tensor([text + question])
                prefix = prefixes.lookup(ids[0].tolist()) if mode == "on" else None
                stream = lookahead.stream(model, ids, 16, "lookahead", prefix=prefix)
                for _ in stream:
                    pass
                text = stream.sequences[0].tolist()
                if mode == "on":
                    prefixes.store(text[:-1], entries_of(stream.past_key_values))
                texts[mode].append(text)
    assert texts["on"] == texts["off"]
    assert prefixes.hits > 0 and prefixes.nbytes <= prefixes.budget_bytes
