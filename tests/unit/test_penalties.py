"""OpenAI's penalties and ``logit_bias`` (``lookahead.penalties``): their values, their
checks, and speculative greedy decoding under them equal to one-token-at-a-time decoding."""

from __future__ import annotations

import itertools

import pytest
import torch
from tiny import tiny_llama

from lookahead.request import make_decoder
from lookahead.controls import ROW_WISE, Controls
from lookahead.penalties import PresenceFrequencyPenalty, penalty_processors

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 24  # a small vocabulary: the random model repeats itself, so proposals get accepted
PROMPT = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 7, 8, 3, 4, 5]

SETTINGS = {
    "presence": {"presence_penalty": 0.6},
    "frequency": {"frequency_penalty": 0.4},
    "repetition": {"repetition_penalty": 1.3},
    "bias": {"logit_bias": {5: 1.5, 9: -100.0, 11: 0.7}},
    "all": {"presence_penalty": 0.3, "frequency_penalty": -0.2, "repetition_penalty": 0.8,
            "logit_bias": {4: 0.8, 6: -0.5}},
}


@pytest.fixture(scope="module")
def model():
    return tiny_llama(VOCAB, eos=None, max_positions=128, seed=3).to(torch.float64)


def test_presence_and_frequency_count_the_output_only() -> None:
    penalty = PresenceFrequencyPenalty(0.5, 0.25, prompt_length=3)
    ids = torch.tensor([[1, 1, 2, 1, 1, 4], [0, 0, 0, 2, 2, 2]])
    scores = torch.zeros(2, 6)
    out = penalty(ids, scores)
    # row 0 output [1, 1, 4]: token 1 twice, token 4 once; row 1 output [2, 2, 2]
    assert out[0].tolist() == [0.0, -1.0, 0.0, 0.0, -0.75, 0.0]
    assert out[1].tolist() == [0.0, 0.0, -1.25, 0.0, 0.0, 0.0]
    assert isinstance(penalty, ROW_WISE)


def test_defaults_give_no_processor_and_bad_values_name_their_argument() -> None:
    assert len(penalty_processors(4)) == 0
    assert len(penalty_processors(4, **SETTINGS["all"])) == 3
    for kwargs, name in [({"presence_penalty": 2.5}, "presence_penalty"),
                         ({"frequency_penalty": -3}, "frequency_penalty"),
                         ({"repetition_penalty": 0.0}, "repetition_penalty"),
                         ({"logit_bias": {3: 101.0}}, "logit_bias[3]"),
                         ({"logit_bias": {VOCAB: 1.0}, "vocab_size": VOCAB}, "logit_bias keys"),
                         ({"presence_penalty": True}, "presence_penalty")]:
        with pytest.raises(ValueError, match=name.replace("[", r"\[")):
            penalty_processors(4, **kwargs)


def reference(model, prompt: list[int], new: int, presence_penalty=0.0, frequency_penalty=0.0,
              repetition_penalty=1.0, logit_bias=None) -> list[int]:
    """Greedy decoding one token at a time, the whole text run again for every token, the
    penalties written out by hand from their definitions (in float32, as model.generate)."""
    ids = list(prompt)
    for _ in range(new):
        with torch.no_grad():
            scores = model(torch.tensor([ids])).logits[0, -1].float()
        for token, bias in (logit_bias or {}).items():
            scores[token] += bias
        seen = torch.tensor(sorted(set(ids)))
        picked = scores[seen]
        scores[seen] = torch.where(picked < 0, picked * repetition_penalty,
                                   picked / repetition_penalty)
        counts = torch.bincount(torch.tensor(ids[len(prompt):], dtype=torch.long),
                                minlength=VOCAB).float()
        scores = scores - presence_penalty * (counts > 0).float() - frequency_penalty * counts
        ids.append(int(scores.argmax()))
    return ids[len(prompt):]


def decode(model, prompt: list[int], new: int, method: str, **settings) -> tuple[list[int], int]:
    """The tokens of ``method`` under ``settings``, and how many proposed tokens it accepted."""
    controls = Controls(penalty_processors(len(prompt), vocab_size=VOCAB, **settings))
    options = {"window": 4, "ngram": 3} if method == "lookahead" else {}
    decoder = make_decoder(model, torch.tensor([prompt]), new, method, controls=controls,
                           **options)
    tokens = list(itertools.chain.from_iterable(decoder))
    return tokens, sum(decoder.stats.accepted_per_step)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_speculative_greedy_under_penalties_equals_one_token_at_a_time(model, name) -> None:
    settings = SETTINGS[name]
    wanted = reference(model, PROMPT, 32, **settings)
    plain = reference(model, PROMPT, 32)
    assert wanted != plain  # the setting changes the text: the test can see it applied
    accepted = 0
    for method in ("autoregressive", "lookahead", "prompt_lookup"):
        tokens, count = decode(model, PROMPT, 32, method, **settings)
        assert tokens == wanted, method
        accepted += count
    assert accepted > 0  # candidates were verified under the penalties, not just x0
