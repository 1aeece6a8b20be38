"""Lossless sampling, checked statistically.

The exact distribution of the first new tokens is computed by enumeration: full forward passes
(no cache) over every prefix, warped with Hugging Face's own Temperature/TopK/TopP warpers. Each
method then draws a few thousand samples (seed varied per draw from a fixed base, so the test is
deterministic) and a chi-square goodness-of-fit test must not reject. Negative controls show
that the same statistic rejects deliberately wrong verifiers, on synthetic trees with
hand-made distributions.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import lookahead
from lookahead.attention import TokenTree
from lookahead.config import SamplingConfig
from lookahead.verify import Verdict, verify_sampling, warp

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 10
TINY = {
    "vocab_size": VOCAB,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
SAMPLING = {"temperature": 0.8, "top_k": 6, "top_p": 0.95}
DEPTH = 3  # the joint law of the first DEPTH new tokens is tested
SEED_BASE = 20_240_000
ALPHA = 0.001


def hf_warpers(temperature: float, top_k: int, top_p: float) -> LogitsProcessorList:
    """The chain ``model.generate(do_sample=True)`` applies, in Hugging Face's order."""
    chain = [TemperatureLogitsWarper(temperature)]
    if top_k:
        chain.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        chain.append(TopPLogitsWarper(top_p))
    return LogitsProcessorList(chain)


def chi2_pvalue(observed: Counter, expected: dict, draws: int) -> float:
    """Goodness of fit of ``observed`` counts to the probabilities ``expected``.

    Outcomes whose expected count is below 5 are merged into one bin (and that bin into the
    smallest other one if it is still below 5). Drawing an outcome of probability 0 gives 0.
    """
    if any(expected.get(k, 0.0) <= 0.0 for k in observed):
        return 0.0
    keys = sorted(expected, key=lambda k: -expected[k])
    big = [k for k in keys if expected[k] * draws >= 5]
    small = [k for k in keys if expected[k] * draws < 5]
    f_exp = [expected[k] * draws for k in big]
    f_obs = [observed.get(k, 0) for k in big]
    rest_exp = sum(expected[k] for k in small) * draws
    rest_obs = sum(observed.get(k, 0) for k in small)
    if rest_exp > 0:
        if rest_exp >= 5 or not f_exp:
            f_exp.append(rest_exp)
            f_obs.append(rest_obs)
        else:
            f_exp[-1] += rest_exp
            f_obs[-1] += rest_obs
    assert len(f_exp) >= 2, "too few bins for a test"
    f_exp = np.asarray(f_exp, dtype=np.float64)
    f_exp *= sum(f_obs) / f_exp.sum()  # exact sums for scipy
    return float(chisquare(f_obs, f_exp).pvalue)


# --- the warper ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [
        (1.0, 0, 1.0),
        (0.8, 0, 1.0),
        (0.8, 4, 1.0),
        (1.3, 0, 0.7),
        (0.8, 6, 0.9),
        (0.5, 20, 0.3),
        (2.0, 1, 1.0),
    ],
)
def test_warp_matches_hugging_face_warpers(temperature, top_k, top_p):
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(16, 12, generator=generator, dtype=torch.float64) * 3
    logits[0, :4] = 2.5  # ties at the top-k / top-p boundary
    ours = warp(
        logits, SamplingConfig(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p)
    )
    scores = hf_warpers(temperature, top_k, top_p)(None, logits.clone())
    theirs = torch.softmax(scores, dim=-1)
    assert ours.shape == theirs.shape
    assert torch.equal(ours == 0, theirs == 0), "different tokens filtered out"
    torch.testing.assert_close(ours.double(), theirs, atol=1e-6, rtol=1e-5)


# --- end to end ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def setup(fresh_lm):
    """Target, draft (another random model), a prompt the target likes to continue, and the
    exact law of the first DEPTH new tokens."""
    model = fresh_lm("llama", seed=1, **TINY)
    draft = fresh_lm("llama", seed=101, **TINY)
    with torch.no_grad():  # sharper distributions: the target follows its own cycles often
        model.lm_head.weight.mul_(10)
        draft.lm_head.weight.mul_(10)
    # The model's own greedy output repeats, so the prompt's n-grams are likely candidates.
    with torch.no_grad():
        ids = model.generate(torch.tensor([[1, 2]]), do_sample=False, max_new_tokens=14)
    return model, draft, ids, exact_law(model, ids, DEPTH, hf_warpers(**SAMPLING))


@torch.no_grad()
def exact_law(model, ids: torch.Tensor, depth: int, warpers) -> dict[tuple[int, ...], float]:
    """P(first ``depth`` new tokens = t) for every t, by full forward passes over all prefixes."""
    law = {(): 1.0}
    for _ in range(depth):
        prefixes = [k for k, v in law.items() if v > 0]
        batch = torch.cat(
            [
                ids.repeat(len(prefixes), 1),
                torch.tensor(prefixes, dtype=torch.long).reshape(len(prefixes), -1),
            ],
            dim=1,
        )
        logits = model(input_ids=batch).logits[:, -1, :]
        probs = torch.softmax(warpers(batch, logits), dim=-1)
        law = {
            prefix + (tok,): law[prefix] * float(probs[row, tok])
            for row, prefix in enumerate(prefixes)
            for tok in range(probs.shape[1])
        }
    total = sum(law.values())
    assert abs(total - 1.0) < 1e-9
    return law


METHOD_OPTIONS = {
    "autoregressive": {},
    "lookahead": {},
    "prompt_lookup": {},
    "draft": {"num_draft_tokens": 3},
}
# Draws per method: more where the verifier's tree is richest (the file must stay fast).
METHOD_DRAWS = {"autoregressive": 600, "prompt_lookup": 800, "lookahead": 1200, "draft": 1200}


@pytest.mark.parametrize("method", list(METHOD_OPTIONS))
def test_sampling_is_lossless(setup, method):
    model, draft, ids, law = setup
    options = dict(METHOD_OPTIONS[method])
    if method == "draft":
        options["draft_model"] = draft
    draws = METHOD_DRAWS[method]
    # One token more than tested, so that a step can accept DEPTH - 1 proposed tokens.
    max_new_tokens = DEPTH if method == "autoregressive" else DEPTH + 1
    counts = Counter()
    steps_with_accept = steps_with_reject = 0
    for i in range(draws):
        result = lookahead.generate(
            model,
            ids,
            max_new_tokens=max_new_tokens,
            method=method,
            do_sample=True,
            seed=SEED_BASE + i,
            **SAMPLING,
            **options,
        )
        counts[tuple(result.new_tokens[0, :DEPTH].tolist())] += 1
        stats = result.stats
        for accepted, proposed in zip(stats.accepted_per_step, stats.proposed_per_step):
            steps_with_accept += accepted > 0
            steps_with_reject += accepted < proposed
    pvalue = chi2_pvalue(counts, law, draws)
    assert pvalue > ALPHA, f"{method}: p = {pvalue:.2e}"
    if method != "autoregressive":
        # Both branches of the verifier ran many times: accepted candidates and rejections.
        assert steps_with_accept > draws // 10, steps_with_accept
        assert steps_with_reject > draws // 10, steps_with_reject


def test_same_seed_same_sample(setup):
    model, draft, ids, _ = setup
    for method, options in [("lookahead", {}), ("draft", {"draft_model": draft})]:
        runs = [
            lookahead.generate(
                model, ids, max_new_tokens=8, method=method, do_sample=True, seed=5, **options
            )
            for _ in range(2)
        ]
        assert runs[0].sequences.tolist() == runs[1].sequences.tolist()


def test_a_seed_writes_the_same_text_whatever_the_candidates(setup):
    """Sampling with deterministic candidates draws by position: lookahead and prompt lookup,
    whatever they propose and however fast the steps run, write what one-token sampling writes
    with the same seed; another seed writes another text."""
    model, _, ids, _ = setup
    texts = {}
    for seed in (5, 6, 7):
        for method, options in [("autoregressive", {}), ("lookahead", {}),
                                ("lookahead", {"window": 3, "ngram": 3, "guess": 3}),
                                ("prompt_lookup", {"num_draft_tokens": 4})]:
            result = lookahead.generate(model, ids, max_new_tokens=12, method=method,
                                        do_sample=True, seed=seed, **SAMPLING, **options)
            texts.setdefault(seed, []).append(result.new_tokens[0].tolist())
        assert all(text == texts[seed][0] for text in texts[seed]), (seed, texts[seed])
    assert len({tuple(runs[0]) for runs in texts.values()}) > 1


# --- the verifier on synthetic trees: exact in expectation, and the statistic's power -------

SYNTH_DRAWS = 5_000


def synthetic_p(generator: torch.Generator, rows: int, vocab: int = 6) -> torch.Tensor:
    p = torch.rand(rows, vocab, generator=generator) + 0.05
    return p / p.sum(dim=-1, keepdim=True)


def first_two(verdict_tokens: list[int], first_child_token: int):
    """(first token, second token or None): the second only when the first was accepted."""
    return (
        tuple(verdict_tokens[:2])
        if verdict_tokens[0] == first_child_token
        else (verdict_tokens[0], None)
    )


def law_first_two(p: torch.Tensor, first: int) -> dict:
    """Exact law of ``first_two`` when the output is distributed as the target: the first token
    ~ p[0]; after ``first`` (node 1), the second ~ p[1]."""
    law = {}
    for a in range(p.shape[1]):
        if a == first:
            for b in range(p.shape[1]):
                law[(a, b)] = float(p[0, a] * p[1, b])
        else:
            law[(a, None)] = float(p[0, a])
    return law


def accept_always(tree, probs, generator, draft_probs=None, position=None):
    """Wrong: takes the first candidate path whole, then samples a bonus from p."""
    node, path = 0, []
    while tree.children[node]:
        node = next(iter(tree.children[node].values()))
        path.append(node)
    bonus = int(torch.multinomial(probs[node], 1, generator=generator))
    return Verdict(path, [tree.tokens[n] for n in path] + [bonus])


def naive_accept_always(tree, probs, generator, draft_probs=None):
    return accept_always(tree, probs, generator, draft_probs).tokens


def naive_resample_from_p(tree, probs, generator, draft_probs=None):
    """Wrong: the acceptance test is right but a rejection resamples from p, not the residual."""
    draft_probs = draft_probs or {}
    node, tokens = 0, []
    while True:
        p = probs[node]
        accepted = None
        for token, child in tree.children[node].items():
            q = draft_probs.get(child)
            ratio = p[token] if q is None else min(1.0, float(p[token] / q[token]))
            if torch.rand((), generator=generator) < ratio:
                accepted = child
                break
        if accepted is None:
            return tokens + [int(torch.multinomial(p, 1, generator=generator))]
        tokens.append(tree.tokens[accepted])
        node = accepted


def ours(tree, probs, generator, draft_probs=None):
    return verify_sampling(tree, probs, generator, draft_probs).tokens


def sample_point_mass(rule, p: torch.Tensor, seed: int) -> Counter:
    """Two deterministic candidates ``[2, 4]`` and ``[5]``: root children 2 and 5."""
    tree = TokenTree(0, [[2, 4], [5]])
    # rows: node 0 (x0), node 1 (token 2), node 2 (token 4), node 3 (token 5)
    probs = torch.stack([p[0], p[1], p[2], p[3]])
    generator = torch.Generator().manual_seed(seed)
    return Counter(first_two(rule(tree, probs, generator), 2) for _ in range(SYNTH_DRAWS))


def sample_draft(rule, p: torch.Tensor, q: torch.Tensor, seed: int) -> Counter:
    """A draft chain of two tokens drawn from q[0], q[1] (as a draft model would)."""
    generator = torch.Generator().manual_seed(seed)
    counts = Counter()
    for _ in range(SYNTH_DRAWS):
        x1 = int(torch.multinomial(q[0], 1, generator=generator))
        x2 = int(torch.multinomial(q[1], 1, generator=generator))
        tree = TokenTree(0, [[x1, x2]])
        draft_probs = {1: q[0], 2: q[1]}
        # Node 1's target law is p[1] whatever x1 is (a synthetic target).
        probs = torch.stack([p[0], p[1], p[2]])
        tokens = rule(tree, probs, generator, draft_probs)
        counts[(tokens[0], tokens[1] if len(tokens) > 1 and tokens[0] == x1 else None)] += 1
    return counts


def marginal(counts: Counter, index: int) -> Counter:
    out = Counter()
    for key, n in counts.items():
        if key[index] is not None:
            out[key[index]] += n
    return out


@pytest.fixture(scope="module")
def synthetic():
    generator = torch.Generator().manual_seed(99)
    p = synthetic_p(generator, 4)
    q = synthetic_p(generator, 2)
    q[0] = q[0] ** 3  # a draft sharper than the target: p/q < 1 on its favourites
    q[0] /= q[0].sum()
    return p, q


def test_verifier_point_mass_children_keep_the_target_law(synthetic):
    p, _ = synthetic
    counts = sample_point_mass(ours, p, seed=1)
    assert chi2_pvalue(counts, law_first_two(p, 2), SYNTH_DRAWS) > ALPHA
    # Both children and the recovered token all occur (every branch of the rule ran).
    firsts = marginal(counts, 0)
    assert firsts[2] > 0 and firsts[5] > 0 and sum(firsts.values()) - firsts[2] - firsts[5] > 0


def test_verifier_draft_keeps_the_target_law(synthetic):
    p, q = synthetic
    counts = sample_draft(ours, p, q, seed=2)
    firsts = marginal(counts, 0)
    law0 = {(t,): float(p[0, t]) for t in range(p.shape[1])}
    assert chi2_pvalue(Counter({(t,): n for t, n in firsts.items()}), law0, SYNTH_DRAWS) > ALPHA
    # Given the first draft token was kept, the second token follows p[1].
    seconds = marginal(counts, 1)
    law1 = {(t,): float(p[1, t]) for t in range(p.shape[1])}
    kept = sum(seconds.values())
    assert kept > SYNTH_DRAWS // 4
    assert chi2_pvalue(Counter({(t,): n for t, n in seconds.items()}), law1, kept) > ALPHA


@pytest.mark.parametrize("rule", [naive_accept_always, naive_resample_from_p])
def test_statistic_rejects_wrong_verifiers(synthetic, rule):
    """Negative controls: the same statistic, the same number of draws, wrong rules."""
    p, q = synthetic
    counts = sample_point_mass(rule, p, seed=1)
    assert chi2_pvalue(counts, law_first_two(p, 2), SYNTH_DRAWS) < ALPHA
    counts = sample_draft(rule, p, q, seed=2)
    firsts = Counter({(t,): n for t, n in marginal(counts, 0).items()})
    law0 = {(t,): float(p[0, t]) for t in range(p.shape[1])}
    assert chi2_pvalue(firsts, law0, SYNTH_DRAWS) < ALPHA


@pytest.mark.parametrize("bug", ["accept_always", "no_residual", "one_draw"])
def test_end_to_end_statistic_rejects_wrong_verifiers(setup, monkeypatch, bug):
    """Negative controls end to end: lookahead with a verifier that accepts every candidate,
    or whose draws are the same at every position, and the draft method with one that
    resamples from p instead of the residual after a rejection, fail the very test
    ``test_sampling_is_lossless`` runs, with a third of its draws."""
    import lookahead.decode
    import lookahead.verify

    model, draft, ids, law = setup
    method, options = "lookahead", {}
    if bug == "accept_always":
        monkeypatch.setattr(lookahead.decode, "verify_sampling", accept_always)
    elif bug == "one_draw":
        monkeypatch.setattr(lookahead.verify, "position_draw",
                            lambda generator, position: torch.tensor(0.5))
    else:
        monkeypatch.setattr(lookahead.verify, "_residual", lambda p, token, q: p)
        method, options = "draft", {"num_draft_tokens": 3, "draft_model": draft}
    draws = METHOD_DRAWS[method] // 3
    counts = Counter()
    for i in range(draws):
        result = lookahead.generate(
            model,
            ids,
            max_new_tokens=DEPTH + 1,
            method=method,
            do_sample=True,
            seed=SEED_BASE + i,
            **SAMPLING,
            **options,
        )
        counts[tuple(result.new_tokens[0, :DEPTH].tolist())] += 1
    assert chi2_pvalue(counts, law, draws) < ALPHA
