"""Greedy exactness: every method returns token for token what ``model.generate`` returns.

The reference is Hugging Face's own ``model.generate(do_sample=False)`` on tiny random-weight
models in float64 (so that no argmax is decided by rounding). Each model is driven through
every method: plain decoding, lookahead decoding in three shapes, prompt lookup, and a draft
model that is always right (the model itself) or almost always wrong (another random model).
Prompts include the model's own output fed back ("echo"), whose continuation repeats, so that
candidates are accepted and the multi-token path of the verifier and the cache roll-back run.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from tiny import reference

import lookahead
from lookahead.api import make_decoder
from lookahead.cache import cache_length

pytestmark = pytest.mark.usefixtures("one_thread")

NEW_TOKENS = 24

QWEN2_SLIDING8 = {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}

# case -> (family, attention implementation, config overrides)
MODEL_CASES = {
    "llama-sdpa": ("llama", "sdpa", {}),
    "llama-eager": ("llama", "eager", {}),
    "qwen2": ("qwen2", "sdpa", {}),
    "qwen2-sliding8": ("qwen2", "sdpa", QWEN2_SLIDING8),
    "mistral-sliding8": ("mistral", "sdpa", {"sliding_window": 8}),
    "gemma2-eager": ("gemma2", "eager", {}),
    "gemma3-sliding8": ("gemma3", "sdpa", {"sliding_window": 8}),
    "phi3": ("phi3", "sdpa", {}),
    # lookahead.kernels.grouped_attention (references from the same weights on "sdpa")
    "llama-grouped": ("llama", "grouped", {}),
    "qwen2-sliding8-grouped": ("qwen2", "grouped", QWEN2_SLIDING8),
    "gemma3-sliding8-grouped": ("gemma3", "grouped", {"sliding_window": 8}),
}

# name -> (method, options); "self"/"other" stand for the draft model to use
METHOD_CASES = {
    "autoregressive": ("autoregressive", {}),
    "lookahead": ("lookahead", {}),
    # The window at every step (the paper's rule), and a window that must pay a high price:
    # after its warm-up it runs every 3rd step only, its levels kept between runs.
    "lookahead-w3n3g2": ("lookahead", {"window": 3, "ngram": 3, "guess": 2, "token_cost": 0}),
    "lookahead-gauged": ("lookahead", {"window": 3, "ngram": 3, "guess": 2, "token_cost": 1.0,
                                       "window_probe": 3}),
    "lookahead-w1n2g1": ("lookahead", {"window": 1, "ngram": 2, "guess": 1}),
    # Pool n-grams of one token and a copy that starts at 2 and grows while accepted whole.
    "lookahead-growing-copy": ("lookahead", {"window": 1, "ngram": 2, "guess": 1,
                                             "lookup_tokens": 2, "lookup_max_tokens": 16}),
    "prompt_lookup": ("prompt_lookup", {}),
    "draft-self": ("draft", {"draft_model": "self"}),
    "draft-other": ("draft", {"draft_model": "other"}),
}

# Methods whose candidates come from the text itself: on an echo prompt they must accept some.
COPYING_METHODS = ("lookahead", "lookahead-w3n3g2", "lookahead-growing-copy", "prompt_lookup")


def first_difference(ours: torch.Tensor, theirs: torch.Tensor) -> str:
    """Where two [1, T] sequences part, for assertion messages."""
    a, b = ours[0].tolist(), theirs[0].tolist()
    pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return (
        f"first difference at position {pos}: "
        f"ours {a[pos : pos + 5]}, model.generate {b[pos : pos + 5]}"
    )


def echo_prompt(model, seed_tokens=(3, 1, 4, 1, 5), length: int = 20) -> torch.Tensor:
    """The seed followed by the model's own greedy continuation: random models fall into
    cycles, so the continuation of this prompt repeats n-grams that are already in it."""
    ids = torch.tensor([list(seed_tokens)])
    return reference(model, ids, length)


def prompts_for(model) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)
    return {
        "echo": echo_prompt(model),
        "periodic": torch.tensor([[7, 8, 9, 10, 11] * 3 + [7, 8]]),
        "random": torch.randint(0, model.config.vocab_size, (1, 9), generator=generator),
    }


def run(model, ids, max_new_tokens, method_case, draft_models, **extra):
    method, options = METHOD_CASES[method_case]
    options = dict(options)
    if "draft_model" in options:
        options["draft_model"] = draft_models[options["draft_model"]]
    return lookahead.generate(
        model, ids, max_new_tokens=max_new_tokens, method=method, **options, **extra
    )


def check_stats(result, prompt_len: int) -> None:
    """Statistics that must agree with the sequence whatever the method (no EOS here)."""
    stats = result.stats
    assert stats.prompt_tokens == prompt_len
    assert stats.new_tokens == result.sequences.shape[1] - prompt_len
    assert stats.steps == len(stats.accepted_per_step) == len(stats.proposed_per_step)
    # Each forward pass commits its accepted tokens plus one (the prefill commits one).
    assert stats.new_tokens == stats.steps + sum(stats.accepted_per_step)
    assert all(a <= p for a, p in zip(stats.accepted_per_step, stats.proposed_per_step))


@pytest.fixture(scope="module")
def case_data(tiny_lm):
    """Per model case: the model, its two draft models, prompts and references (cached)."""
    cache = {}

    def get(case: str):
        if case not in cache:
            family, attn, overrides = MODEL_CASES[case]
            model = tiny_lm(family, seed=0, attn=attn, **overrides)
            other = tiny_lm(family, seed=1, attn=attn, **overrides)
            # The reference is transformers' own attention, whatever ours runs on.
            stock = tiny_lm(family, seed=0, attn="sdpa" if attn == "grouped" else attn,
                            **overrides)
            prompts = prompts_for(stock)
            refs = {name: reference(stock, ids, NEW_TOKENS) for name, ids in prompts.items()}
            cache[case] = (model, {"self": model, "other": other}, prompts, refs)
        return cache[case]

    return get


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


# --- sliding windows ------------------------------------------------------------------------


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


# --- RoPE that depends on the step's largest position (Phi-3 "longrope") -------------------

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


# --- EOS and the token limit ----------------------------------------------------------------


def step_tokens(model, ids, max_new_tokens, method="lookahead", **options):
    """The tokens committed at each step (the prefill's first token is its own step)."""
    return list(
        lookahead.stream(model, ids, max_new_tokens=max_new_tokens, method=method, **options)
    )


def eos_inside_step(steps: list[list[int]], after: int = 2) -> tuple[int, int, bool]:
    """(token, position, inside) of a generated token to make the EOS: the first token whose
    first occurrence sits inside a step with at least ``after`` tokens after it in that step
    (``after=2``: an accepted proposed token and the bonus), inside=True; else the token at
    position 10, inside=False."""
    generated = [t for step in steps for t in step]
    first = {}
    for pos, tok in enumerate(generated):
        first.setdefault(tok, pos)
    pos = 0
    for step in steps:
        for i, tok in enumerate(step[: len(step) - after]):
            if first[tok] == pos + i and pos + i >= 1:
                return tok, pos + i, True
        pos += len(step)
    tok = generated[10]
    return tok, first[tok], False


EOS_METHODS = [
    "autoregressive",
    "lookahead",
    "lookahead-w3n3g2",
    "prompt_lookup",
    "draft-self",
    "draft-other",
]


@pytest.fixture()
def eos_model(fresh_lm):
    """A private model (its generation config is changed by the test) and a draft."""
    return fresh_lm("llama", seed=0), fresh_lm("llama", seed=1)


def test_eos_inside_an_accepted_step(eos_model):
    model, other = eos_model
    drafts = {"self": model, "other": other}
    ids = echo_prompt(model)
    # Without EOS, lookahead commits the chosen token inside a multi-token step; the runs
    # with EOS are identical up to that step, so there the EOS is accepted mid-proposal.
    eos, position, inside = eos_inside_step(step_tokens(model, ids, 30))
    assert inside, "no token to make the EOS inside a multi-token step"
    model.generation_config.eos_token_id = eos
    ref = reference(model, ids, 30)
    generated = ref[0, ids.shape[1] :].tolist()
    assert generated[-1] == eos and len(generated) == position + 1 < 30
    for method_case in EOS_METHODS:
        result = run(model, ids, 30, method_case, drafts)
        assert result.sequences.tolist() == ref.tolist(), method_case
        assert result.stats.new_tokens == len(generated)
    cut = step_tokens(model, ids, 30)
    assert sum(len(s) for s in cut) == len(generated) and cut[-1][-1] == eos


def test_eos_accepted_inside_step_counts_only_emitted_tokens(eos_model):
    """Statistics after an EOS that a step accepted before other accepted tokens: the tokens
    after the EOS are not emitted, so they must not count as accepted either
    (``accepted_per_step[i]`` <= tokens step i committed, and the per-position counts agree)."""
    model, _ = eos_model
    ids = echo_prompt(model)
    eos, _, inside = eos_inside_step(step_tokens(model, ids, 30), after=2)
    assert inside
    model.generation_config.eos_token_id = eos
    for method in ("lookahead", "prompt_lookup"):
        stream = lookahead.stream(model, ids, max_new_tokens=30, method=method)
        committed = [len(step) for step in stream]
        stats = stream.stats
        assert committed[-1] >= 1 and stats.new_tokens == sum(committed)
        for i, (accepted, emitted) in enumerate(zip(stats.accepted_per_step, committed)):
            assert accepted <= emitted, (method, i, stats.accepted_per_step, committed)
        assert sum(stats.accepted_per_position) == sum(stats.accepted_per_step)


def test_two_eos_ids_stop_at_the_first_of_either(eos_model):
    model, other = eos_model
    drafts = {"self": model, "other": other}
    ids = prompts_for(model)["random"]
    full = reference(model, ids, 30)[0, ids.shape[1] :].tolist()
    distinct = list(dict.fromkeys(full))
    assert len(distinct) >= 3
    early, late = distinct[2], distinct[-1]  # first occurrences: early before late
    model.generation_config.eos_token_id = [late, early]
    ref = reference(model, ids, 30)
    assert ref[0, -1].item() == early and ref.shape[1] < ids.shape[1] + 30
    for method_case in EOS_METHODS:
        result = run(model, ids, 30, method_case, drafts)
        assert result.sequences.tolist() == ref.tolist(), method_case


def test_eos_override_and_eos_as_first_token(eos_model):
    model, other = eos_model
    drafts = {"self": model, "other": other}
    ids = echo_prompt(model)
    full = reference(model, ids, 30)
    first = full[0, ids.shape[1]].item()
    model.generation_config.eos_token_id = first
    ref = reference(model, ids, 30)
    assert ref.shape[1] == ids.shape[1] + 1
    model.generation_config.eos_token_id = None
    for method_case in EOS_METHODS:
        # ``eos_token_id=`` overrides the (empty) generation config.
        result = run(model, ids, 30, method_case, drafts, eos_token_id=first)
        assert result.sequences.tolist() == ref.tolist(), method_case
        assert result.stats.steps == 1


def limits_inside_steps(steps: list[list[int]]) -> list[int]:
    """Token limits that fall strictly inside a multi-token step of an unlimited run."""
    limits, end = [], 0
    for step in steps:
        limits += [end + k for k in range(1, len(step))]
        end += len(step)
    return limits


@pytest.mark.parametrize("model_case", ["llama-sdpa", "qwen2-sliding8"])
def test_token_limit_inside_an_accepted_ngram(case_data, model_case):
    """max_new_tokens reached in the middle of what would be an accepted n-gram: exactly
    max_new_tokens tokens, never one more, and still the reference ones."""
    model, drafts, prompts, _ = case_data(model_case)
    ids = prompts["echo"]
    inside = limits_inside_steps(step_tokens(model, ids, 30))
    assert inside, "no multi-token step to cut"
    for limit in sorted({1, 2, 3, 7, *inside[:4]}):
        ref = reference(model, ids, limit)
        assert ref.shape[1] == ids.shape[1] + limit
        for method_case in ("lookahead", "lookahead-w3n3g2", "prompt_lookup", "draft-self"):
            result = run(model, ids, limit, method_case, drafts)
            assert result.sequences.tolist() == ref.tolist(), (method_case, limit)
            assert result.stats.new_tokens == limit


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
