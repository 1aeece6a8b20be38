"""``Decoder(logprobs=k)``: each committed token's log-probability and the k most likely
tokens at its position, on the quantized path (a tiny GGUF on the integer kernels), equal to
a plain forward pass's ``log_softmax`` whichever method committed the token."""

from __future__ import annotations

import itertools

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from tiny_gguf import write_tiny_gguf

import lookahead
from lookahead.request import make_decoder
from lookahead.controls import Controls
from lookahead.penalties import penalty_processors

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = [256, 3, 70, 71, 72, 3, 70, 71, 72, 3, 70, 71, 9, 100, 101, 102]
NEW = 24
TOP = 5


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("logprobs")
    path = write_tiny_gguf(folder / "tiny.gguf", "llama", (Q.Q4_1, Q.Q8_0), hidden=64)
    model, _ = lookahead.load_model(path, cache_dir=folder)
    model.generation_config.eos_token_id = None
    return model


@pytest.fixture(scope="module")
def echo(model) -> list[int]:
    """The prompt followed by the model's own greedy text: it repeats, so proposals are
    accepted several at a time."""
    decoder = make_decoder(model, torch.tensor([PROMPT]), NEW, "autoregressive")
    return PROMPT + list(itertools.chain.from_iterable(decoder))


def decode(model, prompt, method, **options):
    if method == "lookahead":
        options.update(window=4, ngram=3)
    decoder = make_decoder(model, torch.tensor([prompt]), NEW, method, logprobs=TOP, **options)
    return list(itertools.chain.from_iterable(decoder)), decoder


def plain_log_softmax(model, prompt, tokens, bias=None) -> torch.Tensor:
    """[len(tokens), V]: one forward pass over the whole text; row i predicts tokens[i]."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
        for token, value in (bias or {}).items():
            logits[:, token] += value
        return logits.log_softmax(dim=-1)


@pytest.mark.parametrize("method", ["autoregressive", "lookahead", "prompt_lookup"])
def test_logprobs_equal_a_plain_forward_pass(model, echo, method) -> None:
    wanted, _ = decode(model, echo, "autoregressive")
    tokens, decoder = decode(model, echo, method)
    assert tokens == wanted  # recording them changes no token
    if method != "autoregressive":
        assert decoder.stats.tokens_per_step > 1.5  # tokens were committed from tree rows
    expected = plain_log_softmax(model, echo, tokens)
    records = decoder.token_logprobs
    assert [r.token for r in records] == tokens
    chosen = expected.gather(1, torch.tensor(tokens).unsqueeze(1))[:, 0]
    torch.testing.assert_close(torch.tensor([r.logprob for r in records]), chosen,
                               rtol=0, atol=1e-5)
    top = expected.topk(TOP, dim=-1)
    assert [[i for i, _ in r.top] for r in records] == top.indices.tolist()
    torch.testing.assert_close(torch.tensor([[v for _, v in r.top] for r in records]),
                               top.values, rtol=0, atol=1e-5)
    assert all(r.top[0][0] == r.token for r in records)  # greedy: the most likely token


def test_sampled_tokens_get_the_distribution_before_temperature(model, echo) -> None:
    tokens, decoder = decode(model, echo, "lookahead", do_sample=True, temperature=0.6,
                             seed=11)
    expected = plain_log_softmax(model, echo, tokens)
    chosen = expected.gather(1, torch.tensor(tokens).unsqueeze(1))[:, 0]
    torch.testing.assert_close(torch.tensor([r.logprob for r in decoder.token_logprobs]),
                               chosen, rtol=0, atol=1e-5)


def test_logprobs_are_those_of_the_processed_scores(model) -> None:
    bias = {70: 30.0}
    controls = Controls(penalty_processors(len(PROMPT), logit_bias=bias))
    tokens, decoder = decode(model, PROMPT, "prompt_lookup", controls=controls)
    assert tokens == [70] * NEW
    expected = plain_log_softmax(model, PROMPT, tokens, bias)[:, 70]
    got = torch.tensor([r.logprob for r in decoder.token_logprobs])
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert float(got.max()) > -1e-3  # the bias made it all but certain


def test_without_logprobs_nothing_is_recorded_and_bad_values_are_refused(model) -> None:
    decoder = make_decoder(model, torch.tensor([PROMPT]), 4, "lookahead")
    list(decoder)
    assert decoder.token_logprobs == []
    for bad in (-1, 21, 2.0, True):
        with pytest.raises(ValueError, match="logprobs must be"):
            make_decoder(model, torch.tensor([PROMPT]), 4, "autoregressive", logprobs=bad)
