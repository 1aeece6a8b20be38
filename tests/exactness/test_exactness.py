"""Greedy exactness: every method returns token for token what ``model.generate`` returns.

The reference is Hugging Face's own ``model.generate(do_sample=False)`` on tiny random-weight
models in float64 (so that no argmax is decided by rounding). Each model is driven through
every method: plain decoding, lookahead decoding in three shapes, prompt lookup, and a draft
model that is always right (the model itself) or almost always wrong (another random model).
Prompts include the model's own output fed back ("echo"), whose continuation repeats, so that
candidates are accepted and the multi-token path of the verifier and the cache roll-back run.

Sliding windows and position-dependent RoPE are in test_exactness_positions.py, EOS and the
token limit in test_exactness_eos.py; the cases and ``run`` are in tests/tiny.py.
"""

from __future__ import annotations

import pytest
import torch
from tiny import (
    METHOD_CASES,
    MODEL_CASES,
    NEW_TOKENS,
    check_stats,
    first_difference,
    reference,
    run,
)

import lookahead

pytestmark = pytest.mark.usefixtures("one_thread")


# Methods whose candidates come from the text itself: on an echo prompt they must accept some.
COPYING_METHODS = ("lookahead", "lookahead-w3n3g2", "lookahead-growing-copy", "lookahead-priced",
                   "prompt_lookup")


@pytest.mark.parametrize("method_case", list(METHOD_CASES))
@pytest.mark.parametrize("model_case", list(MODEL_CASES))
def test_greedy_matches_model_generate(case_data, model_case, method_case):
    model, drafts, prompts, refs = case_data(model_case)
    accepted = {}
    for name, ids in prompts.items():
        result = run(model, ids, NEW_TOKENS, method_case, drafts)
        assert result.sequences.tolist() == refs[name].tolist(), (
            f"prompt {name!r}: " + first_difference(result.sequences, refs[name])
        )
        check_stats(result, ids.shape[1])
        accepted[name] = sum(result.stats.accepted_per_step)
        if method_case == "draft-self":
            # The model drafting for itself is always right: every proposed token is accepted.
            stats = result.stats
            assert stats.accepted_per_step[1:] == stats.proposed_per_step[1:]
            assert stats.tokens_per_step > 1
        if method_case == "autoregressive":
            assert result.stats.steps == NEW_TOKENS
    if method_case in COPYING_METHODS:
        # The multi-token path must really run: the echo prompt's continuation repeats.
        assert accepted["echo"] > 0, f"{method_case} accepted nothing on the echo prompt"


def test_draft_other_is_mostly_rejected(case_data):
    """The 'always wrong' draft really is wrong most of the time (else the case tests nothing)."""
    model, drafts, prompts, _ = case_data("llama-sdpa")
    result = run(model, prompts["random"], NEW_TOKENS, "draft-other", drafts)
    stats = result.stats
    assert sum(stats.accepted_per_step) < sum(stats.proposed_per_step) / 2


@pytest.mark.parametrize("model_case", ["llama-sdpa", "qwen2-sliding8", "gemma2-eager"])
def test_multi_token_steps_happen(case_data, model_case):
    """Lookahead and prompt lookup compress the echo prompt's continuation (> 1 token/step)."""
    model, drafts, prompts, _ = case_data(model_case)
    for method_case in ("lookahead", "prompt_lookup"):
        result = run(model, prompts["echo"], NEW_TOKENS, method_case, drafts)
        assert result.stats.tokens_per_step > 1, method_case


@pytest.mark.parametrize("cap", [1, 3, 6])
@pytest.mark.parametrize("method_case", ["lookahead", "prompt_lookup", "draft-self"])
def test_a_capped_step_feeds_at_most_its_tokens_and_writes_the_same(case_data, method_case,
                                                                    cap):
    model, drafts, prompts, refs = case_data("llama-sdpa")
    for name, ids in prompts.items():
        result = run(model, ids, NEW_TOKENS, method_case, drafts, max_step_tokens=cap)
        assert result.sequences.tolist() == refs[name].tolist(), (
            f"prompt {name!r}: " + first_difference(result.sequences, refs[name])
        )
        check_stats(result, ids.shape[1])
        fed = result.stats.forward_tokens_per_step[1:]  # the prefill feeds the whole prompt
        assert max(fed) <= cap, (name, fed)
    echo = run(model, prompts["echo"], NEW_TOKENS, method_case, drafts, max_step_tokens=cap)
    if cap > 1:  # the cap leaves room for guesses, and on the echo prompt they are taken
        assert echo.stats.tokens_per_step > 1
    # Uncapped, some step feeds more than 3 tokens: a cap of 3 really cuts.
    uncapped = run(model, prompts["echo"], NEW_TOKENS, method_case, drafts)
    assert max(uncapped.stats.forward_tokens_per_step[1:]) > 3


@pytest.mark.parametrize("model_case", ["llama-sdpa", "qwen2-sliding8"])
def test_growing_copy_is_accepted_beyond_its_first_length(case_data, model_case):
    """On a text that repeats itself the copy grows past ``lookup_tokens`` (2 here), and steps
    accept more than 2 tokens, which 1-token pool n-grams alone cannot give."""
    model, drafts, prompts, refs = case_data(model_case)
    result = run(model, prompts["echo"], NEW_TOKENS, "lookahead-growing-copy", drafts)
    assert result.sequences.tolist() == refs["echo"].tolist()
    assert max(result.stats.accepted_per_step) > 2


@pytest.mark.parametrize(
    "method, options",
    [
        ("lookahead", {}),
        ("lookahead", {"prompt_pool": False, "output_pool": False}),
        ("prompt_lookup", {"max_ngram": 1}),
        ("draft", {"num_draft_tokens": 64}),
    ],
)
def test_one_and_two_token_prompts(case_data, method, options):
    model = case_data("llama-sdpa")[0]
    if method == "draft":
        options = {**options, "draft_model": model}
    for ids in (torch.tensor([[5]]), torch.tensor([[5, 5]])):
        result = lookahead.generate(model, ids, max_new_tokens=20, method=method, **options)
        assert result.sequences.tolist() == reference(model, ids, 20).tolist(), ids.tolist()
