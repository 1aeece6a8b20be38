"""The public entry points: bad input is refused up front with a ValueError or TypeError that
names the argument; ``stream`` yields what ``generate`` returns."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import lookahead
from lookahead.config import (
    MAX_DRAFT_TOKENS,
    MAX_GUESS,
    MAX_NGRAM,
    MAX_WINDOW,
    DraftConfig,
    LookaheadConfig,
    PromptLookupConfig,
    SamplingConfig,
)

IDS = torch.tensor([[1, 2, 3, 4]])


@pytest.fixture(scope="module")
def model(tiny_lm):
    return tiny_lm("llama", seed=0, num_hidden_layers=1, max_position_embeddings=32)


def refused(model, names, error=(ValueError, TypeError), *, ids=IDS, **kwargs):
    """generate(...) raises ``error`` and its message names every word in ``names``."""
    kwargs.setdefault("max_new_tokens", 4)
    with pytest.raises(error) as info:
        lookahead.generate(model, ids, **kwargs)
    message = str(info.value)
    for name in [names] if isinstance(names, str) else names:
        assert name in message, f"{name!r} not in {message!r}"
    return message


@pytest.mark.parametrize("name", ["window", "ngram", "guess"])
@pytest.mark.parametrize("value", [0, -1])
def test_lookahead_shape_below_one(model, name, value):
    refused(model, name, ValueError, method="lookahead", **{name: value})


@pytest.mark.parametrize(
    "name, value",
    [
        ("window", MAX_WINDOW + 1),
        ("window", 700),
        ("ngram", MAX_NGRAM + 1),
        ("guess", MAX_GUESS + 1),
        ("guess", 10**9),
        ("lookup_tokens", MAX_DRAFT_TOKENS + 1),
        ("lookup_max_tokens", MAX_DRAFT_TOKENS + 1),
        ("lookup_max_tokens", -1),
    ],
)
def test_lookahead_shape_absurdly_large(model, name, value):
    refused(model, name, ValueError, method="lookahead", **{name: value})


def test_ngram_of_one_is_refused(model):
    refused(model, "ngram", ValueError, method="lookahead", ngram=1)


@pytest.mark.parametrize(
    "name, value", [("window", 2.0), ("ngram", "3"), ("guess", True), ("window", None)]
)
def test_lookahead_shape_of_wrong_type(model, name, value):
    refused(model, name, TypeError, method="lookahead", **{name: value})


@pytest.mark.parametrize("value", [0, -2, 2.5, True, "4"])
def test_max_step_tokens_is_a_positive_int(model, value):
    refused(model, ["max_step_tokens", "positive int"], ValueError, method="lookahead",
            max_step_tokens=value)


def test_max_step_tokens_is_no_option_of_plain_decoding(model):
    refused(model, ["max_step_tokens", "autoregressive"], TypeError, method="autoregressive",
            max_step_tokens=4)


@pytest.mark.parametrize(
    "options, name",
    [
        ({"num_draft_tokens": 0}, "num_draft_tokens"),
        ({"num_draft_tokens": MAX_DRAFT_TOKENS + 1}, "num_draft_tokens"),
        ({"max_ngram": 0}, "max_ngram"),
        ({"max_ngram": 2, "min_ngram": 3}, "min_ngram"),
        ({"min_ngram": 0}, "min_ngram"),
        ({"max_draft_tokens": MAX_DRAFT_TOKENS + 1}, "max_draft_tokens"),
        ({"max_draft_tokens": -1}, "max_draft_tokens"),
    ],
)
def test_prompt_lookup_options(model, options, name):
    refused(model, name, ValueError, method="prompt_lookup", **options)


@pytest.mark.parametrize(
    "value, error",
    [
        (0, ValueError),
        (-1, ValueError),
        (1.5, TypeError),
        ("4", TypeError),
        (True, TypeError),
        (None, TypeError),
    ],
)
def test_bad_max_new_tokens(model, value, error):
    refused(model, "max_new_tokens", error, max_new_tokens=value)


@pytest.mark.parametrize("method", ["autoregressive", "lookahead", "prompt_lookup"])
def test_empty_prompt(model, method):
    refused(model, "input_ids", ValueError, ids=torch.zeros(1, 0, dtype=torch.long), method=method)


def test_right_padded_batch(model):
    """A batch decodes (tests/test_hf_compat.py); padding on the right cannot."""
    message = refused(model, "attention_mask", ValueError, ids=torch.tensor([[1, 2], [3, 4]]),
                      attention_mask=torch.tensor([[1, 1], [1, 0]]))
    assert "left" in message


@pytest.mark.parametrize(
    "ids",
    [torch.tensor([[1.0, 2.0]]), torch.tensor([[1, 2]], dtype=torch.int32), [[1, 2, 3]], "1 2 3"],
    ids=["float", "int32", "list", "str"],
)
def test_not_a_long_tensor(model, ids):
    refused(model, "input_ids", TypeError, ids=ids)


@pytest.mark.parametrize("shape", [(3,), (1, 1, 3)])
def test_wrong_rank(model, shape):
    refused(model, "input_ids", ValueError, ids=torch.ones(shape, dtype=torch.long))


@pytest.mark.parametrize("token", [64, 1000, -1])
def test_token_id_outside_the_vocabulary(model, token):
    """An id the embedding cannot look up is bad input, refused before the model runs."""
    refused(model, "input_ids", ValueError, ids=torch.tensor([[1, token, 3]]))


def test_beyond_the_context(model):
    limit = model.config.max_position_embeddings
    message = refused(model, "max_new_tokens", ValueError, max_new_tokens=limit - IDS.shape[1] + 1)
    assert str(limit) in message
    # Exactly filling the context is allowed.
    result = lookahead.generate(
        model, IDS, max_new_tokens=limit - IDS.shape[1], method="autoregressive"
    )
    assert result.sequences.shape[1] == limit


def test_unknown_method(model):
    message = refused(model, "method", ValueError, method="medusa")
    assert "medusa" in message and "lookahead" in message


@pytest.mark.parametrize(
    "method, options, name",
    [
        ("prompt_lookup", {"window": 3}, "window"),
        ("autoregressive", {"ngram": 3}, "ngram"),
        ("lookahead", {"num_draft_tokens": 3}, "num_draft_tokens"),
        ("lookahead", {"windw": 3}, "windw"),
        ("draft", {"max_ngram": 2}, "max_ngram"),
    ],
)
def test_unknown_option_for_the_method(model, method, options, name):
    message = refused(model, name, TypeError, method=method, **options)
    assert method in message


def test_draft_with_another_vocabulary(model, tiny_lm):
    other = tiny_lm("llama", seed=1, num_hidden_layers=1, vocab_size=80)
    message = refused(model, "draft_model", ValueError, method="draft", draft_model=other)
    assert "80" in message and "64" in message


@pytest.mark.parametrize("draft", [None, "tiny-llama", 3])
def test_draft_without_a_draft_model(model, draft):
    if draft is None:
        refused(model, "draft_model", TypeError, method="draft")
    else:
        refused(model, "draft_model", TypeError, method="draft", draft_model=draft)


@pytest.mark.parametrize("value", [0, 0.0, -1.0, float("nan")])
def test_temperature_not_positive(model, value):
    refused(model, "temperature", ValueError, do_sample=True, temperature=value)


@pytest.mark.parametrize("value", [0.0, -0.1, 1.5, float("nan")])
def test_top_p_out_of_range(model, value):
    refused(model, "top_p", ValueError, do_sample=True, top_p=value)


@pytest.mark.parametrize("value, error", [(-1, ValueError), (2.5, TypeError)])
def test_bad_top_k(model, value, error):
    refused(model, "top_k", error, do_sample=True, top_k=value)


@pytest.mark.parametrize(
    "value, error", [(-1, ValueError), (1 << 64, ValueError), (1.5, TypeError), ("7", TypeError)]
)
def test_bad_seed(model, value, error):
    refused(model, "seed", error, do_sample=True, seed=value)


def test_do_sample_not_a_bool(model):
    refused(model, "do_sample", TypeError, do_sample="yes")


def test_configs_validate_on_their_own():
    """The frozen configs check their fields when built directly, too."""
    with pytest.raises(ValueError, match="ngram"):
        LookaheadConfig(ngram=1)
    with pytest.raises(ValueError, match="window"):
        LookaheadConfig(window=0)
    for cost in (-0.1, 1.5, "0.1", True):
        with pytest.raises(ValueError, match="token_cost"):
            LookaheadConfig(token_cost=cost)
    with pytest.raises(ValueError, match="window_probe"):
        LookaheadConfig(window_probe=0)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        DraftConfig(num_draft_tokens=0)
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookupConfig(max_ngram=1, min_ngram=2)
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=-2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        LookaheadConfig().window = 3


def test_valid_edge_values_are_accepted(model, tiny_lm):
    """The refusals above are not over-eager: the bounds themselves work."""
    for options in (
        {"method": "lookahead", "window": 1, "ngram": 2, "guess": 1},
        {"method": "prompt_lookup", "num_draft_tokens": 1, "max_ngram": 1, "min_ngram": 1},
        {"method": "draft", "draft_model": model, "num_draft_tokens": 1},
        {
            "method": "autoregressive",
            "do_sample": True,
            "temperature": 0.01,
            "top_p": 1.0,
            "top_k": 0,
            "seed": 0,
        },
    ):
        result = lookahead.generate(model, IDS, max_new_tokens=1, **options)
        assert result.sequences.shape == (1, IDS.shape[1] + 1)


@pytest.mark.usefixtures("one_thread")
def test_stream_yields_what_generate_returns(tiny_lm):
    model = tiny_lm("llama", seed=0)
    ids = torch.tensor([[7, 8, 9, 7, 8, 9, 7, 8]])
    stream = lookahead.stream(model, ids, max_new_tokens=12, method="lookahead")
    steps = list(stream)
    result = lookahead.generate(model, ids, max_new_tokens=12, method="lookahead")
    assert ids[0].tolist() + [t for s in steps for t in s] == result.sequences[0].tolist()
    assert stream.stats.steps == len(steps) == result.stats.steps
    assert result.new_tokens.tolist() == [result.sequences[0, 8:].tolist()]
