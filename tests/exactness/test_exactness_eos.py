"""Greedy exactness at the end of a text: an EOS accepted inside a multi-token step, two EOS
ids, an EOS override, and a token limit that falls inside an accepted n-gram."""

from __future__ import annotations

import pytest
from tiny import echo_prompt, prompts_for, reference, run

import lookahead

pytestmark = pytest.mark.usefixtures("one_thread")


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
